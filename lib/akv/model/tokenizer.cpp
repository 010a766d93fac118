#include "akv/model/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "akv/core/errors.h"

namespace akv {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw IoError("tokenizer file not found", {path});
  const auto status = impl_->sp.Load(path);
  if (!status.ok()) throw CorruptData("not a SentencePiece model: " + status.ToString(), {path});
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.path_ = "bytes";
  return t;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Tokenizer::encode(const std::string& text) const {
  if (!impl_) {
    std::vector<std::int32_t> out;
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw InvalidInput("cannot tokenize: " + status.ToString(), {path_});
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  if (!impl_) {
    std::string out;
    for (std::int32_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto status = impl_->sp.Decode(v, &text);
  if (!status.ok()) throw InvalidInput("cannot detokenize: " + status.ToString(), {path_});
  return text;
}

std::size_t Tokenizer::vocab_size() const {
  return impl_ ? static_cast<std::size_t>(impl_->sp.GetPieceSize()) : 258;
}
std::int32_t Tokenizer::bos() const { return impl_ ? impl_->sp.bos_id() : 256; }

}  // namespace akv
