// GGUF: ggml block dequantization against gguf-py (data/golden/ggml-dequant.json), and models
// written here as GGUF files (the test's own writer) against the same weights held in memory.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/core/rng.h"
#include "akv/io/token_file.h"
#include "akv/kv/runtime.h"
#include "akv/model/gguf.h"
#include "akv/model/load.h"
#include "akv/model/llama2c.h"
#include "akv/model/tokenizer.h"
#include "akv/tensor/fp8.h"
#include "akv/tensor/ggml_blocks.h"
#include "akv/tensor/ggml_quant.h"
#include "akv/tensor/half.h"
#include "akv/tensor/q8_dot.h"
#include "test_util.h"

using namespace akv;
using test::have_shared;
using test::shared_dir;

namespace {

std::vector<std::uint8_t> from_hex(const std::string& h) {
  std::vector<std::uint8_t> out(h.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

// A GGUF v3 writer (little-endian, as the format is).
class GgufWriter {
 public:
  void u32(const std::string& key, std::uint32_t v) { kv(key, 4, &v, 4); }
  void f32(const std::string& key, float v) { kv(key, 6, &v, 4); }
  void u64(const std::string& key, std::uint64_t v) { kv(key, 10, &v, 8); }
  void boolean(const std::string& key, bool v) {
    const std::uint8_t b = v ? 1 : 0;
    kv(key, 7, &b, 1);
  }
  void str(const std::string& key, const std::string& v) {
    std::string b = len(v.size()) + v;
    kv(key, 8, b.data(), b.size());
  }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    std::string b = raw("\x08\0\0\0", 4) + len(v.size());
    for (const std::string& x : v) b += len(x.size()) + x;
    kv(key, 9, b.data(), b.size());
  }
  template <class T>
  void numbers(const std::string& key, std::uint32_t type, const std::vector<T>& v) {
    std::string b = raw(&type, 4) + len(v.size()) + raw(v.data(), v.size() * sizeof(T));
    kv(key, 9, b.data(), b.size());
  }
  // type = ggml id; data = the stored bytes; dims in ggml order.
  void tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type, std::vector<std::uint8_t> data) {
    tensors_.push_back({name, std::move(dims), type, std::move(data)});
  }
  void tensor_f32(const std::string& name, std::vector<std::uint64_t> dims, const float* x, std::size_t n) {
    std::vector<std::uint8_t> b(n * 4);
    std::memcpy(b.data(), x, b.size());
    tensor(name, std::move(dims), 0, std::move(b));
  }
  std::string bytes(std::uint32_t version = 3, std::uint64_t alignment = 32) const {
    std::string out = "GGUF";
    out += raw(&version, 4);
    const std::uint64_t nt = tensors_.size(), nk = kv_count_;
    out += raw(&nt, 8) + raw(&nk, 8) + kvs_;
    std::uint64_t off = 0;
    std::vector<std::uint64_t> offsets;
    for (const auto& t : tensors_) {
      out += len(t.name.size()) + t.name;
      const auto nd = static_cast<std::uint32_t>(t.dims.size());
      out += raw(&nd, 4);
      for (std::uint64_t d : t.dims) out += raw(&d, 8);
      out += raw(&t.type, 4) + raw(&off, 8);
      offsets.push_back(off);
      off = (off + t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    const std::size_t data0 = out.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data0 + offsets[i], '\0');
      out.append(reinterpret_cast<const char*>(tensors_[i].data.data()), tensors_[i].data.size());
    }
    return out;
  }
  void write(const std::string& path) const { std::ofstream(path, std::ios::binary) << bytes(); }

 private:
  struct T {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type;
    std::vector<std::uint8_t> data;
  };
  static std::string raw(const void* p, std::size_t n) { return std::string(static_cast<const char*>(p), n); }
  static std::string len(std::uint64_t n) { return raw(&n, 8); }
  void kv(const std::string& key, std::uint32_t type, const void* v, std::size_t n) {
    kvs_ += len(key.size()) + key + raw(&type, 4) + raw(v, n);
    ++kv_count_;
  }
  std::string kvs_;
  std::uint64_t kv_count_ = 0;
  std::vector<T> tensors_;
};

// Q8_0 blocks of x (n a multiple of 32): d = max |x| / 127 in f16, q = round(x / d).
std::vector<std::uint8_t> q8_0(const float* x, std::size_t n) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const std::uint16_t dh = f32_to_f16_ref(amax / 127.0f);
    const float d = f16_to_f32_ref(dh);
    out.push_back(static_cast<std::uint8_t>(dh & 0xFF));
    out.push_back(static_cast<std::uint8_t>(dh >> 8));
    for (std::size_t j = 0; j < 32; ++j) {
      const long q = d > 0 ? std::lround(x[b + j] / d) : 0;
      out.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(std::clamp(q, -127L, 127L))));
    }
  }
  return out;
}

// Random K-quant super-blocks (every byte random, the f16 scales small and finite).
std::vector<std::uint8_t> random_kquant(const GgmlTypeInfo& t, std::size_t blocks, Rng& rng) {
  std::vector<std::uint8_t> out(blocks * t.bytes);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng.below(256));
  const std::vector<std::size_t> scale_at = t.id == 14 ? std::vector<std::size_t>{208} : std::vector<std::size_t>{0, 2};
  for (std::size_t k = 0; k < blocks; ++k) {
    for (std::size_t at : scale_at) {
      const std::uint16_t h = f32_to_f16_ref(static_cast<float>(0.002 * rng.normal()));
      out[k * t.bytes + at] = static_cast<std::uint8_t>(h & 0xFF);
      out[k * t.bytes + at + 1] = static_cast<std::uint8_t>(h >> 8);
    }
  }
  return out;
}

struct Stored {
  std::uint32_t type;
  std::vector<std::uint8_t> bytes;
};

