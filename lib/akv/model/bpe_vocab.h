#pragma once
// Byte-level BPE as the GPT-2 family encodes text (GPT-2, Llama 3, Qwen2): from a Hugging Face
// tokenizer.json or from GGUF lists (tokenizer.ggml.model "gpt2"). The text is split at added
// tokens (longest match first; each is one id), normalized (NFC where the file says so, through
// ICU), split by the pre-tokenizer's regexes (PCRE2, UTF and Unicode properties; matches and the
// text between them are pieces), each piece's UTF-8 bytes mapped to GPT-2's printable symbols,
// then merged: the adjacent pair with the lowest merge rank first (ties: the leftmost), after a
// whole piece that is a token is taken as is when ignore_merges is set (Llama 3). Checked against
// Hugging Face tokenizers on three layouts (tests/unit/test_bpe.cpp, data/golden/bpe).
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace akv {

class BpeVocab {
 public:
  struct Options {
    std::vector<std::string> patterns;  // pre-tokenizer regexes, applied one after another
    bool ignore_merges = false;
    bool nfc = false;        // normalize to NFC first
    std::int32_t bos = -1;   // the id put before a text (post-processor / add_bos_token), -1: none
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
  void encode_text(const std::string& text, std::vector<std::int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::size_t> ranks_;  // left + '\n' + right
  std::vector<std::pair<std::string, std::int32_t>> added_;  // longest first
  std::vector<std::unique_ptr<Regex>> regexes_;
  Options options_;
  std::string where_;
};

}  // namespace akv
