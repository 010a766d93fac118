#include "akv/model/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/model/architecture.h"
#include "akv/model/hf_config.h"
#include "akv/tensor/ggml_blocks.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TensorInfo {
  std::string file, dtype;
  std::vector<std::size_t> shape;
  std::uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
};

std::size_t dtype_bytes(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  return 0;
}

// Parses and validates one safetensors header; adds its tensors to `out`.
void read_header(const std::string& path, std::map<std::string, TensorInfo>& out) {
  std::error_code ec;
  const std::uint64_t size = fs::file_size(path, ec);
  if (ec) throw IoError("cannot read safetensors file", {path});
  std::ifstream in(path, std::ios::binary);
  unsigned char lenb[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(lenb), 8)) {
    throw CorruptData("file shorter than a safetensors header", {path, "header", std::to_string(size)});
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | lenb[i];
  if (n > size - 8 || n > (100u << 20)) {
    throw CorruptData("safetensors header length beyond the file", {path, "header length", std::to_string(n)});
  }
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const json h = parse_json(text, path, "safetensors header");
  if (!h.is_object()) throw CorruptData("safetensors header is not a JSON object", {path, "header"});
  const std::uint64_t data0 = 8 + n, data_size = size - data0;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    TensorInfo t;
    t.file = path;
    try {
      t.dtype = v.at("dtype").get<std::string>();
      const std::vector<std::uint64_t> shape = json_uints(v.at("shape"));  // integers only: get<> casts floats
      t.shape.assign(shape.begin(), shape.end());
      const std::vector<std::uint64_t> off = json_uints(v.at("data_offsets"));
      if (off.size() != 2) throw CorruptData("data_offsets must hold 2 numbers", {path, name + ".data_offsets"});
      t.begin = off[0];
      t.end = off[1];
    } catch (const json::exception& e) {
      throw CorruptData(std::string("bad tensor entry: ") + e.what(), {path, name});
    }
    const std::size_t eb = dtype_bytes(t.dtype);
    if (eb == 0) throw InvalidInput("unsupported tensor dtype (akv reads F32, F16, BF16)", {path, name + ".dtype", t.dtype});
    const Where where{path, name + ".shape", std::to_string(t.shape.size()) + " dimensions"};
    std::uint64_t numel = 1;
    for (std::size_t d : t.shape) numel = checked_mul(numel, d, where);
    const std::uint64_t bytes = checked_mul(numel, eb, where);
    if (t.begin > t.end || t.end > data_size) {
      throw CorruptData("tensor data offsets beyond the file (data section holds " + std::to_string(data_size) + " bytes)",
                        {path, name + ".data_offsets", std::to_string(t.begin) + ".." + std::to_string(t.end)});
    }
    if (t.end - t.begin != bytes) {
      throw CorruptData("tensor byte size does not match its shape and dtype",
                        {path, name + ".data_offsets", std::to_string(t.end - t.begin)});
    }
    t.begin += data0;
    t.end += data0;
    if (const auto it = out.find(name); it != out.end()) {
      throw CorruptData("tensor stored twice (also in " + it->second.file + ")", {path, name});
    }
    out[name] = t;
  }
}