// Writes a model's weights as GGUF (`store` picks each matrix's type and bytes), and returns the
// weights as akv must read them back (each matrix dequantized from those bytes).
ModelWeights write_model(const ModelConfig& c, const ModelWeights& w, const std::string& arch, const std::string& path,
                         const std::function<Stored(const RowMatrix&)>& store) {
  GgufWriter g;
  g.str("general.architecture", arch);
  g.str("general.name", "test-" + arch);
  g.u32(arch + ".context_length", static_cast<std::uint32_t>(c.seq_len));
  g.u32(arch + ".embedding_length", static_cast<std::uint32_t>(c.dim));
  g.u32(arch + ".block_count", static_cast<std::uint32_t>(c.n_layers));
  g.u32(arch + ".feed_forward_length", static_cast<std::uint32_t>(c.hidden_dim));
  g.u32(arch + ".attention.head_count", static_cast<std::uint32_t>(c.n_heads));
  g.u32(arch + ".attention.head_count_kv", static_cast<std::uint32_t>(c.n_kv_heads));
  g.f32(arch + ".attention.layer_norm_rms_epsilon", c.norm_eps);
  g.f32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  ModelWeights back = w;
  auto mat = [&](const std::string& name, const Weight& w, Weight& back_w) {
    const RowMatrix& m = w.f32();
    RowMatrix& out = back_w.f32();
    const Stored s = store(m);
    g.tensor(name, {static_cast<std::uint64_t>(m.cols()), static_cast<std::uint64_t>(m.rows())}, s.type, s.bytes);
    ggml_dequantize(*ggml_type_info(s.type), s.bytes.data(), static_cast<std::size_t>(m.size()), out.data());
  };
  auto vec = [&](const std::string& name, const std::vector<float>& v) { g.tensor_f32(name, {v.size()}, v.data(), v.size()); };
  mat("token_embd.weight", w.embedding, back.embedding);
  vec("output_norm.weight", w.final_norm);
  if (!w.classifier.empty()) mat("output.weight", w.classifier, back.classifier);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const LayerWeights& lw = w.layers[l];
    LayerWeights& lb = back.layers[l];
    vec(p + "attn_norm.weight", lw.attn_norm);
    vec(p + "ffn_norm.weight", lw.ffn_norm);
    mat(p + "attn_q.weight", lw.wq, lb.wq);
    mat(p + "attn_k.weight", lw.wk, lb.wk);
    mat(p + "attn_v.weight", lw.wv, lb.wv);
    mat(p + "attn_output.weight", lw.wo, lb.wo);
    mat(p + "ffn_gate.weight", lw.w1, lb.w1);
    mat(p + "ffn_down.weight", lw.w2, lb.w2);
    mat(p + "ffn_up.weight", lw.w3, lb.w3);
    if (!lw.bq.empty()) {
      vec(p + "attn_q.bias", lw.bq);
      vec(p + "attn_k.bias", lw.bk);
      vec(p + "attn_v.bias", lw.bv);
    }
  }
  g.write(path);
  return back;
}

Stored as_f32(const RowMatrix& m) {
  std::vector<std::uint8_t> b(static_cast<std::size_t>(m.size()) * 4);
  std::memcpy(b.data(), m.data(), b.size());
  return {0, b};
}

Stored as_16bit(const RowMatrix& m, std::uint32_t type, std::uint16_t (*convert)(float)) {
  std::vector<std::uint8_t> b(static_cast<std::size_t>(m.size()) * 2);
  for (std::size_t i = 0; i < b.size() / 2; ++i) {
    const std::uint16_t h = convert(m.data()[i]);
    b[2 * i] = static_cast<std::uint8_t>(h & 0xFF);
    b[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
  }
  return {type, b};
}

RowMatrix random_matrix(std::size_t rows, std::size_t cols, Rng& rng, double scale) {
  RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(scale * rng.normal());
  return m;
}

std::vector<float> random_vector(std::size_t n, Rng& rng, double mean, double scale) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + scale * rng.normal());
  return v;
}

// A random model of the given shape (weights small enough for stable logits).
Model random_model(ModelConfig c, std::uint64_t seed, bool bias) {
  Rng rng(seed);
  ModelWeights w;
  const std::size_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  w.embedding = random_matrix(c.vocab_size, c.dim, rng, 0.5);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = random_vector(c.dim, rng, 1.0, 0.1);
    lw.ffn_norm = random_vector(c.dim, rng, 1.0, 0.1);
    lw.wq = random_matrix(q, c.dim, rng, 0.1);
    lw.wk = random_matrix(kv, c.dim, rng, 0.1);
    lw.wv = random_matrix(kv, c.dim, rng, 0.1);
    lw.wo = random_matrix(c.dim, q, rng, 0.1);
    lw.w1 = random_matrix(c.hidden_dim, c.dim, rng, 0.1);
    lw.w2 = random_matrix(c.dim, c.hidden_dim, rng, 0.1);
    lw.w3 = random_matrix(c.hidden_dim, c.dim, rng, 0.1);
    if (bias) {
      lw.bq = random_vector(q, rng, 0.0, 0.1);
      lw.bk = random_vector(kv, rng, 0.0, 0.1);
      lw.bv = random_vector(kv, rng, 0.0, 0.1);
    }
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = random_vector(c.dim, rng, 1.0, 0.1);
  c.qkv_bias = bias;
  return Model(std::move(c), std::move(w));
}

ModelConfig shape(std::size_t dim, std::size_t hidden, std::size_t heads, std::size_t kv, std::size_t vocab, RopeLayout layout) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = 2;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.head_dim = dim / heads;
  c.vocab_size = vocab;
  c.seq_len = 64;
  c.rope_layout = layout;
  return c;
}

const std::vector<std::int32_t> kTokens = {1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12};

// Weights kept as stored (converted per tile inside each product) give the logits of the f32
// path within float rounding: relative to the largest logit.
void check_close(const RowMatrix& got, const RowMatrix& want) {
  const double scale = std::max(1.0, static_cast<double>(want.cwiseAbs().maxCoeff()));
  const double diff = (got - want).cwiseAbs().maxCoeff();
  INFO("max abs logit difference " << diff << " (largest logit " << scale << ")");
  CHECK(diff <= 1e-4 * scale);
}

// Block-type weights loaded with WeightMode::q8 multiply against activations rounded to 8-bit blocks
// (tensor/q8_dot.h; the product itself is checked bit for bit below and in test_tensor.cpp):
// the logits move with that rounding, carried through every layer. Relative RMS difference
// from the exact f32 logits: 1.8-5.8% on the models below (2026-12-02), where a misread code or
// scale gives differences of the order of the logits themselves.
constexpr double kQ8LogitRms = 0.1;
// Decode steps after a 4-token prompt (full caches) of `q8` against `exact`, positions 4 .. 11 of
// seq: the relative RMS difference of all their logits.
double q8_decode_rms(const Model& q8, const Model& exact, const std::vector<std::int32_t>& seq) {
  const KvGeometry geo{exact.config().kv_shape(), exact.config().seq_len};
  const std::vector<std::int32_t> prompt(seq.begin(), seq.begin() + 4);
  auto c_q8 = make_kv_policy(std::nullopt, geo), c_exact = make_kv_policy(std::nullopt, geo);
  for (auto [model, cache] : {std::pair{&q8, c_q8.get()}, std::pair{&exact, c_exact.get()}}) {
    const PrefillResult pre = model->prefill(prompt, false);
    cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt.size()});
  }
  double diff = 0, norm = 0;
  for (std::size_t pos = 4; pos < 12; ++pos) {
    const std::vector<float> a = q8.decode(seq[pos], pos, *c_q8), b = exact.decode(seq[pos], pos, *c_exact);
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      norm += static_cast<double>(b[i]) * b[i];
    }
  }
  return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("ggml blocks: dequantization equals gguf-py bit for bit", "[gguf][golden]") {
  // scripts/dev/golden/ggml_dequant.py GGUF_PY_DIR data/golden/ggml-dequant.json
  std::ifstream in(std::string(AKV_SOURCE_DIR) + "/data/golden/ggml-dequant.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  REQUIRE(g["types"].size() == 10);
  for (const nlohmann::json& t : g["types"]) {
    const GgmlTypeInfo* info = ggml_type_info(t["id"].get<std::uint32_t>());
    REQUIRE(info);
    INFO(t["type"].get<std::string>());
    CHECK(std::string(info->name) == t["type"].get<std::string>());
    const std::vector<std::uint8_t> blocks = from_hex(t["blocks"].get<std::string>());
    const std::vector<std::uint8_t> want = from_hex(t["values"].get<std::string>());  // big-endian f32 bits
    const std::size_t n = t["n"].get<std::size_t>();
    REQUIRE(blocks.size() == n / info->block * info->bytes);
    std::vector<float> got(n);
    ggml_dequantize(*info, blocks.data(), n, got.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &got[i], 4);
      const std::uint32_t w = (std::uint32_t{want[4 * i]} << 24) | (std::uint32_t{want[4 * i + 1]} << 16) |
                              (std::uint32_t{want[4 * i + 2]} << 8) | want[4 * i + 3];
      differ += bits != w;
    }
    CHECK(differ == 0);
  }
  CHECK(ggml_type_info(10) == nullptr);  // Q2_K: not read
  CHECK(ggml_type_name(10) == "type 10");
}

