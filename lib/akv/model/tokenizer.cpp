#include "akv/model/tokenizer.h"

#include <sentencepiece_processor.h>

#include <climits>
#include <filesystem>

#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/model/bpe_vocab.h"
#include "akv/model/gguf.h"
#include "akv/model/spm_vocab.h"

namespace akv {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw IoError("tokenizer file not found", {path});
  if (std::filesystem::path(path).extension() == ".json") {
    bpe_ = BpeVocab::from_tokenizer_json(path);
    return;
  }
  impl_ = std::make_unique<Impl>();
  const auto status = impl_->sp.Load(path);
  if (!status.ok()) throw CorruptData("not a SentencePiece model: " + status.ToString(), {path});
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.path_ = "bytes";
  return t;
}

namespace {

// A token id from GGUF metadata: an integer in [0, 2^31) (a wider one was narrowed silently).
std::int32_t gguf_token_id(const nlohmann::json& v, const std::string& path, const char* key) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > INT32_MAX) {
    throw InvalidInput("token id not an integer in [0, 2^31)", {path, key, v.dump()});
  }
  return v.get<std::int32_t>();
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::string& path) { return from_gguf(GgufFile(path)); }

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& path = f.path();
  auto get = [&](const char* key) { return f.value(key); };
  const std::optional<nlohmann::json> model = get("tokenizer.ggml.model");
  if (!model) throw InvalidInput("no tokenizer in the GGUF file", {path, "tokenizer.ggml.model", "missing"});
  const std::string kind = model->is_string() ? model->get<std::string>() : model->dump();
  if (kind != "llama" && kind != "gpt2") {
    throw InvalidInput("tokenizer kind not implemented (akv reads llama, the SentencePiece-style BPE, and gpt2, "
                       "byte-level BPE)", {path, "tokenizer.ggml.model", kind});
  }
  if (kind == "gpt2") return gguf_bpe(f);
  return json_errors_as<InvalidInput>("tokenizer metadata of the wrong type", {path, "tokenizer.ggml"}, [&] {
    std::optional<std::vector<std::string>> tokens = f.strings("tokenizer.ggml.tokens");
    if (!tokens) throw InvalidInput("tokenizer has no tokens", {path, "tokenizer.ggml.tokens", "missing"});
    std::optional<std::vector<float>> scores = f.floats("tokenizer.ggml.scores");
    std::optional<std::vector<std::int32_t>> types = f.int32s("tokenizer.ggml.token_type");
    const std::optional<nlohmann::json> bos = get("tokenizer.ggml.bos_token_id"), unk = get("tokenizer.ggml.unknown_token_id"),
                                        prefix = get("tokenizer.ggml.add_space_prefix");
    Tokenizer t;
    t.path_ = path;
    t.spm_ = std::make_shared<SpmVocab>(
        std::move(*tokens), scores ? std::move(*scores) : std::vector<float>{},
        types ? std::move(*types) : std::vector<std::int32_t>{},
        bos ? gguf_token_id(*bos, path, "tokenizer.ggml.bos_token_id") : 1,
        unk ? gguf_token_id(*unk, path, "tokenizer.ggml.unknown_token_id") : 0, prefix ? prefix->get<bool>() : true, path);
    return t;
  });
}

