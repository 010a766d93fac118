#pragma once
// Tokenizers for text prompts such as passkey retrieval: SentencePiece (libsentencepiece), the
// SentencePiece-style vocabulary embedded in a GGUF file (spm_vocab.h), byte-level BPE from a
// tokenizer.json or a GGUF file (bpe_vocab.h), or bytes (ids 0-255 are
// UTF-8 bytes, 256 = BOS, 257 = EOS; the project's own trained model, config.json
// "akv_tokenizer": "bytes").
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace akv {

class SpmVocab;
class BpeVocab;
class GgufFile;

class Tokenizer {
 public:
  // Loads a SentencePiece model file, or a Hugging Face tokenizer.json (byte-level BPE:
  // bpe_vocab.h) when the name ends in .json; IoError / CorruptData / InvalidInput naming the file.
  explicit Tokenizer(const std::string& path);
  // The byte-level tokenizer.
  static Tokenizer bytes();
  // The vocabulary of a GGUF file (tokenizer.ggml.model "llama": SentencePiece-style; "gpt2":
  // byte-level BPE with the regexes of tokenizer.ggml.pre); InvalidInput naming the file and key
  // when it has none or another kind.
  static Tokenizer from_gguf(const std::string& path);
  static Tokenizer from_gguf(const GgufFile& f);
  // Every piece with its score and SentencePiece type (1 normal, 2 unknown, 3 control,
  // 4 user-defined, 5 unused, 6 byte), as GGUF's tokenizer.ggml lists store them.
  struct Piece {
    std::string text;
    float score = 0;
    std::int32_t type = 1;
  };
  std::vector<Piece> pieces() const;
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  std::vector<std::int32_t> encode(const std::string& text) const;  // no BOS/EOS
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::size_t vocab_size() const;
  std::int32_t bos() const;  // -1 when the tokenizer puts none (Qwen2)
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  Tokenizer() = default;
  static Tokenizer gguf_bpe(const GgufFile& f);
  std::unique_ptr<Impl> impl_;  // SentencePiece; null otherwise
  std::shared_ptr<const SpmVocab> spm_;  // a GGUF SentencePiece-style vocabulary; null otherwise
  std::shared_ptr<const BpeVocab> bpe_;  // byte-level BPE (tokenizer.json or GGUF gpt2); null otherwise
  std::string path_;
};

// The tokenizer of a model run: `flag` (`bytes`, a SentencePiece model file or a tokenizer.json),
// else the model's own: tokenizer.model of a Hugging Face directory, else its tokenizer.json
// (byte-level BPE), config.json's "akv_tokenizer": "bytes" (`config_tokenizer`), the vocabulary
// embedded in a GGUF file. Null when there is none.
std::unique_ptr<Tokenizer> find_tokenizer(const std::string& flag, const std::string& model_path,
                                          const std::string& config_tokenizer);
// find_tokenizer's, never null: UsageError "<needed_by> needs a tokenizer for <use> (--tokenizer
// FILE or bytes, or one in the model)" naming the flag `needed_by` when there is none.
std::unique_ptr<Tokenizer> require_tokenizer(const std::string& flag, const std::string& model_path,
                                             const std::string& config_tokenizer, const std::string& needed_by,
                                             const std::string& use);

}  // namespace akv