namespace {

// Every type of a golden quantize file (akv-golden-ggml-quantize): akv's blocks equal the
// reference's byte for byte, and dequantize to within a step of their input.
void check_quantize_golden(const std::string& file, std::size_t n_types) {
  std::ifstream in(std::string(AKV_SOURCE_DIR) + "/data/golden/" + file);
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const std::vector<std::uint8_t> raw = from_hex(g["input"].get<std::string>());
  const std::size_t n = g["n"].get<std::size_t>();
  REQUIRE(raw.size() == 4 * n);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t w = (std::uint32_t{raw[4 * i]} << 24) | (std::uint32_t{raw[4 * i + 1]} << 16) |
                            (std::uint32_t{raw[4 * i + 2]} << 8) | raw[4 * i + 3];
    std::memcpy(&x[i], &w, 4);
  }
  REQUIRE(g["types"].size() == n_types);
  for (const nlohmann::json& t : g["types"]) {
    const GgmlTypeInfo* info = ggml_type_info_by_name(t["type"].get<std::string>());
    REQUIRE(info);
    INFO(file << " " << info->name);
    REQUIRE(ggml_can_quantize(*info));
    const std::vector<std::uint8_t> want = from_hex(t["blocks"].get<std::string>());
    std::vector<std::uint8_t> got(n / info->block * info->bytes);
    REQUIRE(got.size() == want.size());
    ggml_quantize(*info, x.data(), n, got.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    CHECK(differ == 0);
    // Dequantized, every value lies within one step (d) of its input; Q8_0 within d / 2; IQ4_NL
    // within 20 / 127 of max|x| (its widest level gap is 24 / 127; the refitted scale stretches it).
    std::vector<float> back(n);
    ggml_dequantize(*info, got.data(), n, back.data());
    for (std::size_t b = 0; b < n / 32; ++b) {
      float lo = x[32 * b], hi = x[32 * b];
      for (std::size_t j = 0; j < 32; ++j) {
        lo = std::min(lo, x[32 * b + j]);
        hi = std::max(hi, x[32 * b + j]);
      }
      const float amax = std::max(std::fabs(lo), std::fabs(hi));
      const float step = info->id == 8 ? amax / 127.0f : info->id == 2 ? amax / 8.0f : info->id == 6 ? amax / 16.0f
                         : info->id == 20 ? amax * 20.0f / 127.0f
                         : info->id == 3 ? (hi - lo) / 15.0f : (hi - lo) / 31.0f;
      for (std::size_t j = 0; j < 32; ++j) CHECK(std::fabs(back[32 * b + j] - x[32 * b + j]) <= 1.01f * step + 1e-6f * amax);
    }
  }
}

}  // namespace

TEST_CASE("ggml quantizers (KV cache types): blocks equal gguf-py's reference quantizers byte for byte", "[gguf][golden]") {
  // scripts/dev/golden/ggml_dequant.py GGUF_PY_DIR data/golden/ggml-dequant.json --quantize data/golden/ggml-quantize.json
  check_quantize_golden("ggml-quantize.json", 5);
}

TEST_CASE("ggml quantizers: blocks equal ggml's C reference quantizers byte for byte, IQ4_NL included", "[gguf][golden]") {
  // scripts/dev/golden/ggml_quant_ref.py GGML_SRC GGML_BUILD data/golden/ggml-quantize-ref.json (ggml d99724f)
  check_quantize_golden("ggml-quantize-ref.json", 6);
}

TEST_CASE("IQ4_NL blocks by hand", "[gguf]") {
  // Largest magnitude -2.54 at element 0: scale -2.54 / -127 = 0.02, element j = 0.02 * level
  // exactly for levels picked from kIq4nlValues, so the refit keeps d = 0.02 and the codes.
  const GgmlTypeInfo* t = ggml_type_info_by_name("IQ4_NL");
  REQUIRE(t);
  CHECK(t->id == 20);
  CHECK(t->bytes == 18);
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(j)] = 0.02f * static_cast<float>(kIq4nlValues[j % 16]);
  x[0] = -2.54f;
  std::vector<std::uint8_t> b(18);
  ggml_quantize(*t, x.data(), 32, b.data());
  for (int j = 0; j < 16; ++j) CHECK(b[static_cast<std::size_t>(2 + j)] == (j | (j << 4)));  // codes j and j (element j + 16)
  std::vector<float> back(32);
  ggml_dequantize(*t, b.data(), 32, back.data());
  for (std::size_t j = 0; j < 32; ++j) CHECK(std::fabs(back[j] - x[j]) <= 1e-3f * 2.54f);
}

TEST_CASE("ggml_first_nonfinite: the first Inf or NaN of F32, F16 and BF16 rows, across scan chunks", "[gguf]") {
  const std::size_t n = 10000;  // past two 4096-value chunks
  std::vector<float> f32(n, 1.5f);
  std::vector<std::uint16_t> f16(n, f32_to_f16_ref(1.5f)), bf16(n, 0x3FC0);  // 1.5
  auto first = [&](const char* name, const void* p) {
    return ggml_first_nonfinite(*ggml_type_info_by_name(name), static_cast<const std::uint8_t*>(p), n);
  };
  CHECK(first("F32", f32.data()) == n);
  CHECK(first("F16", f16.data()) == n);
  CHECK(first("BF16", bf16.data()) == n);
  f32[9001] = std::numeric_limits<float>::infinity();
  f16[9001] = 0x7C00;  // +Inf
  bf16[9001] = 0xFF80;  // -Inf
  CHECK(first("F32", f32.data()) == 9001);
  CHECK(first("F16", f16.data()) == 9001);
  CHECK(first("BF16", bf16.data()) == 9001);
  f32[4100] = std::numeric_limits<float>::quiet_NaN();
  f16[4100] = 0x7E00;  // NaN
  bf16[4100] = 0x7FC1;  // NaN
  CHECK(first("F32", f32.data()) == 4100);
  CHECK(first("F16", f16.data()) == 4100);
  CHECK(first("BF16", bf16.data()) == 4100);
  f32[4099] = 65504.0f * 65504.0f * 65504.0f;  // large but finite
  f16[4099] = 0x7BFF;  // the largest finite f16
  CHECK(first("F32", f32.data()) == 4100);
  CHECK(first("F16", f16.data()) == 4100);
}

