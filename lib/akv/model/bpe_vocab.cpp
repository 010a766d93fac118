#include "akv/model/bpe_vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <fstream>
#include <limits>
#include <new>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/model/spm_vocab.h"

namespace akv {
namespace {

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string utf8(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
// U+0100 onwards in byte order. symbol[b] is byte b's symbol as UTF-8; byte_of maps back.
struct ByteSymbols {
  std::string symbol[256];
  std::unordered_map<std::string, unsigned char> byte_of;
  ByteSymbols() {
    std::uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      symbol[b] = utf8(printable ? static_cast<std::uint32_t>(b) : next++);
      byte_of[symbol[b]] = static_cast<unsigned char>(b);
    }
  }
};
const ByteSymbols& byte_symbols() {
  static const ByteSymbols s;
  return s;
}

// Length of the UTF-8 sequence starting with lead byte c (1 for stray continuation bytes).
std::size_t utf8_len(unsigned char c) {
  return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

// The offset of the first byte that does not start a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, surrogates or code points past U+10FFFF), or npos when the text is UTF-8.
std::size_t first_invalid_utf8(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = b[i];
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      const unsigned x = b[i + k];
      if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return i;
    }
    i += len;
  }
  return std::string::npos;
}

// The merge table's key of a pair (length-prefixed: no separator can be confused with a symbol).
std::string pair_key(const std::string& left, const std::string& right) {
  return std::to_string(left.size()) + ':' + left + right;
}

constexpr std::int32_t kMaxTokens = 1 << 21;       // ids beyond any real vocabulary (hostile files)

std::string replace_spaces(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ') out += kSentencePieceSpace;
    else out += c;
  }
  return out;
}

// A token id of a tokenizer.json: an integer in [0, kMaxTokens); InvalidInput naming the field.
std::int32_t token_id(const nlohmann::json& v, const std::string& path, const std::string& field) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= kMaxTokens) {
    throw InvalidInput("token id out of range (an integer in [0, " + std::to_string(kMaxTokens) + "))",
                       {path, field, v.dump().substr(0, 40)});
  }
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

// Matching work is bounded by the text's length (PCRE2's own limits are per call and count
// backtracking, not scanning, so a pattern whose lookahead scans to the end of the text takes time
// quadratic in it). The next match is searched one start position at a time, each an anchored
// attempt on a window of the text that ends kFirstWindow bytes after it (PCRE2_PARTIAL_HARD: an
// attempt that reaches the window's end reports it, and the window doubles until the attempt ends
// inside it or the window is the whole piece). Each window's bytes are charged to a budget of
// kWorkPerByte per byte of the text plus kBaseWork: every pattern's matches are those of a search
// of the whole text, and the bundled patterns charge at most 65 per byte (one window per start
// position, tokens shorter than it); a pattern that exceeds the budget is refused, naming it.
constexpr std::size_t kFirstWindow = 64;
constexpr std::uint64_t kWorkPerByte = 1024;
constexpr std::uint64_t kBaseWork = std::uint64_t{1} << 20;

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!md) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

std::string pcre2_message(int rc) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(rc, message, sizeof message / sizeof message[0]);
  return reinterpret_cast<const char*>(message);
}

