#include "akv/model/bpe_vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"

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

}  // namespace

struct BpeVocab::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

BpeVocab::BpeVocab(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
                   std::vector<std::pair<std::string, std::int32_t>> added, Options options, const std::string& where)
    : tokens_(std::move(tokens)), added_(std::move(added)), options_(std::move(options)), where_(where) {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (!tokens_[i].empty()) ids_.emplace(tokens_[i], static_cast<std::int32_t>(i));
  }
  for (std::size_t r = 0; r < merges.size(); ++r) ranks_.emplace(merges[r].first + '\n' + merges[r].second, r);
  for (const auto& [text, id] : added_) {
    if (text.empty() || id < 0) throw InvalidInput("empty added token or negative id", {where, "added_tokens", text});
    if (static_cast<std::size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<std::size_t>(id) + 1);
  }
  std::stable_sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (options_.bos >= static_cast<std::int32_t>(tokens_.size())) {
    throw InvalidInput("BOS id outside the vocabulary", {where, "bos", std::to_string(options_.bos)});
  }
  for (const std::string& p : options_.patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!re->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InvalidInput("pre-tokenizer regex does not compile at offset " + std::to_string(offset) + ": " +
                             reinterpret_cast<const char*>(msg), {where, "pre_tokenizer pattern", p});
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);  // optional: the interpreter is the fallback
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

void BpeVocab::encode_piece(const std::string& piece, std::vector<std::int32_t>& out) const {
  const ByteSymbols& bs = byte_symbols();
  std::vector<std::string> sym;
  std::string whole;
  for (unsigned char c : piece) {
    sym.push_back(bs.symbol[c]);
    whole += sym.back();
  }
  if (sym.empty()) return;
  if (options_.ignore_merges) {
    const auto it = ids_.find(whole);
    if (it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  for (;;) {
    std::size_t best = std::numeric_limits<std::size_t>::max(), at = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = ranks_.find(sym[i] + '\n' + sym[i + 1]);
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<std::size_t>::max()) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& s : sym) {
    const auto it = ids_.find(s);
    if (it == ids_.end()) throw InvalidInput("text piece without a token (the vocabulary lacks a byte symbol)", {where_, "token", s});
    out.push_back(it->second);
  }
}

void BpeVocab::encode_text(const std::string& raw, std::vector<std::int32_t>& out) const {
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
  std::vector<std::string> pieces = {text};
  for (const auto& re : regexes_) {
    std::vector<std::string> next;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    for (const std::string& p : pieces) {
      std::size_t pos = 0, last = 0;
      while (pos <= p.size()) {
        const int rc = pcre2_match(re->code, reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), pos, 0, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(md);
          throw InvalidInput("pre-tokenizer regex failed on the text (invalid UTF-8?)", {where_, "pcre2 error", std::to_string(rc)});
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > last) next.push_back(p.substr(last, ov[0] - last));
        if (ov[1] > ov[0]) next.push_back(p.substr(ov[0], ov[1] - ov[0]));
        last = ov[1];
        pos = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < p.size() ? utf8_len(static_cast<unsigned char>(p[ov[1]])) : 1);
      }
      if (last < p.size()) next.push_back(p.substr(last));
    }
    pcre2_match_data_free(md);
    pieces = std::move(next);
  }
  for (const std::string& p : pieces) encode_piece(p, out);
}

std::vector<std::int32_t> BpeVocab::encode(const std::string& text) const {
  std::vector<std::int32_t> out;
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto hit = std::find_if(added_.begin(), added_.end(),
                                  [&](const auto& a) { return text.compare(i, a.first.size(), a.first) == 0; });
    if (hit == added_.end()) {
      ++i;
      continue;
    }
    encode_text(text.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_text(text.substr(start), out);
  return out;
}

std::string BpeVocab::decode(const std::vector<std::int32_t>& ids) const {
  const ByteSymbols& bs = byte_symbols();
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) continue;
    const auto added = std::find_if(added_.begin(), added_.end(), [&](const auto& a) { return a.second == id; });
    if (added != added_.end()) {
      out += added->first;
      continue;
    }
    const std::string& t = tokens_[static_cast<std::size_t>(id)];
    for (std::size_t k = 0; k < t.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(t[k])), t.size() - k);
      const auto it = bs.byte_of.find(t.substr(k, n));
      if (it != bs.byte_of.end()) out += static_cast<char>(it->second);
      k += n;
    }
  }
  return out;
}