TEST_CASE("ggml_first_nonfinite: fp8 rows, every code against its decoded value", "[gguf][fp8]") {
  for (const char* name : {"FP8_E4M3", "FP8_E5M2"}) {
    const GgmlTypeInfo& t = *ggml_type_info_by_name(name);
    const Fp8Format f = *fp8_format_of(t);
    for (unsigned c = 0; c < 256; ++c) {
      const std::uint8_t row[3] = {0x10, static_cast<std::uint8_t>(c), 0x20};
      INFO(name << " code " << c);
      CHECK(ggml_first_nonfinite(t, row, 3) == (std::isfinite(fp8_decode(row[1], f)) ? 3u : 1u));
    }
  }
}

TEST_CASE("ggml quantizers: only the cache types", "[gguf]") {
  const GgmlTypeInfo* q4k = ggml_type_info_by_name("Q4_K");
  CHECK_FALSE(ggml_can_quantize(*q4k));
}

TEST_CASE("ggml blocks: the AVX2 dequantizers give the plain loops' bits", "[gguf]") {
  // Random bytes for every field (codes, 5th bits), random finite scales and minimums of either
  // sign, subnormal ones among them.
  Rng rng(17);
  for (const char* name : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q6_K"}) {
    const GgmlTypeInfo& t = *ggml_type_info_by_name(name);
    const std::size_t blocks = 37, n = blocks * t.block;
    std::vector<std::uint8_t> b(blocks * t.bytes);
    for (auto& x : b) x = static_cast<std::uint8_t>(rng.next());
    for (std::size_t k = 0; k < blocks; ++k) {
      for (std::size_t f = 0; f < (t.block == 32 ? 2u : 0u); ++f) {  // d (and m): finite f16
        std::uint16_t h = static_cast<std::uint16_t>(rng.next());
        if ((h & 0x7C00) == 0x7C00) h &= 0x83FF;  // exponent cleared: a subnormal
        std::memcpy(b.data() + k * t.bytes + 2 * f, &h, 2);
      }
    }
    std::vector<float> plain(n), vec(n);
    set_isa(Isa::generic);
    ggml_dequantize(t, b.data(), n, plain.data());
    set_isa(best_isa());
    ggml_dequantize(t, b.data(), n, vec.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t x, y;
      std::memcpy(&x, &plain[i], 4);
      std::memcpy(&y, &vec[i], 4);
      differ += x != y;
    }
    INFO(name);
    CHECK(differ == 0);
  }
}

TEST_CASE("ggml blocks: hand-computed values", "[gguf]") {
  auto one = [](std::uint32_t type, const std::vector<std::uint8_t>& b) {
    const GgmlTypeInfo& t = *ggml_type_info(type);
    REQUIRE(b.size() == t.bytes);
    std::vector<float> y(t.block);
    ggml_dequantize(t, b.data(), t.block, y.data());
    return y;
  };
  std::vector<std::uint8_t> q4_0(18, 0x88);  // every code 8: value 0
  q4_0[0] = 0x00, q4_0[1] = 0x38;            // d = 0.5
  q4_0[2] = 0x9F;                            // element 0: 15 - 8 = 7; element 16: 9 - 8 = 1
  auto y = one(2, q4_0);
  CHECK(y[0] == 3.5f);
  CHECK(y[16] == 0.5f);
  CHECK(y[1] == 0.0f);
  std::vector<std::uint8_t> q8_0(34, 0);
  q8_0[1] = 0x34;                            // d = 0.25
  q8_0[2] = static_cast<std::uint8_t>(-3);
  CHECK(one(8, q8_0)[0] == -0.75f);
  std::vector<std::uint8_t> q4_k(144, 0);
  q4_k[1] = 0x3C, q4_k[3] = 0x38;            // d = 1, dmin = 0.5
  q4_k[4 + 0] = 2, q4_k[4 + 1] = 1, q4_k[4 + 4] = 3;  // group 0: scale 2, min 3; group 1: scale 1
  q4_k[4 + 8] = 0x13;                        // group 4: scale 3, min 1
  q4_k[16 + 0] = 0x75;                       // element 0 (group 0): 5; element 32 (group 1): 7
  q4_k[16 + 64] = 0x04;                      // element 128 (group 4, low nibble): 4
  y = one(12, q4_k);
  CHECK(y[0] == 8.5f);    // 1 * 2 * 5 - 0.5 * 3
  CHECK(y[32] == 7.0f);   // 1 * 1 * 7 - 0
  CHECK(y[128] == 11.5f); // 1 * 3 * 4 - 0.5 * 1
  CHECK(y[1] == -1.5f);   // code 0: - 0.5 * 3
  std::vector<std::uint8_t> q6_k(210, 0);
  q6_k[208] = 0x00, q6_k[209] = 0x40;        // d = 2
  q6_k[192] = static_cast<std::uint8_t>(-1); // scale of elements 0..15
  q6_k[0] = 0x0A, q6_k[128] = 0x02;          // element 0: 10 | 2 << 4 = 42 -> 42 - 32 = 10
  CHECK(one(14, q6_k)[0] == -20.0f);
}

