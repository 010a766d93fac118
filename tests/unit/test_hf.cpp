#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/io/token_file.h"
#include "akv/model/architecture.h"
#include "akv/model/hf.h"
#include "akv/model/load.h"
#include "akv/model/hf_config.h"
#include "akv/model/llama2c.h"
#include "akv/tensor/half.h"
#include "test_util.h"

using namespace akv;
using test::have_shared;
using test::shared_dir;

namespace {

struct Entry {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> data;
};

// Writes a safetensors file: 8-byte header length, JSON header, tensors back to back.
void write_safetensors(const std::string& path, const std::vector<Entry>& entries, const std::string& dtype) {
  nlohmann::json h = nlohmann::json::object();
  std::string blob;
  for (const Entry& e : entries) {
    const std::size_t begin = blob.size();
    if (dtype == "F32") {
      blob.append(reinterpret_cast<const char*>(e.data.data()), e.data.size() * 4);
    } else {
      std::vector<std::uint16_t> b(e.data.size());
      if (dtype == "BF16") f32_to_bf16(e.data.data(), b.data(), b.size());
      else f32_to_f16(e.data.data(), b.data(), b.size());
      blob.append(reinterpret_cast<const char*>(b.data()), b.size() * 2);
    }
    h[e.name] = {{"dtype", dtype}, {"shape", e.shape}, {"data_offsets", {begin, blob.size()}}};
  }
  const std::string text = h.dump();
  std::ofstream out(path, std::ios::binary);
  std::uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out << text << blob;
}

std::vector<float> flat(const Weight& w) {
  const RowMatrix& m = w.f32();
  return {m.data(), m.data() + m.size()};
}

// llama2.c (interleaved RoPE pairs) -> HF rotate-half: row 2i + j of each head moves to j*half + i.
std::vector<float> permute_rows(const Weight& weight, std::size_t heads, std::size_t hd) {
  const RowMatrix& w = weight.f32();
  RowMatrix out(w.rows(), w.cols());
  const std::size_t half = hd / 2;
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < half; ++i) {
      for (std::size_t j = 0; j < 2; ++j) {
        out.row(static_cast<Eigen::Index>(h * hd + j * half + i)) = w.row(static_cast<Eigen::Index>(h * hd + 2 * i + j));
      }
    }
  }
  return flat(out);
}

// The same row permutation of a bias vector (one value per row).
std::vector<float> permute_bias(const std::vector<float>& b, std::size_t heads, std::size_t hd) {
  std::vector<float> out(b.size());
  const std::size_t half = hd / 2;
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < half; ++i) {
      for (std::size_t j = 0; j < 2; ++j) out[h * hd + j * half + i] = b[h * hd + 2 * i + j];
    }
  }
  return out;
}