Tokenizer Tokenizer::gguf_bpe(const GgufFile& f) {
  const std::string& path = f.path();
  const nlohmann::json& m = f.metadata();  // scalars; arrays through the typed readers
  return json_errors_as<InvalidInput>("tokenizer metadata of the wrong type", {path, "tokenizer.ggml"}, [&] {
    const std::string pre = m.contains("tokenizer.ggml.pre") ? m["tokenizer.ggml.pre"].get<std::string>() : "default";
    BpeVocab::Options o;
    o.patterns = BpeVocab::gguf_pre_patterns(pre);
    if (o.patterns.empty()) {
      throw InvalidInput("pre-tokenizer not implemented (akv knows llama-bpe, llama3, qwen2, gpt-2, default)",
                         {path, "tokenizer.ggml.pre", pre});
    }
    o.ignore_merges = pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";  // as llama.cpp
    const bool add_bos = m.contains("tokenizer.ggml.add_bos_token") ? m["tokenizer.ggml.add_bos_token"].get<bool>() : false;
    if (add_bos && m.contains("tokenizer.ggml.bos_token_id")) o.bos = gguf_token_id(m["tokenizer.ggml.bos_token_id"], path, "tokenizer.ggml.bos_token_id");
    std::optional<std::vector<std::string>> token_values = f.strings("tokenizer.ggml.tokens");
    if (!token_values) throw InvalidInput("tokenizer has no tokens", {path, "tokenizer.ggml.tokens", "missing"});
    std::vector<std::string> tokens = std::move(*token_values);
    const std::vector<std::int32_t> types =
        f.int32s("tokenizer.ggml.token_type").value_or(std::vector<std::int32_t>(tokens.size(), 1));
    if (types.size() != tokens.size()) {
      throw InvalidInput("token types and tokens differ in count", {path, "tokenizer.ggml.token_type", std::to_string(types.size())});
    }
    std::vector<std::pair<std::string, std::string>> merges;
    if (const std::optional<std::vector<std::string>> merge_values = f.strings("tokenizer.ggml.merges")) {
      for (const std::string& s : *merge_values) {
        const std::size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw InvalidInput("merge without two parts", {path, "tokenizer.ggml.merges", s});
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      }
    }
    // Control (3) and user-defined (4) tokens are matched in the text as whole tokens, as added
    // tokens are in tokenizer.json.
    std::vector<std::pair<std::string, std::int32_t>> added;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if ((types[i] == 3 || types[i] == 4) && !tokens[i].empty()) {
        added.emplace_back(tokens[i], static_cast<std::int32_t>(i));
        tokens[i].clear();
      }
    }
    Tokenizer t;
    t.path_ = path;
    t.bpe_ = std::make_shared<BpeVocab>(std::move(tokens), merges, std::move(added), std::move(o), path);
    return t;
  });
}

std::vector<Tokenizer::Piece> Tokenizer::pieces() const {
  std::vector<Piece> out;
  if (!impl_) return out;
  for (int i = 0; i < impl_->sp.GetPieceSize(); ++i) {
    Piece p{impl_->sp.IdToPiece(i), impl_->sp.GetScore(i), 1};
    if (impl_->sp.IsUnknown(i)) p.type = 2;
    else if (impl_->sp.IsControl(i)) p.type = 3;
    else if (impl_->sp.IsUnused(i)) p.type = 5;
    else if (impl_->sp.IsByte(i)) p.type = 6;
    out.push_back(std::move(p));
  }
  return out;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Tokenizer::encode(const std::string& text) const {
  if (bpe_) return bpe_->encode(text);
  if (spm_) return spm_->encode(text);
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
  if (bpe_) return bpe_->decode(ids);
  if (spm_) return spm_->decode(ids);
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
  if (bpe_) return bpe_->size();
  if (spm_) return spm_->size();
  return impl_ ? static_cast<std::size_t>(impl_->sp.GetPieceSize()) : 258;
}
std::int32_t Tokenizer::bos() const {
  if (bpe_) return bpe_->bos();
  if (spm_) return spm_->bos();
  return impl_ ? impl_->sp.bos_id() : 256;
}

std::unique_ptr<Tokenizer> find_tokenizer(const std::string& flag, const std::string& model_path,
                                          const std::string& config_tokenizer) {
  if (flag == "bytes") return std::make_unique<Tokenizer>(Tokenizer::bytes());
  if (!flag.empty()) return std::make_unique<Tokenizer>(flag);
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) {
    for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
      const auto file = std::filesystem::path(model_path) / name;
      if (std::filesystem::is_regular_file(file, ec)) return std::make_unique<Tokenizer>(file.string());
    }
  }
  if (config_tokenizer == "bytes") return std::make_unique<Tokenizer>(Tokenizer::bytes());
  if (is_gguf(model_path)) {
    const GgufFile f(model_path);
    if (f.metadata().contains("tokenizer.ggml.model")) return std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
  }
  return nullptr;
}

std::unique_ptr<Tokenizer> require_tokenizer(const std::string& flag, const std::string& model_path,
                                             const std::string& config_tokenizer, const std::string& needed_by,
                                             const std::string& use) {
  std::unique_ptr<Tokenizer> tok = find_tokenizer(flag, model_path, config_tokenizer);
  if (!tok) {
    throw UsageError(needed_by + " needs a tokenizer for " + use + " (--tokenizer FILE or bytes, or one in the model)",
                     {"", needed_by});
  }
  return tok;
}

}  // namespace akv
