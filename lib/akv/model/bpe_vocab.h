#pragma once
// BPE as Hugging Face tokenizers runs it, from a tokenizer.json or GGUF lists: byte-level (GPT-2,
// Llama 3, Qwen2; GGUF tokenizer.ggml.model "gpt2") and SentencePiece-style (Mistral, TinyLlama, Gemma:
// U+2581 for spaces, characters as symbols, byte fallback; Options). The text is split at added
// tokens (longest match first; each is one id), normalized (NFC where the file says so, through
// ICU), split by the pre-tokenizer's regexes (PCRE2, UTF and Unicode properties; matches and the
// text between them are pieces), each piece's UTF-8 bytes mapped to GPT-2's printable symbols,
// then merged: the adjacent pair with the lowest merge rank first (ties: the leftmost; a heap, so
// a whole text without pre-tokenizer merges in n log n), after a whole piece that is a token is
// taken as is when ignore_merges is set (Llama 3). Checked against Hugging Face tokenizers on six
// layouts (tests/unit/test_bpe.cpp, data/golden/bpe).
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace akv {

class BpeVocab {
 public:
  // How spaces become U+2581 in SentencePiece-style BPE (Mistral, TinyLlama, Gemma): not at all
  // (byte-level), by the normalizer (Replace " "; Prepend U+2581 to every non-empty segment unless
  // prepend is never: Gemma), or by the Metaspace pre-tokenizer (replace, then prepend to the
  // text's first segment or to every segment unless it starts with U+2581 already; split: cut
  // before every U+2581). Decoding strips the one leading space a prepend put there.
  enum class Spaces { none, normalizer, metaspace };
  enum class Prepend { always, first, never };
  struct Options {
    std::vector<std::string> patterns;  // pre-tokenizer regexes, applied one after another
    bool ignore_merges = false;
    bool nfc = false;        // normalize to NFC first
    std::int32_t bos = -1;   // the id put before a text (post-processor / add_bos_token), -1: none
    bool byte_level = true;  // false: symbols are UTF-8 characters (SentencePiece-style)
    bool byte_fallback = false;  // characters without a token become their <0xXX> byte tokens
    std::int32_t unk = -1;       // else this token (consecutive ones fused), -1: refused
    Spaces spaces = Spaces::none;
    Prepend prepend = Prepend::always;
    bool metaspace_split = false;
  };
  // tokens[id] (empty strings: unused ids), merges as (left, right) in rank order, added tokens
  // (content, id). InvalidInput naming `where` and the field for malformed data.
  BpeVocab(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
           std::vector<std::pair<std::string, std::int32_t>> added, Options options, const std::string& where);
  ~BpeVocab();
  BpeVocab(const BpeVocab&) = delete;
  BpeVocab& operator=(const BpeVocab&) = delete;

  // A tokenizer.json with model BPE and a byte-level pre-tokenizer (ByteLevel with its GPT-2
  // regex, or Split regexes then ByteLevel without); others are refused naming the field (exit 2).
  static std::unique_ptr<BpeVocab> from_tokenizer_json(const std::string& path);
  // The regexes llama.cpp uses for tokenizer.ggml.pre (llama-bpe, llama3, qwen2, gpt-2, default);
  // empty for names akv does not know.
  static std::vector<std::string> gguf_pre_patterns(const std::string& pre);

  std::vector<std::int32_t> encode(const std::string& text) const;  // no BOS / EOS
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::size_t size() const { return tokens_.size(); }
  std::int32_t bos() const { return options_.bos; }

 private:
  struct Regex;
  void encode_piece(const std::string& piece, std::vector<std::int32_t>& out) const;
  void encode_text(const std::string& text, bool first, std::vector<std::int32_t>& out) const;
  std::vector<std::string> merge(std::vector<std::string> symbols) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::size_t> ranks_;  // left + '\n' + right
  std::int32_t byte_token_[256];                        // <0xXX> ids (byte fallback), -1: none
  std::vector<std::pair<std::string, std::int32_t>> added_;  // longest first
  bool added_start_[256] = {};  // bytes an added token starts with (the scan skips the others)
  std::vector<std::unique_ptr<Regex>> regexes_;
  Options options_;
  std::string where_;
};

}  // namespace akv