std::unique_ptr<BpeVocab> BpeVocab::from_tokenizer_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open tokenizer file", {path});
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData("tokenizer file is not JSON", {path});
  try {
    const nlohmann::json& model = j.at("model");
    if (model.value("type", std::string()) != "BPE") {
      throw InvalidInput("tokenizer model not implemented (akv reads BPE)", {path, "model.type", model.value("type", std::string("missing"))});
    }
    if (model.value("byte_fallback", false)) {
      throw InvalidInput("SentencePiece-style tokenizer.json (byte_fallback) not read yet: use the model's tokenizer.model",
                         {path, "model.byte_fallback", "true"});
    }
    Options o;
    o.ignore_merges = model.value("ignore_merges", false);
    const nlohmann::json& norm = j.contains("normalizer") ? j["normalizer"] : nlohmann::json();
    if (!norm.is_null()) {
      if (norm.value("type", std::string()) != "NFC") {
        throw InvalidInput("normalizer not implemented (akv reads none or NFC)", {path, "normalizer.type", norm.value("type", std::string("?"))});
      }
      o.nfc = true;
    }
    // Pre-tokenizer: [Split(regex, Isolated)...,] ByteLevel.
    const nlohmann::json& pre = j.at("pre_tokenizer");
    std::vector<nlohmann::json> steps;
    if (pre.is_object() && pre.value("type", std::string()) == "Sequence") {
      for (const auto& s : pre.at("pretokenizers")) steps.push_back(s);
    } else {
      steps.push_back(pre);
    }
    bool byte_level = false;
    for (const auto& s : steps) {
      const std::string type = s.is_object() ? s.value("type", std::string()) : "null";
      if (type == "Split" && !byte_level) {
        if (!s.at("pattern").contains("Regex") || s.value("behavior", std::string()) != "Isolated" || s.value("invert", false)) {
          throw InvalidInput("Split pre-tokenizer other than an isolated regex", {path, "pre_tokenizer", s.dump().substr(0, 80)});
        }
        o.patterns.push_back(s["pattern"]["Regex"].get<std::string>());
      } else if (type == "ByteLevel" && !byte_level) {
        if (s.value("add_prefix_space", false)) {
          throw InvalidInput("ByteLevel add_prefix_space not implemented", {path, "pre_tokenizer.add_prefix_space", "true"});
        }
        if (s.value("use_regex", true)) o.patterns.push_back(kGpt2Pattern);
        byte_level = true;
      } else {
        throw InvalidInput("pre-tokenizer not implemented (akv reads Split regexes then ByteLevel)", {path, "pre_tokenizer", type});
      }
    }
    if (!byte_level) throw InvalidInput("not a byte-level BPE (no ByteLevel pre-tokenizer)", {path, "pre_tokenizer"});
    std::vector<std::string> tokens;
    for (const auto& [text, id] : model.at("vocab").items()) {
      const auto i = id.get<std::int64_t>();
      if (i < 0 || i > (1 << 24)) throw InvalidInput("token id out of range", {path, "model.vocab." + text, std::to_string(i)});
      if (static_cast<std::size_t>(i) >= tokens.size()) tokens.resize(static_cast<std::size_t>(i) + 1);
      tokens[static_cast<std::size_t>(i)] = text;
    }
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
    std::vector<std::pair<std::string, std::int32_t>> added;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      added.emplace_back(a.at("content").get<std::string>(), a.at("id").get<std::int32_t>());
    }
    // BOS: the special token a TemplateProcessing post-processor puts first, when there is one.
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
    return std::make_unique<BpeVocab>(std::move(tokens), merges, std::move(added), std::move(o), path);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(std::string("tokenizer.json field missing or of the wrong type: ") + e.what(), {path});
  }
}

}  // namespace akv