// m as a Hugging Face directory of `type` (llama, or qwen2 with m's q/k/v biases).
void convert(const Model& m, const std::string& dir, const std::string& dtype, bool sharded,
             const std::string& type = "llama") {
  std::filesystem::create_directories(dir);
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  nlohmann::json cfg = {{"model_type", type}, {"hidden_size", c.dim}, {"intermediate_size", c.hidden_dim},
                        {"num_hidden_layers", c.n_layers}, {"num_attention_heads", c.n_heads},
                        {"num_key_value_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.seq_len}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                        {"tie_word_embeddings", true}, {"hidden_act", "silu"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  std::vector<Entry> e = {{"model.embed_tokens.weight", {c.vocab_size, c.dim}, flat(w.embedding)},
                          {"model.norm.weight", {c.dim}, w.final_norm}};
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    e.push_back({p + "input_layernorm.weight", {c.dim}, lw.attn_norm});
    e.push_back({p + "self_attn.q_proj.weight", {c.dim, c.dim}, permute_rows(lw.wq, c.n_heads, c.head_dim)});
    e.push_back({p + "self_attn.k_proj.weight", {c.n_kv_heads * c.head_dim, c.dim}, permute_rows(lw.wk, c.n_kv_heads, c.head_dim)});
    e.push_back({p + "self_attn.v_proj.weight", {c.n_kv_heads * c.head_dim, c.dim}, flat(lw.wv)});
    e.push_back({p + "self_attn.o_proj.weight", {c.dim, c.dim}, flat(lw.wo)});
    if (c.qkv_bias) {
      e.push_back({p + "self_attn.q_proj.bias", {c.dim}, permute_bias(lw.bq, c.n_heads, c.head_dim)});
      e.push_back({p + "self_attn.k_proj.bias", {c.n_kv_heads * c.head_dim}, permute_bias(lw.bk, c.n_kv_heads, c.head_dim)});
      e.push_back({p + "self_attn.v_proj.bias", {c.n_kv_heads * c.head_dim}, lw.bv});
    }
    e.push_back({p + "post_attention_layernorm.weight", {c.dim}, lw.ffn_norm});
    e.push_back({p + "mlp.gate_proj.weight", {c.hidden_dim, c.dim}, flat(lw.w1)});
    e.push_back({p + "mlp.down_proj.weight", {c.dim, c.hidden_dim}, flat(lw.w2)});
    e.push_back({p + "mlp.up_proj.weight", {c.hidden_dim, c.dim}, flat(lw.w3)});
  }
  if (!sharded) {
    write_safetensors(dir + "/model.safetensors", e, dtype);
    return;
  }
  const std::size_t half = e.size() / 2;
  write_safetensors(dir + "/a.safetensors", {e.begin(), e.begin() + static_cast<std::ptrdiff_t>(half)}, dtype);
  write_safetensors(dir + "/b.safetensors", {e.begin() + static_cast<std::ptrdiff_t>(half), e.end()}, dtype);
  nlohmann::json map = nlohmann::json::object();
  for (std::size_t i = 0; i < e.size(); ++i) map[e[i].name] = i < half ? "a.safetensors" : "b.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
}

double max_diff(const RowMatrix& a, const RowMatrix& b) { return (a - b).cwiseAbs().maxCoeff(); }

}  // namespace

TEST_CASE("HF layout of stories260K (rotate-half, q/k permuted) gives llama2.c's logits", "[model][hf]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  test::TempDir dir;
  const Model ref = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::int32_t> seq(lines[0].begin(), lines[0].begin() + 64);
  const RowMatrix want = ref.prefill(seq, true).logits;
  convert(ref, dir.file("f32"), "F32", false);
  const Model hf = load_model(dir.file("f32"));
  CHECK(hf.config().rope_layout == RopeLayout::rotate_half);
  CHECK(max_diff(hf.prefill(seq, true).logits, want) <= 1e-4);
  convert(ref, dir.file("sharded"), "F32", true);
  CHECK(max_diff(load_model(dir.file("sharded")).prefill(seq, true).logits, want) <= 1e-4);
  // bf16 / f16 weights are converted exactly on load: the logits equal those of the llama2.c
  // model with every weight rounded the same way.
  for (const char* dt : {"BF16", "F16"}) {
    convert(ref, dir.file(dt), dt, false);
    const bool bf = std::string(dt) == "BF16";
    auto round = [&](float* x, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = bf ? bf16_to_f32_ref(f32_to_bf16_ref(x[i])) : f16_to_f32_ref(f32_to_f16_ref(x[i]));
      }
    };
    ModelWeights w = ref.weights();
    auto rm = [&](Weight& w) { round(w.f32().data(), static_cast<std::size_t>(w.f32().size())); };
    auto rv = [&](std::vector<float>& v) { round(v.data(), v.size()); };
    rm(w.embedding);
    rv(w.final_norm);
    for (LayerWeights& l : w.layers) {
      rv(l.attn_norm);
      rv(l.ffn_norm);
      for (Weight* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) rm(*m);
    }
    const Model rounded(ref.config(), w);
    const double d = max_diff(load_model(dir.file(dt)).prefill(seq, true).logits, rounded.prefill(seq, true).logits);
    INFO(dt << " max abs logit diff " << d);
    CHECK(d <= 1e-4);
  }
}

