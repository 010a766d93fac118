#include "akv/model/spm_vocab.h"

#include <algorithm>
#include <queue>

#include "akv/core/errors.h"

namespace akv {
namespace {

// Length of the UTF-8 character starting with byte c (1 for a stray continuation byte or an
// invalid lead byte: 0xF8 and above).
std::size_t utf8_char_len(unsigned char c) {
  if (c >= 0xF0 && c < 0xF8) return 4;
  if (c >= 0xE0) return c < 0xF0 ? 3 : 1;
  if (c >= 0xC0) return 2;
  return 1;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

SpmVocab::SpmVocab(std::vector<std::string> pieces, std::vector<float> scores, std::vector<std::int32_t> types,
                   std::int32_t bos, std::int32_t unk, bool add_space_prefix, const std::string& where)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), types_(std::move(types)), bos_(bos), unk_(unk),
      add_space_prefix_(add_space_prefix) {
  const std::size_t n = pieces_.size();
  if (scores_.empty()) scores_.assign(n, 0.0f);
  if (types_.empty()) types_.assign(n, normal);
  if (scores_.size() != n || types_.size() != n) {
    throw InvalidInput("tokenizer scores and token types must number the tokens (" + std::to_string(n) + ")",
                       {where, "tokenizer.ggml.scores/token_type", std::to_string(scores_.size()) + "/" + std::to_string(types_.size())});
  }
  for (std::int32_t id : {bos_, unk_}) {
    if (id >= static_cast<std::int32_t>(n)) {
      throw InvalidInput("special token id outside the vocabulary (" + std::to_string(n) + " tokens)",
                         {where, "tokenizer.ggml.bos/unknown_token_id", std::to_string(id)});
    }
  }
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& p = pieces_[i];
    if (types_[i] == normal || types_[i] == user_defined) {
      normal_.emplace(p, static_cast<std::int32_t>(i));
      if (types_[i] == user_defined && !p.empty()) {
        user_.emplace_back(p, static_cast<std::int32_t>(i));
        user_start_[static_cast<unsigned char>(p[0])] = true;
      }
    } else if (types_[i] == byte) {
      const int hi = p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' ? hex_digit(p[3]) : -1;
      const int lo = hi >= 0 ? hex_digit(p[4]) : -1;
      if (lo < 0) throw InvalidInput("byte token must read <0xXX>", {where, "tokenizer.ggml.tokens[" + std::to_string(i) + "]", p});
      byte_id_[hi * 16 + lo] = static_cast<std::int32_t>(i);
    }
  }
  std::stable_sort(user_.begin(), user_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<std::int32_t> SpmVocab::encode(const std::string& text) const {
  std::vector<std::int32_t> out;
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto hit = !user_start_[static_cast<unsigned char>(text[i])]
                         ? user_.end()
                         : std::find_if(user_.begin(), user_.end(),
                                        [&](const auto& u) { return text.compare(i, u.first.size(), u.first) == 0; });
    if (hit == user_.end()) {
      ++i;
      continue;
    }
    encode_fragment(text.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_fragment(text.substr(start), out);
  return out;
}

void SpmVocab::encode_fragment(const std::string& text, std::vector<std::int32_t>& out) const {
  if (text.empty()) return;  // no dummy prefix either, as SentencePiece
  std::string s;
  for (char c : (add_space_prefix_ ? " " : "") + text) {
    if (c == ' ') s += kSentencePieceSpace;
    else s += c;
  }
  struct Sym {
    int prev, next;
    std::size_t start, len;
  };
  std::vector<Sym> sym;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = std::min(utf8_char_len(static_cast<unsigned char>(s[i])), s.size() - i);
    sym.push_back({static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, i, len});
    i += len;
  }
  sym.back().next = -1;
  struct Pair {
    float score;
    int left, right;
    std::size_t len;
  };
  auto later = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(later)> agenda(later);
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const std::size_t len = sym[static_cast<std::size_t>(l)].len + sym[static_cast<std::size_t>(r)].len;
    const auto it = normal_.find(s.substr(sym[static_cast<std::size_t>(l)].start, len));
    if (it != normal_.end()) agenda.push({scores_[static_cast<std::size_t>(it->second)], l, r, len});
  };
  for (std::size_t i = 1; i < sym.size(); ++i) consider(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!agenda.empty()) {
    const Pair p = agenda.top();
    agenda.pop();
    Sym& l = sym[static_cast<std::size_t>(p.left)];
    Sym& r = sym[static_cast<std::size_t>(p.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.len || l.next != p.right) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (l.next >= 0) sym[static_cast<std::size_t>(l.next)].prev = p.left;
    consider(l.prev, p.left);
    consider(p.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    const Sym& x = sym[static_cast<std::size_t>(i)];
    const std::string piece = s.substr(x.start, x.len);
    if (const auto it = normal_.find(piece); it != normal_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char b : piece) {
      const std::int32_t id = byte_id_[b];
      if (id >= 0) out.push_back(id);
      else if (unk_ >= 0) out.push_back(unk_);
    }
  }
}

std::string SpmVocab::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) continue;
    const std::string& p = pieces_[static_cast<std::size_t>(id)];
    switch (types_[static_cast<std::size_t>(id)]) {
      case byte:
        out += static_cast<char>(hex_digit(p[3]) * 16 + hex_digit(p[4]));
        break;
      case normal:
      case user_defined:
        for (std::size_t i = 0; i < p.size();) {
          if (p.compare(i, 3, kSentencePieceSpace) == 0) {
            out += ' ';
            i += 3;
          } else {
            out += p[i++];
          }
        }
        break;
      case unknown:
        out += " \xE2\x81\x87 ";  // SentencePiece's " ⁇ "
        break;
      default:
        break;
    }
  }
  if (add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace akv