class Tensors {
 public:
  explicit Tensors(const std::string& dir) : dir_(dir) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(single)) {
      read_header(single.string(), map_);
    } else if (fs::exists(index)) {
      std::ifstream in = open_json(index.string(), "safetensors index");
      const json j = parse_json(in, index.string(), "safetensors index");
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        throw CorruptData("index has no weight_map object", {index.string(), "weight_map"});
      }
      // Shards are files of this directory, each read once (the map names each many times).
      std::map<std::string, bool> files;
      for (const auto& [name, f] : j["weight_map"].items()) {
        const std::string where = "weight_map." + name;
        if (!f.is_string()) throw InvalidInput("shard must be a file name", {index.string(), where, f.dump()});
        const std::string shard = f.get<std::string>();
        if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
          throw InvalidInput("shard must be a file name in the model directory", {index.string(), where, shard});
        }
        files[shard] = true;
      }
      for (const auto& [f, unused] : files) {
        (void)unused;
        read_header((fs::path(dir) / f).string(), map_);
      }
    } else {
      throw IoError("no model.safetensors or model.safetensors.index.json", {dir});
    }
  }
  bool has(const std::string& name) const { return map_.count(name) > 0; }
  // Reads a tensor as f32 after checking its shape.
  std::vector<float> read(const std::string& name, const std::vector<std::size_t>& shape) const {
    const auto it = map_.find(name);
    if (it == map_.end()) throw InvalidInput("missing tensor", {dir_, name});
    const TensorInfo& t = it->second;
    check_shape(t, name, shape);
    std::ifstream in(t.file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(t.begin));
    std::vector<char> raw(t.end - t.begin);
    if (!in.read(raw.data(), static_cast<std::streamsize>(raw.size()))) throw IoError("cannot read tensor", {t.file, name});
    const std::size_t n = raw.size() / dtype_bytes(t.dtype);
    std::vector<float> out(n);
    if (t.dtype == "F32") {
      std::memcpy(out.data(), raw.data(), raw.size());
    } else {
      std::vector<std::uint16_t> h(n);
      std::memcpy(h.data(), raw.data(), raw.size());
      if (t.dtype == "F16") f16_to_f32(h.data(), out.data(), n);
      else bf16_to_f32(h.data(), out.data(), n);
    }
    if (const std::size_t i = first_nonfinite(out.data(), n); i < n) {
      throw CorruptData("non-finite weight", {t.file, name, format_number(out[i])});
    }
    return out;
  }
  static void check_shape(const TensorInfo& t, const std::string& name, const std::vector<std::size_t>& shape) {
    if (t.shape == shape) return;
    auto str = [](const std::vector<std::size_t>& s) {
      std::string o = "[";
      for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    throw InvalidInput("tensor shape does not match config.json (expected " + str(shape) + ")",
                       {t.file, name + ".shape", str(t.shape)});
  }
  // A matrix as stored in a memory map of its file (modes stored and q8: F16/BF16 rows, or F32 rows at a
  // 4-byte aligned offset, used in place), or an f32 copy (mode f32, or misaligned F32). With
  // `total` > 0: rows [row0, row0 + rows) of a tensor of shape [total, cols] (Phi-3's fused qkv_proj
  // and gate_up_proj).
  Weight matrix(const std::string& name, std::size_t rows, std::size_t cols, WeightMode mode, std::size_t row0 = 0,
                std::size_t total = 0) const {
    if (total == 0) total = rows;
    const auto it = map_.find(name);
    if (mode != WeightMode::f32 && it != map_.end() && (it->second.dtype != "F32" || it->second.begin % 4 == 0)) {
      const TensorInfo& t = it->second;
      check_shape(t, name, {total, cols});
      const GgmlTypeInfo& type = *ggml_type_info(t.dtype == "F32" ? 0 : t.dtype == "F16" ? 1 : 30);
      auto& mapped = mapped_[t.file];
      if (!mapped) mapped = std::make_shared<MappedFile>(t.file);
      const std::uint8_t* data = mapped->data() + t.begin + row0 * cols * type.bytes;
      if (const std::size_t bad = ggml_first_nonfinite(type, data, rows * cols); bad < rows * cols) {
        throw CorruptData("non-finite weight", {t.file, name + "[" + std::to_string(row0 * cols + bad) + "]"});
      }
      return Weight::encoded(rows, cols, type, data, mapped);
    }
    const std::vector<float> v = read(name, {total, cols});
    RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    std::memcpy(m.data(), v.data() + row0 * cols, rows * cols * sizeof(float));
    return m;
  }

 private:
  std::string dir_;
  std::map<std::string, TensorInfo> map_;
  mutable std::map<std::string, std::shared_ptr<MappedFile>> mapped_;  // shard -> its map
};

// Gemma 2 and 3's attention and MLP (their layers' windows: hf_layer_windows): Gemma 3's local layers rotate
// with rope_local_base_freq (default 10000) and no rope_scaling; logits scaled by
// query_pre_attn_scalar^-0.5 (default 256); Gemma 2's attention and final logit soft-capping
// (defaults 50 and 30), Gemma 3's final one when set; GeGLU, embeddings times sqrt(hidden_size)
// (transformers' Gemma2Config / Gemma3TextConfig defaults).
void gemma_layers(const HfConfig& j, ModelConfig& c) {
  const bool gemma2 = j.model_type == "gemma2";
  if (!gemma2) c.rope_theta_local = j.rope_local_base_freq.value_or(10000.0);
  const double qpas = j.query_pre_attn_scalar.value_or(256.0);
  if (qpas != static_cast<double>(c.head_dim)) c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  c.activation = ModelConfig::Activation::gelu_tanh;
  c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  c.final_softcap = static_cast<float>(j.final_logit_softcapping.value_or(gemma2 ? 30.0 : 0.0));
  c.attn_softcap = static_cast<float>(j.attn_logit_softcapping.value_or(gemma2 ? 50.0 : 0.0));
}