TEST_CASE("HF qwen2 (q/k/v biases) gives the logits of the same weights and biases in memory", "[model][hf]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  test::TempDir dir;
  const Model stories = load_llama2c(shared_dir() + "/models/stories260K.bin");
  ModelConfig c = stories.config();
  c.qkv_bias = true;
  ModelWeights w = stories.weights();
  Rng rng(21);
  auto bias = [&](std::size_t n) {
    std::vector<float> b(n);
    for (float& x : b) x = static_cast<float>(0.3 * rng.normal());
    return b;
  };
  for (LayerWeights& l : w.layers) {
    l.bq = bias(c.n_heads * c.head_dim);
    l.bk = bias(c.n_kv_heads * c.head_dim);
    l.bv = bias(c.n_kv_heads * c.head_dim);
  }
  const Model ref(c, w);
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::int32_t> seq(lines[0].begin(), lines[0].begin() + 64);
  const RowMatrix want = ref.prefill(seq, true).logits;
  CHECK(max_diff(want, stories.prefill(seq, true).logits) > 1e-2);  // the biases matter
  convert(ref, dir.file("qwen2"), "F32", false, "qwen2");
  const Model hf = load_model(dir.file("qwen2"));
  CHECK(hf.config().qkv_bias);
  CHECK(max_diff(hf.prefill(seq, true).logits, want) <= 1e-4);
}

namespace {

// stories260K as a Hugging Face directory (F32) whose config a test edits and reloads.
struct StoriesHf {
  test::TempDir dir;
  Model ref = load_llama2c(shared_dir() + "/models/stories260K.bin");
  nlohmann::json cfg;
  StoriesHf() {
    convert(ref, dir.file("m"), "F32", false);
    std::ifstream(dir.file("m") + "/config.json") >> cfg;
  }
  Model load() const {
    std::ofstream(dir.file("m") + "/config.json") << cfg.dump();
    return load_model(dir.file("m"));
  }
};

}  // namespace

