#pragma once
// Tokenizers for text prompts such as passkey retrieval: SentencePiece (libsentencepiece), or
// bytes (ids 0-255 are UTF-8 bytes, 256 = BOS, 257 = EOS; the project's own trained model,
// config.json "akv_tokenizer": "bytes").
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace akv {

class Tokenizer {
 public:
  // Loads a SentencePiece model file; IoError / CorruptData naming the file.
  explicit Tokenizer(const std::string& path);
  // The byte-level tokenizer.
  static Tokenizer bytes();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  std::vector<std::int32_t> encode(const std::string& text) const;  // no BOS/EOS
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::size_t vocab_size() const;
  std::int32_t bos() const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  Tokenizer() = default;
  std::unique_ptr<Impl> impl_;  // null for the byte tokenizer
  std::string path_;
};

}  // namespace akv