// The pieces split at every match of `code` (matches and the text between them, in order).
std::vector<std::string> split_by_regex(const pcre2_code* code, const std::string& pattern,
                                        const std::vector<std::string>& pieces, std::size_t text_bytes,
                                        const std::string& where) {
  MatchData m(code);
  const std::uint64_t budget = kBaseWork + kWorkPerByte * static_cast<std::uint64_t>(text_bytes);
  std::uint64_t spent = 0;
  std::vector<std::string> next;
  for (const std::string& p : pieces) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(p.data());
    std::size_t last = 0;  // end of the previous match
    std::size_t pos = 0;   // where the next match may start
    while (pos <= p.size()) {
      int rc = 0;
      for (std::size_t window = kFirstWindow;; window *= 2) {
        const std::size_t end = std::min(p.size(), pos + window);
        spent += end - pos + 1;
        if (spent > budget) {
          throw InvalidInput("pre-tokenizer regex reads more than " + std::to_string(kWorkPerByte) + " bytes per byte of the " +
                                 std::to_string(text_bytes) + "-byte text (a pattern that scans ahead or backtracks)",
                             {where, "pre_tokenizer pattern", excerpt(pattern, 80)});
        }
        std::uint32_t options = PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK;  // encode checked the text's UTF-8
        if (end < p.size()) options |= PCRE2_PARTIAL_HARD;
        rc = pcre2_match(code, subject, end, pos, options, m.md, nullptr);
        if (rc != PCRE2_ERROR_PARTIAL) break;
      }
      if (rc == PCRE2_ERROR_NOMATCH) {  // no match starts here: try the next character
        pos += pos < p.size() ? utf8_len(static_cast<unsigned char>(p[pos])) : 1;
        continue;
      }
      if (rc < 0) throw InvalidInput("pre-tokenizer regex failed on the text: " + pcre2_message(rc), {where, "pcre2 error", std::to_string(rc)});
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
      if (ov[0] > last) next.push_back(p.substr(last, ov[0] - last));
      if (ov[1] > ov[0]) next.push_back(p.substr(ov[0], ov[1] - ov[0]));
      last = ov[1];
      // After an empty match the search resumes one character further on.
      pos = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < p.size() ? utf8_len(static_cast<unsigned char>(p[ov[1]])) : 1);
    }
    if (last < p.size()) next.push_back(p.substr(last));
  }
  return next;
}

}  // namespace

struct BpeVocab::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Regex() { pcre2_code_free(code); }
};

BpeVocab::BpeVocab(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
                   std::vector<std::pair<std::string, std::int32_t>> added, Options options, const std::string& where)
    : tokens_(std::move(tokens)), added_(std::move(added)), options_(std::move(options)), where_(where) {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (!tokens_[i].empty()) ids_.emplace(tokens_[i], static_cast<std::int32_t>(i));
  }
  for (std::size_t r = 0; r < merges.size(); ++r) ranks_.emplace(pair_key(merges[r].first, merges[r].second), r);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = ids_.find(name);
    byte_token_[b] = it == ids_.end() ? -1 : it->second;
  }
  for (const auto& [text, id] : added_) {
    if (text.empty() || id < 0 || id >= kMaxTokens) {
      throw InvalidInput("empty added token or id outside [0, " + std::to_string(kMaxTokens) + ")", {where, "added_tokens", text});
    }
    if (static_cast<std::size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<std::size_t>(id) + 1);
    added_start_[static_cast<unsigned char>(text[0])] = true;
  }
  std::stable_sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (options_.bos >= static_cast<std::int32_t>(tokens_.size())) {
    throw InvalidInput("BOS id outside the vocabulary", {where, "bos", std::to_string(options_.bos)});
  }
  for (const std::string& p : options_.patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    auto re = std::make_unique<Regex>();
    re->pattern = p;
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!re->code) {
      throw InvalidInput("pre-tokenizer regex does not compile at offset " + std::to_string(offset) + ": " + pcre2_message(err),
                         {where, "pre_tokenizer pattern", p});
    }
    // JIT for the two modes split_by_regex uses (complete and hard partial matching); optional:
    // the interpreter is the fallback.
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    regexes_.push_back(std::move(re));
  }
}

BpeVocab::~BpeVocab() = default;

std::vector<std::string> BpeVocab::gguf_pre_patterns(const std::string& pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return {kLlama3Pattern};
  if (pre == "qwen2") return {kQwen2Pattern};
  if (pre == "gpt-2" || pre == "gpt2" || pre == "default") return {kGpt2Pattern};
  return {};
}