// Gemma 2 and Gemma 3 (text): sandwich norms, RMSNorm weights as 1 + w, GELU MLPs.
bool gemma_type(const std::string& model_type) { return model_type == "gemma3_text" || model_type == "gemma2"; }

// An RMSNorm weight [n]; Gemma's RMSNorm multiplies by (1 + w): the stored w plus 1 in f32, as
// transformers computes it.
std::vector<float> hf_norm(const Tensors& t, const std::string& name, std::size_t n, bool gemma) {
  std::vector<float> v = t.read(name, {n});
  if (gemma) {
    for (float& x : v) x = 1.0f + x;
  }
  return v;
}

// The model's shape, attention and RoPE from config.json (j), checked.
ModelConfig hf_model_config(const HfConfig& j, const std::string& dir) {
  const std::string& cfg_path = j.file;
  const std::string& type = j.model_type;
  const bool gemma = gemma_type(type);
  if (gemma) {
    if (!j.hidden_activation.empty() && j.hidden_activation != "gelu_pytorch_tanh") {
      throw InvalidInput("Gemma's MLP is implemented with gelu_pytorch_tanh", {cfg_path, "hidden_activation", j.hidden_activation});
    }
  } else if (j.hidden_act != "silu") {
    throw InvalidInput("only silu MLPs are implemented", {cfg_path, "hidden_act", j.hidden_act});
  }
  if (!j.max_position_embeddings) {
    throw InvalidInput("config needs a positive integer", {cfg_path, "max_position_embeddings", "missing"});
  }
  ModelConfig c;
  c.name = fs::path(dir).filename().string();
  if (c.name.empty()) c.name = fs::path(dir).parent_path().filename().string();
  c.dim = j.hidden_size;
  c.hidden_dim = j.intermediate_size;
  c.n_layers = j.num_hidden_layers;
  c.n_heads = j.num_attention_heads;
  c.n_kv_heads = j.num_key_value_heads;
  c.vocab_size = j.vocab_size;
  c.seq_len = *j.max_position_embeddings;
  c.head_dim = j.head_dim;
  c.rope_theta = j.rope_theta;
  c.rope_scaling = hf_rope_scaling(j);
  c.rotary_dim = j.rotary_dim;
  c.norm_eps = static_cast<float>(j.rms_norm_eps);
  c.rope_layout = RopeLayout::rotate_half;
  c.qkv_bias = type == "qwen2" || j.attention_bias;  // qwen3: attention_bias (false in its configs)
  c.tokenizer = j.akv_tokenizer;
  if (!c.tokenizer.empty() && c.tokenizer != "bytes") {
    throw InvalidInput("unknown akv_tokenizer (akv knows bytes)", {cfg_path, "akv_tokenizer", c.tokenizer});
  }
  if (c.rope_scaling.kind == RopeScaling::Kind::dynamic || c.rope_scaling.kind == RopeScaling::Kind::yarn) {
    // Dynamic NTK and YaRN scaling exist to run past max_position_embeddings: up to factor times
    // it, capped at 2^62 positions (a factor of 1e300 does not fit a size_t; nothing is sized by
    // the context: it only bounds what a run may ask for).
    const double scaled = static_cast<double>(c.seq_len) * c.rope_scaling.factor;
    c.seq_len = scaled >= 0x1p62 ? std::size_t{1} << 62 : static_cast<std::size_t>(scaled);
  }
  c.layer_window = hf_layer_windows(j);
  if (gemma) gemma_layers(j, c);
  if (c.head_dim % 2 != 0) throw InvalidInput("head_dim must be even", {cfg_path, "head_dim", std::to_string(c.head_dim)});
  return c;
}

