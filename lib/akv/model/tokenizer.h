#pragma once
// SentencePiece tokenizer (libsentencepiece), for text prompts such as passkey retrieval.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace akv {

class Tokenizer {
 public:
  // Loads a SentencePiece model file; IoError / CorruptData naming the file.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  std::vector<std::int32_t> encode(const std::string& text) const;  // no BOS/EOS
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::size_t vocab_size() const;
  std::int32_t bos() const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace akv