std::vector<std::string> BpeVocab::merge(std::vector<std::string> sym) const {
  // Symbols as a linked list; a heap of candidate merges (rank, left index), lowest rank and then
  // leftmost first; an entry is stale when either symbol changed since it was pushed.
  const std::size_t n = sym.size();
  std::vector<std::size_t> prev(n), next(n), version(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i - 1;  // wraps for i = 0: "none"
    next[i] = i + 1;  // n: "none"
  }
  struct Cand {
    std::size_t rank, left, right, vl, vr;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Cand> heap;
  auto push = [&](std::size_t l, std::size_t r) {
    if (l >= n || r >= n) return;
    const auto it = ranks_.find(pair_key(sym[l], sym[r]));
    if (it == ranks_.end()) return;
    heap.push_back({it->second, l, r, version[l], version[r]});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Cand c = heap.back();
    heap.pop_back();
    if (version[c.left] != c.vl || version[c.right] != c.vr || next[c.left] != c.right) continue;
    sym[c.left] += sym[c.right];
    sym[c.right].clear();
    ++version[c.left];
    ++version[c.right];
    next[c.left] = next[c.right];
    if (next[c.left] < n) prev[next[c.left]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; i = next[i]) out.push_back(std::move(sym[i]));
  return out;
}

void BpeVocab::encode_piece(const std::string& piece, std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  std::vector<std::string> sym;
  if (options_.byte_level) {
    const ByteSymbols& bs = byte_symbols();
    for (unsigned char c : piece) sym.push_back(bs.symbol[c]);
  } else {
    for (std::size_t k = 0; k < piece.size();) {
      const std::size_t len = std::min(utf8_len(static_cast<unsigned char>(piece[k])), piece.size() - k);
      sym.push_back(piece.substr(k, len));
      k += len;
    }
  }
  if (options_.ignore_merges) {
    std::string whole;
    for (const auto& s : sym) whole += s;
    const auto it = ids_.find(whole);
    if (it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool last_unk = false;
  for (const std::string& s : merge(std::move(sym))) {
    const auto it = ids_.find(s);
    if (it != ids_.end()) {
      out.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (options_.byte_fallback &&
        std::all_of(s.begin(), s.end(), [&](char c) { return byte_token_[static_cast<unsigned char>(c)] >= 0; })) {
      for (char c : s) out.push_back(byte_token_[static_cast<unsigned char>(c)]);
      last_unk = false;
    } else if (options_.unk >= 0) {
      if (!last_unk) out.push_back(options_.unk);  // fused, as fuse_unk
      last_unk = true;
    } else {
      throw InvalidInput("text piece without a token (no byte symbol, byte fallback or unknown token)", {where_, "token", s});
    }
  }
}

void BpeVocab::encode_text(const std::string& raw, bool first, std::vector<std::int32_t>& out) const {
  std::string text = raw;
  if (options_.nfc && !text.empty()) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    icu::UnicodeString normalized;
    if (U_SUCCESS(status)) normalized = nfc->normalize(icu::UnicodeString::fromUTF8(text), status);
    if (U_FAILURE(status)) throw InvalidInput("cannot normalize the text to NFC", {where_, "normalizer", u_errorName(status)});
    text.clear();
    normalized.toUTF8String(text);
  }
  if (text.empty()) return;
  std::vector<std::string> pieces;
  if (options_.spaces == Spaces::normalizer) {
    pieces = {(options_.prepend == Prepend::never ? "" : kSentencePieceSpace) + replace_spaces(text)};
  } else if (options_.spaces == Spaces::metaspace) {
    std::string t = replace_spaces(text);
    const bool prepend = options_.prepend == Prepend::always || (options_.prepend == Prepend::first && first);
    if (prepend && t.compare(0, 3, kSentencePieceSpace) != 0) t = kSentencePieceSpace + t;
    if (!options_.metaspace_split) {
      pieces = {t};
    } else {
      std::size_t start = 0;
      for (std::size_t k = 3; k + 3 <= t.size(); ++k) {
        if (t.compare(k, 3, kSentencePieceSpace) == 0) {
          pieces.push_back(t.substr(start, k - start));
          start = k;
        }
      }
      pieces.push_back(t.substr(start));
    }
  } else {
    pieces = {text};
  }
  for (const auto& re : regexes_) pieces = split_by_regex(re->code, re->pattern, pieces, text.size(), where_);
  for (const std::string& p : pieces) encode_piece(p, out);
}

std::vector<std::int32_t> BpeVocab::encode(const std::string& text) const {
  // Every layout refuses it, not only those whose pre-tokenizer regex would (ICU's NFC and the
  // SentencePiece-style symbols would turn the bytes into U+FFFD or byte tokens silently).
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
    throw InvalidInput("text is not valid UTF-8 (invalid UTF-8 at byte offset " + std::to_string(bad) + ")",
                       {where_, "text", excerpt(text.substr(bad, 8), 40)});
  }
  std::vector<std::int32_t> out;
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!added_start_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const auto hit = std::find_if(added_.begin(), added_.end(),
                                  [&](const auto& a) { return text.compare(i, a.first.size(), a.first) == 0; });
    if (hit == added_.end()) {
      ++i;
      continue;
    }
    encode_text(text.substr(start, i - start), start == 0, out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_text(text.substr(start), start == 0, out);
  return out;
}

std::string BpeVocab::decode(const std::vector<std::int32_t>& ids) const {
  const ByteSymbols& bs = byte_symbols();
  std::string out, bytes;  // bytes: a run of byte-fallback tokens not yet written
  auto flush = [&] {
    if (bytes.empty()) return;
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(bytes);
    std::string round;
    u.toUTF8String(round);
    if (U_SUCCESS(status) && round == bytes) out += bytes;
    else for (std::size_t k = 0; k < bytes.size(); ++k) out += "\xEF\xBF\xBD";  // U+FFFD per byte
    bytes.clear();
  };
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) continue;
    const auto added = std::find_if(added_.begin(), added_.end(), [&](const auto& a) { return a.second == id; });
    const std::string& t = added != added_.end() ? added->first : tokens_[static_cast<std::size_t>(id)];
    if (options_.byte_level) {
      if (added != added_.end()) {
        out += t;
        continue;
      }
      for (std::size_t k = 0; k < t.size();) {
        const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(t[k])), t.size() - k);
        const auto it = bs.byte_of.find(t.substr(k, n));
        if (it != bs.byte_of.end()) out += static_cast<char>(it->second);
        k += n;
      }
      continue;
    }
    // SentencePiece-style: U+2581 -> space, <0xXX> runs -> bytes (XX two hex digits; a piece
    // shaped so with other characters is text), then one leading space stripped.
    if (added == added_.end() && options_.byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      auto hex = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
      bytes += static_cast<char>(hex(t[3]) * 16 + hex(t[4]));
      continue;
    }
    flush();
    for (std::size_t k = 0; k < t.size();) {
      if (t.compare(k, 3, kSentencePieceSpace) == 0) {
        out += ' ';
        k += 3;
      } else {
        out += t[k++];
      }
    }
  }
  flush();
  if (!options_.byte_level && options_.prepend != Prepend::never && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

namespace {

// A Split pre-tokenizer at the literal string " " (any behavior): a no-op on a normalized text
// without spaces.
bool split_at_space(const nlohmann::json& pre) {
  return pre.is_object() && pre.value("type", std::string()) == "Split" && pre.contains("pattern") &&
         pre["pattern"].is_object() && pre["pattern"].value("String", std::string("?")) == " " && !pre.value("invert", false);
}

// Normalizer: none, NFC, SentencePiece's Prepend U+2581 + Replace " " (either order), or the
// Replace alone (Gemma: no dummy prefix).
void read_normalizer(const nlohmann::json& j, const std::string& path, BpeVocab::Options& o) {
  const nlohmann::json& norm = j.contains("normalizer") ? j["normalizer"] : nlohmann::json();
  if (norm.is_null()) return;
  const std::string type = norm.value("type", std::string("?"));
  auto spm_step = [&](const nlohmann::json& n) {
    const std::string t = n.value("type", std::string());
    return (t == "Prepend" && n.value("prepend", std::string()) == kSentencePieceSpace) ||
           (t == "Replace" && n.contains("pattern") && n["pattern"].value("String", std::string()) == " " &&
            n.value("content", std::string()) == kSentencePieceSpace);
  };
  if (type == "NFC") {
    o.nfc = true;
  } else if (type == "Replace" && spm_step(norm) && !o.byte_level) {
    o.spaces = BpeVocab::Spaces::normalizer;
    o.prepend = BpeVocab::Prepend::never;
  } else if (type == "Sequence" && norm.at("normalizers").size() == 2 && spm_step(norm["normalizers"][0]) &&
             spm_step(norm["normalizers"][1]) &&
             norm["normalizers"][0]["type"] != norm["normalizers"][1]["type"] && !o.byte_level) {
    o.spaces = BpeVocab::Spaces::normalizer;
  } else {
    throw InvalidInput("normalizer not implemented (akv reads none, NFC, or SentencePiece's [Prepend +] Replace)",
                       {path, "normalizer.type", type});
  }
}

// SentencePiece-style pre-tokenizer: none (the normalizer placed the U+2581), Metaspace, or after
// the normalizer a Split at the string " " (Gemma's), which finds nothing in a text whose spaces
// the normalizer replaced; and the model's unknown token.
void read_spm_pretokenizer(const nlohmann::json& pre, const nlohmann::json& model, const std::string& path, BpeVocab::Options& o) {
  if (pre.is_object() && pre.value("type", std::string()) == "Metaspace" && o.spaces == BpeVocab::Spaces::none) {
    if (pre.value("replacement", std::string(kSentencePieceSpace)) != kSentencePieceSpace) {
      throw InvalidInput("Metaspace replacement other than U+2581", {path, "pre_tokenizer.replacement", pre["replacement"].dump()});
    }
    o.spaces = BpeVocab::Spaces::metaspace;
    const std::string scheme = pre.contains("prepend_scheme") ? pre["prepend_scheme"].get<std::string>()
                               : pre.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") o.prepend = BpeVocab::Prepend::always;
    else if (scheme == "first") o.prepend = BpeVocab::Prepend::first;
    else if (scheme == "never") o.prepend = BpeVocab::Prepend::never;
    else throw InvalidInput("unknown Metaspace prepend_scheme", {path, "pre_tokenizer.prepend_scheme", scheme});
    o.metaspace_split = pre.value("split", true);
  } else if (o.spaces != BpeVocab::Spaces::normalizer || !(pre.is_null() || split_at_space(pre))) {
    throw InvalidInput("SentencePiece-style BPE (byte_fallback) needs the [Prepend +] Replace normalizer (then no "
                       "pre-tokenizer or a Split at \" \") or a Metaspace pre-tokenizer", {path, "pre_tokenizer", pre.is_object() ? pre.value("type", std::string("?")) : "null"});
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto& v = model.at("vocab");
    const std::string unk = model["unk_token"].get<std::string>();
    if (v.contains(unk)) o.unk = token_id(v[unk], path, "model.vocab." + unk);
  }
}

// Byte-level pre-tokenizer: [Split(regex, Isolated)...,] ByteLevel, their regexes into o.patterns.
void read_byte_level_pretokenizer(const nlohmann::json& pre, const std::string& path, BpeVocab::Options& o) {
  std::vector<nlohmann::json> steps;
  if (pre.is_object() && pre.value("type", std::string()) == "Sequence") {
    for (const auto& st : pre.at("pretokenizers")) steps.push_back(st);
  } else {
    steps.push_back(pre);
  }
  bool byte_level = false;
  for (const auto& st : steps) {
    const std::string type = st.is_object() ? st.value("type", std::string()) : "null";
    if (type == "Split" && !byte_level) {
      if (!st.at("pattern").contains("Regex") || st.value("behavior", std::string()) != "Isolated" || st.value("invert", false)) {
        throw InvalidInput("Split pre-tokenizer other than an isolated regex", {path, "pre_tokenizer", st.dump().substr(0, 80)});
      }
      o.patterns.push_back(st["pattern"]["Regex"].get<std::string>());
    } else if (type == "ByteLevel" && !byte_level) {
      if (st.value("add_prefix_space", false)) {
        throw InvalidInput("ByteLevel add_prefix_space not implemented", {path, "pre_tokenizer.add_prefix_space", "true"});
      }
      if (st.value("use_regex", true)) o.patterns.push_back(kGpt2Pattern);
      byte_level = true;
    } else {
      throw InvalidInput("pre-tokenizer not implemented (akv reads Split regexes then ByteLevel, or Metaspace)",
                         {path, "pre_tokenizer", type});
    }
  }
  if (!byte_level) throw InvalidInput("not a byte-level BPE (no ByteLevel pre-tokenizer)", {path, "pre_tokenizer"});
}

// The vocabulary's pieces by id, and the merges (pairs, or "a b" strings).
std::vector<std::string> read_pieces(const nlohmann::json& model, const std::string& path) {
  std::vector<std::string> tokens;
  for (const auto& [text, id] : model.at("vocab").items()) {
    const std::int32_t i = token_id(id, path, "model.vocab." + text);
    if (static_cast<std::size_t>(i) >= tokens.size()) tokens.resize(static_cast<std::size_t>(i) + 1);
    tokens[static_cast<std::size_t>(i)] = text;
  }
  return tokens;
}

std::vector<std::pair<std::string, std::string>> read_merges(const nlohmann::json& model, const std::string& path) {
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& m : model.at("merges")) {
    if (m.is_array() && m.size() == 2) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      const std::string s = m.get<std::string>();
      const std::size_t sp = s.find(' ');
      if (sp == std::string::npos) throw InvalidInput("merge without two parts", {path, "model.merges", s});
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    }
  }
  return merges;
}

// BOS: the special token a TemplateProcessing post-processor puts first, when there is one.
void read_bos(const nlohmann::json& j, const std::vector<std::pair<std::string, std::int32_t>>& added, BpeVocab::Options& o) {
  const nlohmann::json& post = j.contains("post_processor") ? j["post_processor"] : nlohmann::json();
  std::vector<nlohmann::json> posts;
  if (post.is_object() && post.value("type", std::string()) == "Sequence") {
    for (const auto& p : post.at("processors")) posts.push_back(p);
  } else if (post.is_object()) {
    posts.push_back(post);
  }
  for (const auto& p : posts) {
    if (p.value("type", std::string()) != "TemplateProcessing" || p.at("single").empty()) continue;
    const auto& first = p["single"][0];
    if (!first.contains("SpecialToken")) continue;
    const std::string name = first["SpecialToken"].at("id").get<std::string>();
    for (const auto& [text, id] : added) {
      if (text == name) o.bos = id;
    }
  }
}

}  // namespace