TEST_CASE("GGUF llama: stories260K as GGUF gives llama2.c's logits bit for bit (F32, F16, BF16, Q8_0)", "[gguf][model]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  test::TempDir dir;
  const Model ref = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::int32_t> seq(lines[0].begin(), lines[0].begin() + 48);
  const std::map<std::string, std::function<Stored(const RowMatrix&)>> stores = {
      {"F32", as_f32},
      {"F16", [](const RowMatrix& m) { return as_16bit(m, 1, f32_to_f16_ref); }},
      {"BF16", [](const RowMatrix& m) { return as_16bit(m, 30, f32_to_bf16_ref); }},
      {"Q8_0", [](const RowMatrix& m) {
         // Rows whose length is not a multiple of 32 stay F32, as llama.cpp's converters do.
         if (m.cols() % 32 != 0) return as_f32(m);
         return Stored{8, q8_0(m.data(), static_cast<std::size_t>(m.size()))};
       }}};
  for (const auto& [name, store] : stores) {
    INFO(name);
    const std::string path = dir.file(name + ".gguf");
    const ModelWeights back = write_model(ref.config(), ref.weights(), "llama", path, store);
    const Model g = load_model(path, WeightMode::f32);
    CHECK(g.config().rope_layout == RopeLayout::interleaved);
    CHECK(g.config().name == "test-llama");
    CHECK(g.config().n_kv_heads == ref.config().n_kv_heads);
    const Model expect(ref.config(), back);
    const RowMatrix got = g.prefill(seq, true).logits;
    CHECK(got == expect.prefill(seq, true).logits);
    if (name == "F32") CHECK(got == ref.prefill(seq, true).logits);
    // Kept as stored (F32 included: multiplied in place in the memory map, not copied): the
    // matrices keep their type, and every product runs the same fixed-order kernel over the
    // same f32 values, so the logits are the same bits.
    const Model s = load_model(path);
    CHECK(s.weights().layers[0].wq.dtype() == (name == "Q8_0" ? "Q8_0" : name));
    CHECK(!s.weights().layers[0].wq.is_f32());
    CHECK(s.prefill(seq, true).logits == got);
    if (name == "Q8_0") {
      // --weights q8: the prompt's products stay exact; decode steps multiply in integers
      // against 8-bit activations, within their rounding.
      const Model q = load_model(path, WeightMode::q8);
      CHECK(q.weights().layers[0].wq.q8_products());
      CHECK(q.prefill(seq, true).logits == got);
      CHECK(q8_decode_rms(q, g, seq) < kQ8LogitRms);
    }
    // Decode steps (tiles converted inside each product) after a 4-token prompt, full cache.
    const KvGeometry geo{g.config().kv_shape(), g.config().seq_len};
    const std::vector<std::int32_t> prompt(seq.begin(), seq.begin() + 4);
    auto c_f32 = make_kv_policy(std::nullopt, geo), c_stored = make_kv_policy(std::nullopt, geo);
    for (auto [model, cache] : {std::pair{&g, c_f32.get()}, std::pair{&s, c_stored.get()}}) {
      const PrefillResult pre = model->prefill(prompt, false);
      cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt.size()});
    }
    for (std::size_t pos = 4; pos < 12; ++pos) {
      CHECK(g.decode(seq[pos], pos, *c_f32) == s.decode(seq[pos], pos, *c_stored));
    }
  }
}

TEST_CASE("q8 block-type weights: times_rows is q8_dot's product of all rows, for any batch and thread count", "[gguf][q8]") {
  // 300 rows: tiles of 128 rows (65536 / 512) and a partial one; Q8_0 from the test's quantizer,
  // K-quants from random blocks.
  Rng rng(17);
  const std::size_t rows = 300, cols = 512, batch = 5;
  std::vector<float> dense(rows * cols), x(batch * cols);
  for (auto& v : dense) v = static_cast<float>(0.05 * rng.normal());
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (const char* name : {"Q8_0", "Q4_K", "Q6_K"}) {
    INFO(name);
    const GgmlTypeInfo& t = *ggml_type_info_by_name(name);
    const auto bytes = std::make_shared<std::vector<std::uint8_t>>(
        t.id == 8 ? q8_0(dense.data(), dense.size()) : random_kquant(t, rows * cols / 256, rng));
    const Weight w = Weight::encoded(rows, cols, t, bytes->data(), bytes, true);
    REQUIRE(w.q8_products());
    Q8Tile tile;
    q8_decode(t, bytes->data(), rows, cols, tile);
    Q8Vectors xq;
    q8_quantize(x.data(), batch, cols, cols, xq);
    std::vector<float> want(batch * rows);
    q8_rows_ref(tile, xq, want.data(), rows);
    for (const int threads : {1, 2, 3}) {
      std::vector<float> y(batch * rows);
      w.times_rows(x.data(), batch, cols, y.data(), rows, threads);
      CHECK(y == want);
    }
    std::vector<float> one(rows);
    w.times_rows(x.data() + 3 * cols, 1, cols, one.data(), rows, 2);
    CHECK(std::equal(one.begin(), one.end(), want.begin() + 3 * static_cast<std::ptrdiff_t>(rows)));
  }
}

TEST_CASE("GGUF qwen2 (NeoX RoPE, q/k/v biases) and K-quants: logits equal the same weights in memory", "[gguf][model]") {
  test::TempDir dir;
  const Model qwen = random_model(shape(64, 96, 4, 2, 40, RopeLayout::rotate_half), 3, true);
  const ModelWeights back = write_model(qwen.config(), qwen.weights(), "qwen2", dir.file("q.gguf"), as_f32);
  const Model g = load_model(dir.file("q.gguf"), WeightMode::f32);
  CHECK(g.config().rope_layout == RopeLayout::rotate_half);
  CHECK(g.config().qkv_bias);
  CHECK(g.prefill(kTokens, true).logits == qwen.prefill(kTokens, true).logits);
  // Q4_K, Q5_K, Q6_K super-blocks of 256: every matrix has rows of 256 or 512 values.
  Rng rng(9);
  for (std::uint32_t type : {12u, 13u, 14u}) {
    const GgmlTypeInfo& t = *ggml_type_info(type);
    INFO(t.name);
    const Model m = random_model(shape(256, 512, 4, 2, 32, RopeLayout::interleaved), type, false);
    const ModelWeights w = write_model(m.config(), m.weights(), "llama", dir.file("k.gguf"), [&](const RowMatrix& x) {
      if (x.cols() % 256 != 0) return as_f32(x);
      return Stored{type, random_kquant(t, static_cast<std::size_t>(x.size()) / 256, rng)};
    });
    const Model expect(m.config(), w);
    const RowMatrix want = expect.prefill(kTokens, true).logits;
    CHECK(load_model(dir.file("k.gguf"), WeightMode::f32).prefill(kTokens, true).logits == want);
    const Model stored = load_model(dir.file("k.gguf"));
    CHECK(stored.weights().layers[1].w2.dtype() == t.name);
    CHECK(stored.weights().bytes() < expect.weights().bytes() / 4);
    check_close(stored.prefill(kTokens, true).logits, want);
    CHECK(q8_decode_rms(load_model(dir.file("k.gguf"), WeightMode::q8), expect, kTokens) < kQ8LogitRms);
  }
}

