#pragma once
// GGUF (llama.cpp's model format, versions 2 and 3): the file, and a Llama-family model from it.
//
// GgufFile parses and checks the header, every metadata entry and every tensor's name, shape,
// type and offset against the file size before any tensor is read; tensors are read one at a
// time and dequantized to f32 (tensor/ggml_blocks.h lists the types). load_gguf builds a model
// of architecture `llama` (Llama, Mistral, TinyLlama; llama.cpp's "normal" RoPE: interleaved
// pairs, on the permuted q/k weights its converter writes), `qwen2` (NeoX RoPE: rotate-half;
// q/k/v biases), `qwen3` (NeoX RoPE; attn_q_norm / attn_k_norm per head) or `phi3` (NeoX RoPE;
// fused attn_qkv and gate+up ffn_up, split on load), with rope.freq_base, rope.dimension_count, rope.scaling.{type,factor} (linear)
// and rope_freqs.weight (Llama 3's per-frequency factors), layer_norm_rms_epsilon, GQA and a
// tied output when output.weight is absent. docs/model.md, "GGUF".
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/model/model.h"

namespace akv {

struct GgufTensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] varies fastest (a matrix's columns)
  std::uint32_t type = 0;           // ggml type id
  std::uint64_t offset = 0;         // from the start of the data section
  std::uint64_t bytes = 0;          // 0 when the type is unknown to akv
};

// A metadata array as stored: element type, length, and the file offset of its first value.
struct GgufArray {
  std::uint32_t type = 0;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  // Scalar metadata: key -> value (integers, reals, booleans, strings). Arrays (vocabularies,
  // merges: up to 2^24 values each) are checked and skipped when the file is opened, and read
  // only by the typed readers below, straight into vectors: a model, `akv info` or a run without
  // the file's tokenizer never holds them.
  const nlohmann::json& metadata() const { return meta_; }
  const std::map<std::string, GgufArray>& arrays() const { return arrays_; }
  // A scalar metadata value; nullopt when absent; InvalidInput naming the key when it is an array.
  std::optional<nlohmann::json> value(const std::string& key) const;
  // An array read from the file now; nullopt when absent. InvalidInput naming the key when it is
  // a scalar or its values are of another kind: strings; numbers of any type (as f32); integers
  // (of any integer type, each within int32).
  std::optional<std::vector<std::string>> strings(const std::string& key) const;
  std::optional<std::vector<float>> floats(const std::string& key) const;
  std::optional<std::vector<std::int32_t>> int32s(const std::string& key) const;
  const GgufTensor* find(const std::string& name) const;
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }
  // The tensor as f32, after checking its dims (ggml order) against `dims`; InvalidInput names
  // the file, the tensor and both shapes, CorruptData a non-finite value.
  std::vector<float> read(const std::string& name, const std::vector<std::uint64_t>& dims) const;
  // The checks of read() without reading: dims equal to `dims`, a type akv reads.
  void check(const GgufTensor& t, const std::vector<std::uint64_t>& dims) const;
  std::uint64_t data_start() const { return data_start_; }  // absolute offset of the data section

 private:
  std::string path_;
  std::uint32_t version_ = 0;
  std::uint64_t data_start_ = 0, file_size_ = 0;
  nlohmann::json meta_ = nlohmann::json::object();
  // The array at `key` (nullptr when absent), its values of a type `accept` takes (kind: their
  // name in the error).
  const GgufArray* array_of(const std::string& key, bool (*accept)(std::uint32_t), const char* kind) const;
  std::map<std::string, GgufArray> arrays_;
  std::map<std::string, GgufTensor> tensors_;
};

// `akv info` of a GGUF file: version, architecture and name, every scalar metadata entry (arrays
// as their length), the tensors by type (count, bytes) and in total; its text rendering.
nlohmann::json gguf_info(const GgufFile& f);
std::string render_gguf_info(const nlohmann::json& info);

// True when the file starts with GGUF's magic.
bool is_gguf(const std::string& path);

// mode stored: encoded tensors (F16, BF16, ggml blocks) stay as stored, in a memory map of the
// file (weight.h); f32: everything converted on load.
Model load_gguf(const std::string& path, WeightMode mode = WeightMode::stored);

}  // namespace akv