std::unique_ptr<BpeVocab> BpeVocab::from_tokenizer_json(const std::string& path) {
  std::ifstream in = open_json(path, "tokenizer file");
  const nlohmann::json j = parse_json(in, path, "tokenizer file");
  if (!j.is_object()) throw CorruptData("tokenizer file is not a JSON object", {path});
  return json_errors_as<InvalidInput>("tokenizer.json field missing or of the wrong type", {path}, [&] {
    const nlohmann::json& model = j.at("model");
    if (model.value("type", std::string()) != "BPE") {
      throw InvalidInput("tokenizer model not implemented (akv reads BPE)", {path, "model.type", model.value("type", std::string("missing"))});
    }
    Options o;
    o.ignore_merges = model.value("ignore_merges", false);
    o.byte_level = !model.value("byte_fallback", false);
    o.byte_fallback = !o.byte_level;
    read_normalizer(j, path, o);
    const nlohmann::json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
    if (o.byte_level) {
      read_byte_level_pretokenizer(pre, path, o);
    } else {
      read_spm_pretokenizer(pre, model, path, o);
    }
    std::vector<std::string> tokens = read_pieces(model, path);
    const std::vector<std::pair<std::string, std::string>> merges = read_merges(model, path);
    std::vector<std::pair<std::string, std::int32_t>> added;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      added.emplace_back(a.at("content").get<std::string>(), token_id(a.at("id"), path, "added_tokens.id"));
    }
    read_bos(j, added, o);
    return std::make_unique<BpeVocab>(std::move(tokens), merges, std::move(added), std::move(o), path);
  });
}

}  // namespace akv