TEST_CASE("GGUF rope metadata: linear scaling, rope_freqs, partial rotation", "[gguf][model]") {
  test::TempDir dir;
  const Model m = random_model(shape(64, 96, 4, 4, 40, RopeLayout::interleaved), 4, false);
  const std::string base = dir.file("base.gguf");
  write_model(m.config(), m.weights(), "llama", base, as_f32);
  const Model plain = load_model(base);
  CHECK(plain.config().rope_scaling.kind == RopeScaling::Kind::none);
  CHECK(plain.config().rotary_dim == 0);
  // The same file with rope.scaling.type linear (factor 4), rope.dimension_count 8 and rope_freqs.
  GgufFile f(base);
  CHECK(f.version() == 3);
  CHECK(f.metadata().at("llama.embedding_length") == 64);
  CHECK(f.find("blk.1.ffn_up.weight")->dims == std::vector<std::uint64_t>{64, 96});
  // Copies of base.gguf's llama.* numbers and tensors, to which each variant adds its rope keys.
  auto copy_metadata = [&](GgufWriter& w) {
    w.str("general.architecture", "llama");
    for (const auto& [k, v] : f.metadata().items()) {
      if (k.rfind("llama.", 0) == 0 && v.is_number_unsigned()) w.u32(k, v.get<std::uint32_t>());
      if (k.rfind("llama.", 0) == 0 && v.is_number_float()) w.f32(k, v.get<float>());
    }
  };
  auto copy_tensors = [&](GgufWriter& w) {
    for (const auto& [name, t] : f.tensors()) {
      const std::vector<float> x = f.read(name, t.dims);
      w.tensor_f32(name, t.dims, x.data(), x.size());
    }
  };
  GgufWriter w2;
  copy_metadata(w2);
  w2.str("llama.rope.scaling.type", "linear");
  w2.f32("llama.rope.scaling.factor", 4.0f);
  w2.u32("llama.rope.dimension_count", 8);
  const std::vector<float> factors = {1.0f, 2.0f, 4.0f, 8.0f};
  w2.tensor_f32("rope_freqs.weight", {4}, factors.data(), 4);
  copy_tensors(w2);
  w2.write(dir.file("rope.gguf"));
  const Model r = load_model(dir.file("rope.gguf"));
  const ModelConfig& c = r.config();
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::linear);
  CHECK(c.rope_scaling.factor == 4.0);
  CHECK(c.rope_scaling.freq_factors == factors);
  CHECK(c.rotary_dim == 8);
  // inv_freq: theta^(-2i/8) / 4 (linear) / factors[i].
  const std::vector<float> inv = rope_inv_freq(8, c.rope_theta, c.rope_scaling, 1);
  const std::vector<float> plain_inv = rope_inv_freq(8, c.rope_theta, RopeScaling{}, 1);
  for (std::size_t i = 0; i < 4; ++i) CHECK(inv[i] == Approx(plain_inv[i] / 4.0f / factors[i]).epsilon(1e-6));
  CHECK(r.prefill(kTokens, true).logits != plain.prefill(kTokens, true).logits);

  // yarn (factor 4 over an original context of 4096: the ramp spans pairs 2..6), as llama.cpp
  // computes it (ggml_rope_yarn_corr_dims, rope_yarn's ramp), written out here independently of
  // akv's transformers-based code.
  GgufWriter w3;
  copy_metadata(w3);
  w3.str("llama.rope.scaling.type", "yarn");
  w3.f32("llama.rope.scaling.factor", 4.0f);
  w3.u32("llama.rope.scaling.original_context_length", 4096);
  copy_tensors(w3);
  w3.write(dir.file("yarn.gguf"));
  const Model y = load_model(dir.file("yarn.gguf"));
  const RopeScaling& ys = y.config().rope_scaling;
  CHECK(ys.kind == RopeScaling::Kind::yarn);
  CHECK(ys.original_max_positions == 4096);
  CHECK(ys.attention_factor == Approx(1.0 + 0.1 * std::log(4.0)).epsilon(1e-12));
  const std::size_t hd = y.config().head_dim;
  const double theta = y.config().rope_theta;
  auto corr = [&](double beta) { return hd * std::log(4096.0 / (beta * 2.0 * M_PI)) / (2.0 * std::log(theta)); };
  const double low = std::max(0.0, std::floor(corr(32.0))), high = std::min(static_cast<double>(hd - 1), std::ceil(corr(1.0)));
  const std::vector<float> yinv = rope_inv_freq(hd, theta, ys, 1);
  for (std::size_t i = 0; i < hd / 2; ++i) {
    const double extrap = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd)), interp = extrap / 4.0;
    const double mix = 1.0 - std::clamp((static_cast<double>(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
    INFO("pair " << i);
    CHECK(yinv[i] == Approx(interp * (1.0 - mix) + extrap * mix).epsilon(1e-6));
  }
  CHECK(y.prefill(kTokens, true).logits != plain.prefill(kTokens, true).logits);

  // longrope as llama.cpp's Phi-3 converter writes it: rope_factors_long / rope_factors_short,
  // rope.scaling.original_context_length and rope.scaling.attn_factor.
  const std::vector<float> long_f = {2, 2, 3, 3, 4, 4, 5, 5}, short_f = {1, 1, 1, 1, 2, 2, 2, 2};
  auto longrope = [&](bool both) {
    GgufWriter w4;
    copy_metadata(w4);
    w4.u32("llama.rope.scaling.original_context_length", 16);
    w4.f32("llama.rope.scaling.attn_factor", 1.25f);
    w4.tensor_f32("rope_factors_long.weight", {8}, long_f.data(), 8);
    if (both) w4.tensor_f32("rope_factors_short.weight", {8}, short_f.data(), 8);
    copy_tensors(w4);
    w4.write(dir.file("longrope.gguf"));
  };
  longrope(true);
  const Model lr = load_model(dir.file("longrope.gguf"));
  const RopeScaling& ls = lr.config().rope_scaling;
  CHECK(ls.kind == RopeScaling::Kind::longrope);
  CHECK(ls.original_max_positions == 16);
  CHECK(ls.attention_factor == 1.25);
  CHECK(ls.long_factors == long_f);
  CHECK(ls.short_factors == short_f);
  const std::vector<float> within = rope_inv_freq(16, lr.config().rope_theta, ls, 16);
  const std::vector<float> past = rope_inv_freq(16, lr.config().rope_theta, ls, 17);
  const std::vector<float> plain16 = rope_inv_freq(16, lr.config().rope_theta, RopeScaling{}, 1);
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(within[i] == Approx(plain16[i] / short_f[i]).epsilon(1e-6));
    CHECK(past[i] == Approx(plain16[i] / long_f[i]).epsilon(1e-6));
  }
  CHECK(lr.prefill(kTokens, true).logits != plain.prefill(kTokens, true).logits);
  longrope(false);
  try {
    load_model(dir.file("longrope.gguf"));
    FAIL("a GGUF with only the long factors was accepted");
  } catch (const InvalidInput& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("rope_factors_short.weight = missing"));
  }
}