TEST_CASE("HF loader: RoPE angles cover the positions used, not max_position_embeddings", "[model][hf]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  StoriesHf hf;
  hf.cfg["max_position_embeddings"] = std::int64_t{1} << 40;  // a table for it would need 8 TiB
  const Model m = hf.load();
  CHECK(m.config().seq_len == std::size_t{1} << 40);
  const std::vector<std::int32_t> seq = {1, 5, 9, 13};
  CHECK(max_diff(m.prefill(seq, true).logits, hf.ref.prefill(seq, true).logits) <= 1e-4);
  // A dynamic factor of 1e300: the context is capped at 2^62 (the conversion was undefined).
  hf.cfg["max_position_embeddings"] = 512;
  hf.cfg["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 1e300}};
  CHECK(hf.load().config().seq_len == std::size_t{1} << 62);
}

TEST_CASE("HF loader: longrope takes the short factors up to the original context, the long ones past it",
          "[model][hf]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  StoriesHf hf;
  const Model& ref = hf.ref;
  hf.cfg["max_position_embeddings"] = 512;
  hf.cfg["original_max_position_embeddings"] = 16;  // factor 32
  hf.cfg["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1, 1, 1, 1}}, {"long_factor", {2, 2, 2, 2}},
                            {"attention_factor", 1.0}};
  const Model m = hf.load();
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::int32_t> s16(lines[0].begin(), lines[0].begin() + 16), s17(lines[0].begin(), lines[0].begin() + 17);
  CHECK(max_diff(m.prefill(s16, true).logits, ref.prefill(s16, true).logits) <= 1e-4);  // short factors 1: plain RoPE
  CHECK(max_diff(m.prefill(s17, true).logits, ref.prefill(s17, true).logits) > 1e-2);   // 17 > 16: the long ones
  // The default attention factor: sqrt(1 + ln 32 / ln 16) = 1.5.
  hf.cfg["rope_scaling"].erase("attention_factor");
  const Model d = hf.load();
  CHECK(d.config().rope_scaling.attention_factor == Approx(1.5).epsilon(1e-15));
  CHECK(max_diff(d.prefill(s16, true).logits, ref.prefill(s16, true).logits) > 1e-2);
}

TEST_CASE("HF loader: bad checkpoints are clean errors", "[model][hf][bad]") {
  test::TempDir dir;
  const std::string d = dir.file("m");
  std::filesystem::create_directories(d);
  nlohmann::json cfg = {{"model_type", "llama"}, {"hidden_size", 8}, {"intermediate_size", 16},
                        {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                        {"vocab_size", 10}, {"max_position_embeddings", 32}};
  std::ofstream(d + "/config.json") << cfg.dump();
  CHECK_THROWS_AS(load_hf(d), IoError);  // no safetensors
  // A header that claims more data than the file has.
  write_safetensors(d + "/model.safetensors", {{"model.embed_tokens.weight", {10, 8}, std::vector<float>(80, 0.5f)}}, "F32");
  {
    std::filesystem::resize_file(d + "/model.safetensors", std::filesystem::file_size(d + "/model.safetensors") - 4);
  }
  CHECK_THROWS_AS(load_hf(d), CorruptData);
  // Wrong shape against the config.
  write_safetensors(d + "/model.safetensors", {{"model.embed_tokens.weight", {10, 7}, std::vector<float>(70, 0.5f)}}, "F32");
  try {
    load_hf(d);
    FAIL("expected InvalidInput");
  } catch (const InvalidInput& e) {
    CHECK(std::string(e.what()).find("model.embed_tokens.weight.shape = [10, 7]") != std::string::npos);
  }
  // Unknown dtype.
  {
    std::string text = R"({"x": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})";
    std::ofstream out(d + "/model.safetensors", std::ios::binary);
    std::uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << text << "ab";
  }
  CHECK_THROWS_AS(load_hf(d), InvalidInput);
  // Header length past the end.
  {
    std::ofstream out(d + "/model.safetensors", std::ios::binary);
    std::uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  CHECK_THROWS_AS(load_hf(d), CorruptData);
  // Unsupported config fields.
  cfg["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};  // not implemented
  std::ofstream(d + "/config.json") << cfg.dump();
  CHECK_THROWS_AS(load_hf(d), InvalidInput);
  cfg.erase("rope_scaling");
  cfg["model_type"] = "gpt2";
  std::ofstream(d + "/config.json") << cfg.dump();
  CHECK_THROWS_AS(load_hf(d), InvalidInput);
}

TEST_CASE("HF config: defaults, derived fields and typed errors naming the field", "[model][hf][config]") {
  test::TempDir dir;
  const std::string f = dir.file("config.json");
  nlohmann::json cfg = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 128},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 10}};
  std::ofstream(f) << cfg.dump();
  const HfConfig c = read_hf_config(dir.path().string());
  CHECK(c.num_key_value_heads == 4);  // absent: as many as query heads
  CHECK(c.head_dim == 16);            // absent: hidden_size / heads
  CHECK(c.rope_theta == 10000.0);
  CHECK(!c.max_position_embeddings);
  CHECK(c.rope_scaling.is_null());
  CHECK_THROWS_AS(read_hf_config(f, {"qwen2"}), InvalidInput);  // model_type not accepted
  CHECK(!c.attn_logit_softcapping);  // absent: the model's default
  {
    // Gemma 3's multimodal config: the language model's fields, named under text_config.
    nlohmann::json mm = {{"model_type", "gemma3"}, {"text_config", cfg}};
    mm["text_config"]["num_attention_heads"] = 0;
    std::ofstream(f) << mm.dump();
    CHECK_THROWS_WITH(read_hf_config(f), Catch::Contains("text_config.num_attention_heads = 0"));
    mm["text_config"]["num_attention_heads"] = 4;
    mm["text_config"]["rope_scaling"] = {{"rope_type", "linear"}};
    std::ofstream(f) << mm.dump();
    CHECK_THROWS_WITH(hf_rope_scaling(read_hf_config(f)), Catch::Contains("text_config.rope_scaling.factor"));
  }
  {
    nlohmann::json capped = cfg;  // Gemma 2's caps: null turns one off, a number sets it
    capped["attn_logit_softcapping"] = nullptr;
    capped["final_logit_softcapping"] = 12.5;
    std::ofstream(f) << capped.dump();
    const HfConfig g = read_hf_config(f);
    CHECK(g.attn_logit_softcapping == 0.0);
    CHECK(g.final_logit_softcapping == 12.5);
    capped["final_logit_softcapping"] = -1;
    std::ofstream(f) << capped.dump();
    CHECK_THROWS_WITH(read_hf_config(f), Catch::Contains("final_logit_softcapping = -1"));
  }
  cfg["rope_theta"] = "big";
  std::ofstream(f) << cfg.dump();
  try {
    read_hf_config(f);
    FAIL("a string rope_theta was accepted");
  } catch (const InvalidInput& e) {
    CHECK(std::string(e.what()).find("rope_theta") != std::string::npos);
  }
  cfg["rope_theta"] = 500000;
  cfg["num_key_value_heads"] = 3;  // 4 query heads are not a multiple of 3
  std::ofstream(f) << cfg.dump();
  CHECK_THROWS_AS(read_hf_config(f), InvalidInput);
  cfg["num_key_value_heads"] = 2;
  // rope_scaling and partial_rotary_factor: accepted forms and the field named when refused.
  auto refused = [&](const nlohmann::json& scaling, const std::string& field) {
    cfg["rope_scaling"] = scaling;
    std::ofstream(f) << cfg.dump();
    const HfConfig read = read_hf_config(f);  // read: `akv plan` takes any RoPE type
    try {
      hf_rope_scaling(read);
      FAIL("accepted rope_scaling " << scaling.dump());
    } catch (const InvalidInput& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(field));
    }
  };
  cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  std::ofstream(f) << cfg.dump();
  CHECK(hf_rope_scaling(read_hf_config(f)).kind == RopeScaling::Kind::llama3);
  cfg["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key
  std::ofstream(f) << cfg.dump();
  CHECK(hf_rope_scaling(read_hf_config(f)).factor == 2.0);
  refused({{"rope_type", "longrope"}, {"factor", 4.0}}, "max_position_embeddings");  // none in cfg
  refused({{"rope_type", "ntk-by-parts"}, {"factor", 4.0}}, "rope_scaling.rope_type = ntk-by-parts");
  refused({{"rope_type", "yarn"}, {"factor", 4.0}}, "max_position_embeddings");  // none in cfg
  refused({{"rope_type", "linear"}, {"factor", 0}}, "rope_scaling.factor = 0");
  refused({{"rope_type", "linear"}}, "rope_scaling.factor = missing");
  refused({{"rope_type", "dynamic"}, {"factor", 2.0}}, "max_position_embeddings");  // none in cfg
  cfg["max_position_embeddings"] = 4096;
  cfg["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
  std::ofstream(f) << cfg.dump();
  const RopeScaling yarn = hf_rope_scaling(read_hf_config(f));
  CHECK(yarn.kind == RopeScaling::Kind::yarn);
  CHECK(yarn.attention_factor == Approx(0.1 * std::log(4.0) + 1.0));
  CHECK(yarn.beta_fast == 32.0);
  CHECK(yarn.original_max_positions == 4096);
  refused({{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}},
          "rope_scaling.original_max_position_embeddings = 1024");
  refused({{"type", "yarn"}, {"factor", 4.0}, {"mscale", 0.707}}, "rope_scaling.mscale = 0.707");
  refused({{"type", "yarn"}, {"factor", 0.5}}, "rope_scaling.factor = 0.5");
  // longrope (Phi-3): a top-level original_max_position_embeddings sets the factor, 131072 / 4096 =
  // 32, and the attention factor sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5 / 12); 8 factors (head_dim 16).
  const std::vector<double> short_f = {1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5}, long_f = {2, 3, 4, 5, 6, 7, 8, 9};
  cfg["max_position_embeddings"] = 131072;
  cfg["original_max_position_embeddings"] = 4096;
  for (const char* type : {"longrope", "su"}) {
    cfg["rope_scaling"] = {{"type", type}, {"short_factor", short_f}, {"long_factor", long_f}};
    std::ofstream(f) << cfg.dump();
    const RopeScaling lr = hf_rope_scaling(read_hf_config(f));
    CHECK(lr.kind == RopeScaling::Kind::longrope);
    CHECK(lr.factor == 32.0);
    CHECK(lr.original_max_positions == 4096);
    CHECK(lr.attention_factor == Approx(std::sqrt(17.0 / 12.0)).epsilon(1e-15));
    CHECK(lr.long_factors[7] == 9.0f);
  }
  refused({{"type", "longrope"}, {"short_factor", {1, 2}}, {"long_factor", long_f}}, "rope_scaling.short_factor = 2");
  refused({{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", {2, 3, -4, 5, 6, 7, 8, 9}}},
          "rope_scaling.long_factor[2] = -4");
  refused({{"type", "longrope"}, {"short_factor", short_f}}, "rope_scaling.long_factor = missing");
  // Without it: rope_scaling.factor over max_position_embeddings, and a given attention factor.
  cfg.erase("original_max_position_embeddings");
  refused({{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}}, "rope_scaling.factor = missing");
  cfg["rope_scaling"] = {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}, {"factor", 4.0},
                         {"attention_factor", 1.25}};
  std::ofstream(f) << cfg.dump();
  const RopeScaling lr = hf_rope_scaling(read_hf_config(f));
  CHECK(lr.original_max_positions == 131072);
  CHECK(lr.attention_factor == 1.25);
  cfg.erase("max_position_embeddings");
  refused({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0},
           {"original_max_position_embeddings", 8192}},
          "rope_scaling.high_freq_factor");
  refused({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}},
          "original_max_position_embeddings");
  refused(nlohmann::json::array({1, 2}), "rope_scaling must be an object");
  cfg.erase("rope_scaling");
  cfg["partial_rotary_factor"] = 0.5;
  std::ofstream(f) << cfg.dump();
  CHECK(read_hf_config(f).rotary_dim == 8);
  for (double bad : {0.0, 1.5, 0.01}) {  // out of range, or a rotary dimension of 0
    cfg["partial_rotary_factor"] = bad;
    std::ofstream(f) << cfg.dump();
    CHECK_THROWS_AS(read_hf_config(f), InvalidInput);
  }
}

TEST_CASE("architectures akv does not run: the refusal names the missing feature", "[model][hf]") {
  CHECK(missing_feature("qwen3_moe").find("mixture-of-experts") != std::string::npos);
  CHECK(missing_feature("qwen3").empty());  // akv runs it
  CHECK(missing_feature("deepseek_v3").find("latent attention") != std::string::npos);
  CHECK(missing_feature("gemma").find("Gemma 1") != std::string::npos);
  CHECK(missing_feature("gemma2").empty());
  CHECK(missing_feature("gemma3").find("multimodal") != std::string::npos);  // its text model runs: gemma3_text
  CHECK(missing_feature("gemma3_text").empty());
  CHECK(missing_feature("llama").empty());
  const std::string msg = unsupported_architecture("model_type", "jamba", supported_hf_model_types());
  CHECK(msg.find("state-space") != std::string::npos);
  CHECK(msg.find("(akv runs llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text)") != std::string::npos);
  CHECK(unsupported_architecture("architecture", "rwkv7", {"llama"}).find("not a Llama-family model") != std::string::npos);
}