// Layer l's weights under the prefix m ("model." or a multimodal Gemma 3's); Phi-3's fused
// qkv_proj and gate_up_proj; Gemma's sandwich norms, each RMSNorm weight read as 1 + w.
LayerWeights hf_layer(const Tensors& t, const ModelConfig& c, const std::string& type, const std::string& m, std::size_t l,
                      WeightMode mode) {
  const bool gemma = gemma_type(type);
  const std::size_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const std::string p = m + "layers." + std::to_string(l) + ".";
  auto norm = [&](const std::string& name, std::size_t n) { return hf_norm(t, name, n, gemma); };
  LayerWeights lw;
  lw.attn_norm = norm(p + "input_layernorm.weight", c.dim);
  if (type == "phi3") {  // one qkv_proj: the q rows, then k, then v
    const std::string qkv = p + "self_attn.qkv_proj.weight";
    const std::size_t all = q_dim + 2 * kv_dim;
    lw.wq = t.matrix(qkv, q_dim, c.dim, mode, 0, all);
    lw.wk = t.matrix(qkv, kv_dim, c.dim, mode, q_dim, all);
    lw.wv = t.matrix(qkv, kv_dim, c.dim, mode, q_dim + kv_dim, all);
  } else {
    lw.wq = t.matrix(p + "self_attn.q_proj.weight", q_dim, c.dim, mode);
    lw.wk = t.matrix(p + "self_attn.k_proj.weight", kv_dim, c.dim, mode);
    lw.wv = t.matrix(p + "self_attn.v_proj.weight", kv_dim, c.dim, mode);
  }
  lw.wo = t.matrix(p + "self_attn.o_proj.weight", c.dim, q_dim, mode);
  if (c.qkv_bias) {
    lw.bq = t.read(p + "self_attn.q_proj.bias", {q_dim});
    lw.bk = t.read(p + "self_attn.k_proj.bias", {kv_dim});
    lw.bv = t.read(p + "self_attn.v_proj.bias", {kv_dim});
  }
  if (type == "qwen3" || type == "gemma3_text") {  // RMSNorm of each query and key head before RoPE
    lw.q_norm = norm(p + "self_attn.q_norm.weight", c.head_dim);
    lw.k_norm = norm(p + "self_attn.k_norm.weight", c.head_dim);
  }
  if (gemma) {  // sandwich norms: post_attention_layernorm normalizes the attention's output
    lw.post_attn_norm = norm(p + "post_attention_layernorm.weight", c.dim);
    lw.ffn_norm = norm(p + "pre_feedforward_layernorm.weight", c.dim);
    lw.post_ffn_norm = norm(p + "post_feedforward_layernorm.weight", c.dim);
  } else {
    lw.ffn_norm = t.read(p + "post_attention_layernorm.weight", {c.dim});
  }
  if (type == "phi3") {  // one gate_up_proj: the gate rows, then up (transformers' chunk(2))
    const std::string gu = p + "mlp.gate_up_proj.weight";
    lw.w1 = t.matrix(gu, c.hidden_dim, c.dim, mode, 0, 2 * c.hidden_dim);
    lw.w3 = t.matrix(gu, c.hidden_dim, c.dim, mode, c.hidden_dim, 2 * c.hidden_dim);
  } else {
    lw.w1 = t.matrix(p + "mlp.gate_proj.weight", c.hidden_dim, c.dim, mode);
    lw.w3 = t.matrix(p + "mlp.up_proj.weight", c.hidden_dim, c.dim, mode);
  }
  lw.w2 = t.matrix(p + "mlp.down_proj.weight", c.dim, c.hidden_dim, mode);
  return lw;
}

}  // namespace

Model load_hf(const std::string& dir, WeightMode mode) {
  const HfConfig j = read_hf_config(dir, supported_hf_model_types());
  ModelConfig c = hf_model_config(j, dir);
  const bool gemma = gemma_type(j.model_type);
  const Tensors t(dir);
  // The language model's tensor names: model.X, or a multimodal Gemma 3's (the layout of its
  // transformers version).
  std::string m = "model.";
  if (j.multimodal) {
    m = t.has("language_model.model.embed_tokens.weight") ? "language_model.model." : "model.language_model.";
  }
  const std::string head = j.multimodal && t.has("language_model.lm_head.weight") ? "language_model.lm_head.weight"
                                                                                 : "lm_head.weight";
  const bool tied = j.tie_word_embeddings || !t.has(head);
  ModelWeights w;
  w.embedding = t.matrix(m + "embed_tokens.weight", c.vocab_size, c.dim, mode);
  for (std::size_t l = 0; l < c.n_layers; ++l) w.layers.push_back(hf_layer(t, c, j.model_type, m, l, mode));
  w.final_norm = hf_norm(t, m + "norm.weight", c.dim, gemma);
  if (!tied) w.classifier = t.matrix(head, c.vocab_size, c.dim, mode);
  return Model(std::move(c), std::move(w));
}

}  // namespace akv