TEST_CASE("GGUF: bad files are one clear error naming the file and field", "[gguf][bad]") {
  test::TempDir dir;
  const Model m = random_model(shape(64, 96, 4, 2, 40, RopeLayout::interleaved), 5, false);
  const std::string good = dir.file("good.gguf");
  write_model(m.config(), m.weights(), "llama", good, as_f32);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(dir.file(name), std::ios::binary) << b;
    return dir.file(name);
  };
  auto fails = [&](const std::string& path, const std::string& text) {
    INFO(path);
    CHECK_THROWS_WITH(load_gguf(path), Catch::Contains(text));
  };
  fails(write("short.gguf", bytes.substr(0, 3)), "file ends inside header");
  CHECK_THROWS_AS(load_gguf(write("trunc.gguf", bytes.substr(0, 200))), CorruptData);
  fails(write("cut.gguf", bytes.substr(0, bytes.size() - 100)), "tensor data beyond the file");
  std::string v1 = bytes;
  v1[4] = 1;
  fails(write("v1.gguf", v1), "version = 1");
  std::string huge = bytes;
  const std::uint64_t n = std::uint64_t{1} << 60;
  std::memcpy(huge.data() + 16, &n, 8);  // metadata_kv_count
  fails(write("count.gguf", huge), "metadata_kv_count = 1152921504606846976");
  GgufWriter arch;
  arch.str("general.architecture", "gpt2");
  arch.write(dir.file("arch.gguf"));
  fails(dir.file("arch.gguf"), "general.architecture = gpt2");
  // A tensor of a type akv does not read, and one whose shape disagrees with the metadata.
  GgufWriter w;
  w.str("general.architecture", "llama");
  for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.feed_forward_length"}) w.u32(k, 64);
  w.u32("llama.block_count", 1);
  w.u32("llama.attention.head_count", 4);
  w.tensor("token_embd.weight", {64, 10}, 10, std::vector<std::uint8_t>(16, 0));
  w.write(dir.file("q2k.gguf"));
  fails(dir.file("q2k.gguf"), "token_embd.weight.type = type 10");
  CHECK_THROWS_AS(load_gguf(dir.file("q2k.gguf")), InvalidInput);
  GgufWriter s;
  s.str("general.architecture", "llama");
  for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.feed_forward_length"}) s.u32(k, 64);
  s.u32("llama.block_count", 1);
  s.u32("llama.attention.head_count", 4);
  const std::vector<float> e(32 * 10, 0.5f);
  s.tensor_f32("token_embd.weight", {32, 10}, e.data(), e.size());
  s.write(dir.file("shape.gguf"));
  fails(dir.file("shape.gguf"), "token_embd.weight.dims = [32, 10]");
  CHECK_THROWS_AS(load_gguf(dir.file("missing.gguf")), IoError);
  CHECK(!is_gguf(dir.file("missing.gguf")));
  CHECK(is_gguf(good));
}

TEST_CASE("GGUF metadata arrays: checked and skipped on open, read when asked for", "[gguf][bad]") {
  test::TempDir dir;
  GgufWriter w;
  w.str("general.architecture", "llama");
  std::vector<std::uint8_t> big(1u << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 7);
  w.numbers("x.bytes", 0, big);  // u8: 1 byte each in the file, ~32 as JSON values
  w.strings("x.words", {"a", "", "ccc"});
  w.u32("x.after", 5);
  w.numbers("x.wide", 4, std::vector<std::uint32_t>{7, 4294967295u});  // u32 past int32
  w.write(dir.file("arrays.gguf"));
  const GgufFile f(dir.file("arrays.gguf"));
  CHECK(!f.metadata().contains("x.bytes"));
  CHECK(f.metadata().at("x.after") == 5);
  REQUIRE(f.arrays().count("x.bytes") == 1);
  CHECK(f.arrays().at("x.bytes").count == big.size());
  CHECK(gguf_info(f)["metadata"]["x.bytes"] == "[1048576 values]");
  CHECK(gguf_info(f)["metadata"]["x.words"] == "[3 values]");
  const auto bytes = f.int32s("x.bytes");
  REQUIRE(bytes);
  CHECK(*bytes == std::vector<std::int32_t>(big.begin(), big.end()));
  CHECK(f.floats("x.bytes")->at(7) == static_cast<float>(big[7]));
  CHECK(*f.strings("x.words") == std::vector<std::string>{"a", "", "ccc"});
  CHECK(f.value("x.after") == nlohmann::json(5));
  CHECK(!f.value("x.absent"));
  CHECK(!f.strings("x.absent"));
  // A list read as one value, one value read as a list, strings read as numbers: one error each.
  CHECK_THROWS_AS(f.value("x.words"), InvalidInput);
  CHECK_THROWS_AS(f.strings("x.after"), InvalidInput);
  CHECK_THROWS_AS(f.int32s("x.words"), InvalidInput);
  CHECK_THROWS_AS(f.strings("x.bytes"), InvalidInput);
  CHECK_THROWS_WITH(f.int32s("x.wide"), Catch::Contains("outside int32") && Catch::Contains("x.wide[1]"));
  // Skipping still checks: an array cut by the end of the file, a string longer than the file.
  std::ifstream in(dir.file("arrays.gguf"), std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(in)), {});
  const std::size_t words = b.find("x.words");
  std::ofstream(dir.file("cut.gguf"), std::ios::binary) << b.substr(0, words + 7 + 4 + 4 + 8 + 8 + 1 + 8 + 2);
  CHECK_THROWS_AS(GgufFile(dir.file("cut.gguf")), CorruptData);
  std::string longer = b;
  const std::uint64_t huge = std::uint64_t{1} << 40;
  std::memcpy(longer.data() + words + 7 + 4 + 4 + 8, &huge, 8);  // the first string's length
  std::ofstream(dir.file("long.gguf"), std::ios::binary) << longer;
  CHECK_THROWS_WITH(GgufFile(dir.file("long.gguf")), Catch::Contains("string length beyond the file"));
}

TEST_CASE("GGUF tokenizer: the Llama 2 vocabulary as GGUF lists encodes as libsentencepiece does", "[gguf][tokenizer]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  test::TempDir dir;
  const Tokenizer sp(shared_dir() + "/models/llama2-tokenizer.model");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  for (const Tokenizer::Piece& p : sp.pieces()) {
    tokens.push_back(p.text);
    scores.push_back(p.score);
    types.push_back(p.type);
  }
  REQUIRE(tokens.size() == 32000);
  GgufWriter g;
  g.str("general.architecture", "llama");
  g.str("tokenizer.ggml.model", "llama");
  g.strings("tokenizer.ggml.tokens", tokens);
  g.numbers("tokenizer.ggml.scores", 6, scores);
  g.numbers("tokenizer.ggml.token_type", 5, types);
  g.u32("tokenizer.ggml.bos_token_id", 1);
  g.u32("tokenizer.ggml.unknown_token_id", 0);
  g.write(dir.file("vocab.gguf"));
  const Tokenizer gg = Tokenizer::from_gguf(dir.file("vocab.gguf"));
  CHECK(gg.vocab_size() == 32000);
  CHECK(gg.bos() == sp.bos());
  std::vector<std::string> texts = {"Hello world", "Hello  world", " leading space", "trailing space ", "", " ",
                                    "a\nb\tc", "na\xC3\xAFve caf\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                                    "emoji \xF0\x9F\x98\x80\xF0\x9F\x9A\x80", std::string(50, 'x'), "12345.678",
                                    "<s> </s> <unk>", "\x01\x02", "The pass key is 48213. Remember it.",
                                    "Once upon a time, there was a little girl named Lily."};
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  for (std::size_t i = 0; i < 16; ++i) texts.push_back(sp.decode(lines[i]));
  for (const std::string& t : texts) {
    INFO("text: " << t);
    const std::vector<std::int32_t> want = sp.encode(t);
    CHECK(gg.encode(t) == want);
    CHECK(gg.decode(want) == sp.decode(want));
  }
  GgufWriter none;
  none.str("general.architecture", "llama");
  none.write(dir.file("none.gguf"));
  CHECK_THROWS_WITH(Tokenizer::from_gguf(dir.file("none.gguf")), Catch::Contains("tokenizer.ggml.model = missing"));
  GgufWriter bert;
  bert.str("tokenizer.ggml.model", "bert");
  bert.write(dir.file("bert.gguf"));
  CHECK_THROWS_WITH(Tokenizer::from_gguf(dir.file("bert.gguf")), Catch::Contains("tokenizer.ggml.model = bert"));
  // A BOS id past 2^32 (it was narrowed to 1, a valid id, silently).
  GgufWriter wide;
  wide.str("tokenizer.ggml.model", "llama");
  wide.strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "a"});
  wide.u64("tokenizer.ggml.bos_token_id", (std::uint64_t{1} << 32) + 1);
  wide.write(dir.file("wide.gguf"));
  CHECK_THROWS_WITH(Tokenizer::from_gguf(dir.file("wide.gguf")), Catch::Contains("tokenizer.ggml.bos_token_id = 4294967297"));
}

TEST_CASE("GGUF llama tokenizer, Gemma's layout: ids equal llama.cpp's on the lists its converter wrote",
          "[gguf][tokenizer]") {
  // data/golden/bpe/gemma-gguf.json (scripts/dev/golden/gemma_gguf_ids.sh): no space prefix,
  // user-defined pieces ("\n\n", runs of spaces, "<table>") taken whole before the merges, control
  // pieces ("<start_of_turn>") left to the text as llama-perplexity does, byte fallback.
  const std::string dir = std::string(AKV_SOURCE_DIR) + "/data/golden/bpe";
  const nlohmann::json gj = nlohmann::json::parse(std::ifstream(dir + "/gemma-gguf.json"));
  const nlohmann::json texts = nlohmann::json::parse(std::ifstream(dir + "/golden.json"))["texts"];
  test::TempDir tmp;
  GgufWriter g;
  g.str("general.architecture", "gemma3");
  g.str("tokenizer.ggml.model", "llama");
  g.strings("tokenizer.ggml.tokens", gj["tokens"].get<std::vector<std::string>>());
  g.numbers("tokenizer.ggml.scores", 6, gj["scores"].get<std::vector<float>>());
  g.numbers("tokenizer.ggml.token_type", 5, gj["token_type"].get<std::vector<std::int32_t>>());
  g.u32("tokenizer.ggml.bos_token_id", gj["bos_token_id"].get<std::uint32_t>());
  g.u32("tokenizer.ggml.unknown_token_id", gj["unknown_token_id"].get<std::uint32_t>());
  g.boolean("tokenizer.ggml.add_space_prefix", gj["add_space_prefix"].get<bool>());
  g.write(tmp.file("gemma.gguf"));
  const Tokenizer t = Tokenizer::from_gguf(tmp.file("gemma.gguf"));
  CHECK(t.bos() == 2);
  REQUIRE(gj["ids"].size() == texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    INFO("text " << i << ": " << text);
    const auto want = gj["ids"][i].get<std::vector<std::int32_t>>();
    CHECK(t.encode(text) == want);
    std::string spaced;  // a U+2581 of the text decodes as a space (llama.cpp's decoding too)
    for (std::size_t k = 0; k < text.size(); k += text.compare(k, 3, "\xE2\x96\x81") == 0 ? 3 : 1) {
      spaced += text.compare(k, 3, "\xE2\x96\x81") == 0 ? ' ' : text[k];
    }
    CHECK(t.decode(want) == spaced);
  }
}

TEST_CASE("GGUF gpt2 tokenizer: the golden BPE vocabulary as GGUF lists encodes as Hugging Face tokenizers does",
          "[gguf][tokenizer][bpe]") {
  // The Llama 3 layout of data/golden/bpe as llama.cpp's converter writes it: tokens in id order,
  // merges as "left right", added tokens typed control (3), pre-tokenizer llama-bpe.
  const std::string dir = std::string(AKV_SOURCE_DIR) + "/data/golden/bpe";
  const nlohmann::json tj = nlohmann::json::parse(std::ifstream(dir + "/llama3-tokenizer.json"));
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(dir + "/golden.json"));
  std::vector<std::string> tokens(tj["model"]["vocab"].size() + tj["added_tokens"].size());
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (const auto& [text, id] : tj["model"]["vocab"].items()) tokens[id.get<std::size_t>()] = text;
  for (const auto& a : tj["added_tokens"]) {
    tokens[a["id"].get<std::size_t>()] = a["content"].get<std::string>();
    types[a["id"].get<std::size_t>()] = 3;
  }
  std::vector<std::string> merges;
  for (const auto& m : tj["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  test::TempDir tmp;
  GgufWriter g;
  g.str("general.architecture", "llama");
  g.str("tokenizer.ggml.model", "gpt2");
  g.str("tokenizer.ggml.pre", "llama-bpe");
  g.strings("tokenizer.ggml.tokens", tokens);
  g.numbers("tokenizer.ggml.token_type", 5, types);
  g.strings("tokenizer.ggml.merges", merges);
  g.u32("tokenizer.ggml.bos_token_id", 656);
  g.boolean("tokenizer.ggml.add_bos_token", true);
  g.write(tmp.file("bpe.gguf"));
  const Tokenizer t = Tokenizer::from_gguf(tmp.file("bpe.gguf"));
  CHECK(t.bos() == 656);
  CHECK(t.vocab_size() == 658);
  const auto& cases = golden["tokenizers"]["llama3"]["cases"];
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string text = golden["texts"][i].get<std::string>();
    INFO("text " << i << ": " << text);
    CHECK(t.encode(text) == cases[i]["ids"].get<std::vector<std::int32_t>>());
    CHECK(t.decode(cases[i]["ids"].get<std::vector<std::int32_t>>()) == cases[i]["decoded"].get<std::string>());
  }
  GgufWriter unknown_pre;
  unknown_pre.str("tokenizer.ggml.model", "gpt2");
  unknown_pre.str("tokenizer.ggml.pre", "falcon");
  unknown_pre.strings("tokenizer.ggml.tokens", tokens);
  unknown_pre.write(tmp.file("falcon.gguf"));
  CHECK_THROWS_WITH(Tokenizer::from_gguf(tmp.file("falcon.gguf")), Catch::Contains("tokenizer.ggml.pre = falcon"));
}
