// Sliding-window layers (Gemma 3's local layers): the prefill's windowed attention, the decode
// through kv/windowed.h's cache, and what the cache holds and counts.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>

#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/lanes.h"
#include "akv/kv/runtime.h"
#include "akv/kv/windowed.h"
#include "akv/method/registry.h"
#include "random_model.h"
#include "test_util.h"

using namespace akv;

namespace {

CompressParams params(const std::string& spec) { return resolve_params(parse_method_spec(spec)); }

// Three layers: local (window 5), global, local (window 100, across the flash kernel's tiles),
// with every Gemma 2 and 3 difference switched on: local RoPE base, attention scale, embedding
// scale, GeGLU, sandwich and q/k norms (weights 1 + 0.1 N(0, 1)), attention and final soft-capping.
Model gemma_like(bool windows = true) {
  ModelConfig c = test::small_config(3, 16, 40, 4096);
  if (windows) c.layer_window = {5, 0, 100};
  c.rope_theta = 100000.0;
  c.rope_theta_local = 1000.0;
  c.attn_scale = 0.2f;
  c.embed_scale = std::sqrt(32.0f);
  c.activation = ModelConfig::Activation::gelu_tanh;
  c.final_softcap = 3.0f;
  c.attn_softcap = 1.0f;  // Gemma 2's, binding on these logits
  const Model base = test::random_model(c, 31, 0.3);
  ModelWeights w = base.weights();
  Rng r(7);
  auto norm = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(1.0 + 0.1 * r.normal());
    return v;
  };
  for (LayerWeights& l : w.layers) {
    l.attn_norm = norm(c.dim);
    l.ffn_norm = norm(c.dim);
    l.post_attn_norm = norm(c.dim);
    l.post_ffn_norm = norm(c.dim);
    l.q_norm = norm(c.head_dim);
    l.k_norm = norm(c.head_dim);
  }
  return Model(c, w);
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(r.below(40));
  return t;
}

KvGeometry geometry(const Model& m) { return {m.config().kv_shape(), m.config().seq_len, m.config().dim}; }

// max |a - b| over positions [from, n) of the prefill's logits and the decoded rows, and the
// largest |logit| there.
struct Gap {
  double worst = 0, scale = 0;
};
void compare(const RowMatrix& pre, std::size_t p, const std::vector<float>& dec, Gap& g) {
  for (std::size_t j = 0; j < dec.size(); ++j) {
    const double want = pre(static_cast<Eigen::Index>(p), static_cast<Eigen::Index>(j));
    g.worst = std::max(g.worst, std::fabs(static_cast<double>(dec[j]) - want));
    g.scale = std::max(g.scale, std::fabs(want));
  }
}

}  // namespace

TEST_CASE("sliding-window layers: decoding through the windowed f32 cache equals the prefill at every position past "
          "the windows", "[windowed][model]") {
  const Model m = gemma_like();
  const std::size_t n = 300;
  const std::vector<std::int32_t> seq = tokens(n, 3);
  const PrefillResult pre = m.prefill(seq, true, 2);
  const std::unique_ptr<KvPolicy> cache = make_kv_policy(std::nullopt, geometry(m), 1);
  REQUIRE(cache->holds_windows());
  Gap g;
  for (std::size_t p = 0; p < n; ++p) compare(pre.logits, p, m.decode(seq[p], p, *cache), g);
  INFO("largest |logit difference| " << g.worst << " of logits up to " << g.scale);
  CHECK(g.worst <= 1e-4 * g.scale);
  CHECK(g.scale <= 3.0);  // soft-capped
  // Local layers hold their window's newest rows; the global layer every row.
  for (const auto& [layer, rows] : std::vector<std::pair<std::size_t, std::size_t>>{{0, 5}, {1, n}, {2, 100}}) {
    for (std::size_t h = 0; h < 2; ++h) {
      const KvView v = cache->view(layer, h);
      REQUIRE(v.n == rows);
      for (std::size_t i = 0; i < rows; ++i) CHECK(v.position[i] == static_cast<std::int32_t>(n - rows + i));
    }
  }
  CHECK(cache->bytes() == 2 * (5 + n + 100) * 2 * 16 * 4);  // heads x rows x (K, V) x head_dim x f32
  // The windows matter here: the same weights attending to every position differ.
  const Model global = gemma_like(false);
  const PrefillResult all = global.prefill(seq, true, 2);
  CHECK((all.logits.bottomRows(100) - pre.logits.bottomRows(100)).cwiseAbs().maxCoeff() > 1e-2);
  const std::unique_ptr<KvPolicy> plain = make_kv_policy(std::nullopt, geometry(global), 1);
  CHECK_THROWS_AS(m.decode(seq[0], 0, *plain), std::logic_error);  // a windowed model needs a windowed cache
}

TEST_CASE("sliding-window layers: the prompt's cache keeps each local layer's window in f16 and hands the global "
          "layers to the method", "[windowed][model]") {
  const Model m = gemma_like();
  const std::size_t n = 260, prompt = 200;
  const std::vector<std::int32_t> seq = tokens(n, 4);
  const PrefillResult all = m.prefill(seq, true, 1);
  const std::vector<std::int32_t> head(seq.begin(), seq.begin() + prompt);
  const PrefillResult pre = m.prefill(head, false, 1);
  for (const std::string spec : {"none", "kivi-4", "snapkv:budget=0.5:window=8"}) {
    INFO(spec);
    const std::unique_ptr<KvPolicy> cache = make_kv_policy(params(spec), geometry(m), 1);
    cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt});
    const KvPolicy& inner = dynamic_cast<const WindowedCache&>(*cache).inner();
    // Local layers: f16 rows of the last `window` positions; the method's bytes are the global layer's.
    CHECK(cache->bytes() == inner.bytes() + 2 * (5 + 100) * 2 * 16 * 2);
    CHECK(cache->view(0, 0).n == 5);
    CHECK(cache->view(0, 0).position[0] == static_cast<std::int32_t>(prompt - 5));
    CHECK(cache->view(2, 1).n == 100);
    CHECK(cache->view(1, 0).n == inner.view(0, 0).n);
    if (spec == std::string("snapkv:budget=0.5:window=8")) CHECK(cache->view(1, 0).n == prompt / 2);
    Gap g;
    for (std::size_t p = prompt; p < n; ++p) {
      const std::vector<float> dec = m.decode(seq[p], p, *cache);
      if (spec == std::string("none")) compare(all.logits, p, dec, g);
    }
    if (spec == std::string("none")) {
      INFO("largest |logit difference| " << g.worst << " of logits up to " << g.scale);
      CHECK(g.worst <= 2e-3 * g.scale);  // the f16 rows
    }
    CHECK(cache->view(0, 1).n == 5);
    CHECK(cache->view(0, 1).position[4] == static_cast<std::int32_t>(n - 1));
  }
}

// Records which tensors the prompt it is handed holds.
struct Recorder final : KvPolicy {
  std::vector<const Tensor3*> query, key, key_pre_rope, value;
  bool pre_rope_given = true;
  void ingest_prompt(const PromptKv& p) override {
    for (std::size_t l = 0; l < p.key.size(); ++l) {
      query.push_back(&p.query[l]);
      key.push_back(&p.key[l]);
      value.push_back(&p.value[l]);
      if (p.key_pre_rope) key_pre_rope.push_back(&p.key_pre_rope[l]);
    }
    pre_rope_given = static_cast<bool>(p.key_pre_rope);
  }
  void append(std::size_t, const float*, const float*, const float*, std::size_t) override {}
  KvView view(std::size_t, std::size_t) const override { return {}; }
  std::uint64_t bytes() const override { return 0; }
  // The decode-time observations it is handed: (layer, kv head or position).
  std::vector<std::pair<std::size_t, std::size_t>> observed, queries, inputs;
  bool wants_probs() const override { return true; }
  void observe(std::size_t layer, std::size_t kv_head, const float*) override { observed.emplace_back(layer, kv_head); }
  bool wants_queries() const override { return true; }
  void take_query(std::size_t layer, std::size_t pos, const float*) override { queries.emplace_back(layer, pos); }
  bool wants_inputs() const override { return true; }
  void take_input(std::size_t layer, std::size_t pos, const float*, std::size_t) override { inputs.emplace_back(layer, pos); }
};

TEST_CASE("sliding-window layers: attention, queries and inputs of the global layers reach the method renumbered, "
          "the local layers' do not", "[windowed]") {
  KvShape shape;
  shape.n_layers = 4, shape.n_heads = 4, shape.n_kv_heads = 2, shape.head_dim = 8;
  shape.layer_window = {0, 4, 0, 6};
  auto rec = std::make_unique<Recorder>();
  const Recorder& r = *rec;
  WindowedCache cache(std::move(rec), shape, DenseType::f32);
  CHECK(cache.wants_probs());
  CHECK(cache.wants_queries());
  CHECK(cache.wants_inputs());
  const std::vector<float> x(64, 0.5f);
  for (std::size_t l = 0; l < 4; ++l) {
    cache.observe(l, 1, x.data());
    cache.take_query(l, 7, x.data());
    cache.take_input(l, 7, x.data(), 16);
  }
  using P = std::vector<std::pair<std::size_t, std::size_t>>;
  CHECK(r.observed == P{{0, 1}, {1, 1}});  // model layers 0 and 2
  CHECK(r.queries == P{{0, 7}, {1, 7}});
  CHECK(r.inputs == P{{0, 7}, {1, 7}});
}

TEST_CASE("sliding-window layers: the global layers' prompt tensors reach the method as they are, not copied",
          "[windowed]") {
  KvShape shape;
  shape.n_layers = 4, shape.n_heads = 4, shape.n_kv_heads = 2, shape.head_dim = 8;
  shape.layer_window = {0, 4, 0, 6};
  std::vector<Tensor3> q, k, v;
  for (std::size_t l = 0; l < 4; ++l) {
    q.emplace_back(4, 3, 8);
    k.emplace_back(2, 10, 8);
    v.emplace_back(2, 10, 8);
  }
  for (const bool pre_rope : {true, false}) {
    auto rec = std::make_unique<Recorder>();
    const Recorder& r = *rec;
    WindowedCache cache(std::move(rec), shape, DenseType::f32);
    cache.ingest_prompt({&q, &k, pre_rope ? &k : nullptr, &v, 10});
    REQUIRE(r.key.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {  // inner layer i: model layer 2i
      CHECK(r.query[i] == &q[2 * i]);
      CHECK(r.key[i] == &k[2 * i]);
      CHECK(r.value[i] == &v[2 * i]);
    }
    CHECK(r.pre_rope_given == pre_rope);
    CHECK(r.key_pre_rope.size() == (pre_rope ? 2u : 0u));
    CHECK(cache.view(1, 0).n == 4);
    CHECK(cache.view(3, 1).n == 6);
  }
}

TEST_CASE("sliding-window layers: a quantizer takes the prompt a layer at a time as it takes it whole",
          "[windowed][model]") {
  const Model m = gemma_like();
  const std::size_t prompt = 150;
  const std::vector<std::int32_t> seq = tokens(prompt + 20, 5);
  const std::vector<std::int32_t> head(seq.begin(), seq.begin() + prompt);
  const std::unique_ptr<KvPolicy> whole = make_kv_policy(params("kivi-2"), geometry(m), 1);
  const std::unique_ptr<KvPolicy> layers = make_kv_policy(params("kivi-2"), geometry(m), 1);
  REQUIRE(layers->takes_prompt_layers());
  const PrefillResult pre = m.prefill(head, false, 1, 0, {},
                                      [&](std::size_t l, const Tensor3& q, const Tensor3& k, const Tensor3& kp, const Tensor3& v) {
                                        layers->ingest_prompt_layer(l, {&k, &kp, &v, &q, nullptr});
                                        return true;
                                      });
  whole->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt});
  CHECK(whole->bytes() == layers->bytes());
  for (std::size_t p = prompt; p < seq.size(); ++p) CHECK(m.decode(seq[p], p, *whole) == m.decode(seq[p], p, *layers));
}

TEST_CASE("sliding-window layers: a calibration file written for the model's layers gives the global layers their "
          "own heads' bits", "[windowed][model]") {
  const Model m = gemma_like();
  const std::size_t prompt = 150;
  const std::vector<std::int32_t> seq = tokens(prompt + 10, 8);
  const std::vector<std::int32_t> head(seq.begin(), seq.begin() + prompt);
  const PrefillResult pre = m.prefill(head, false, 1);
  test::TempDir dir;
  // Bits per model layer; layer 1 is the global one.
  auto calibration = [&](int global_bits, std::size_t layers) {
    CalibrationFile f;
    f.shape.kv_shape() = m.config().kv_shape();
    f.shape.n_layers = layers;
    f.params = nlohmann::json::object();
    for (std::size_t l = 0; l < layers; ++l) {
      auto& heads = f.heads.emplace_back(2);
      for (CalibrationHead& h : heads) h.bits_key = h.bits_value = l == 1 ? global_bits : 3;
    }
    const std::string path = dir.file("c" + std::to_string(global_bits) + "_" + std::to_string(layers) + ".json");
    std::ofstream(path) << calibration_to_json(f).dump();
    return path;
  };
  auto run = [&](CompressParams p) {
    std::unique_ptr<KvPolicy> cache = make_kv_policy(p, geometry(m), 1);
    cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt});
    return cache;
  };
  for (const int bits : {2, 8}) {
    INFO(bits << "-bit global layer");
    CompressParams calibrated = params("kivi");
    calibrated.calibration_file = calibration(bits, 3);
    const std::unique_ptr<KvPolicy> got = run(calibrated);
    const std::unique_ptr<KvPolicy> want = run(params("kivi:bits=" + std::to_string(bits)));
    CHECK(got->bytes() == want->bytes());
    for (std::size_t p = prompt; p < seq.size(); ++p) CHECK(m.decode(seq[p], p, *got) == m.decode(seq[p], p, *want));
  }
  // A file of another layer count (the global layers' alone) is refused, naming its shape.
  CompressParams other = params("kivi");
  other.calibration_file = calibration(8, 1);
  CHECK_THROWS_WITH(make_kv_policy(other, geometry(m), 1), Catch::Contains("shape.n_layers"));
}

TEST_CASE("sliding-window layers under chunked prefill: each chunk's queries attend within their windows; with the "
          "f32 cache the prompt's last logits and the decode equal the exact prefill's", "[windowed][model]") {
  const Model m = gemma_like();
  const std::size_t prompt = 150;
  const std::vector<std::int32_t> seq = tokens(prompt + 10, 6);
  const std::vector<std::int32_t> head(seq.begin(), seq.begin() + prompt);
  const PrefillResult all = m.prefill(seq, true, 1);
  for (const std::size_t chunk : {7, 64}) {  // chunks longer than window 5, shorter than window 100
    INFO("chunk " << chunk);
    PrefillOptions o;
    o.mode = PrefillMode(PrefillMode::chunked, chunk);
    PromptLanes lanes = prefill_lanes(m, {head}, {std::nullopt, params("kivi-2")}, seq.size(), 1, o);
    REQUIRE(lanes.caches[0]->holds_windows());
    CHECK(lanes.caches[0]->view(0, 0).n == 5);
    CHECK(lanes.caches[0]->view(0, 0).position[0] == static_cast<std::int32_t>(prompt - 5));
    Gap g;
    compare(all.logits, prompt - 1, lanes.last_logits[0], g);
    for (std::size_t p = prompt; p < seq.size(); ++p) compare(all.logits, p, m.decode(seq[p], p, *lanes.caches[0]), g);
    INFO("largest |logit difference| " << g.worst << " of logits up to " << g.scale);
    CHECK(g.worst <= 1e-4 * g.scale);
    // A method takes the global layer's chunks and decodes on.
    CHECK(lanes.caches[1]->holds_windows());
    CHECK(lanes.caches[1]->view(2, 0).n == 100);
    CHECK(m.decode(seq[prompt], prompt, *lanes.caches[1]).size() == m.config().vocab_size);
  }
}

TEST_CASE("a sliding window in every layer (Mistral): within it the methods run over every layer, past it the "
          "windowed f32 cache equals the prefill and only none and f32 run", "[windowed][model]") {
  ModelConfig c = test::small_config(2, 16, 40, 4096);
  c.layer_window = {12, 12};
  const Model m = test::random_model(c, 41, 0.3);
  REQUIRE(c.all_local());
  CHECK_FALSE(c.windowed_run(12));
  CHECK(c.windowed_run(13));
  // Within the window: no windowed cache, any method (a plain cache holds every layer).
  const KvGeometry within = run_geometry(c, 12, {params("kivi-2")});
  CHECK(within.layer_window.empty());
  CHECK_FALSE(make_kv_policy(params("kivi-2"), within, 1)->holds_windows());
  // Past it: the windowed cache; a method other than none and f32 is refused.
  CHECK_THROWS_AS(run_geometry(c, 13, {params("kivi-2")}), UsageError);
  CHECK_THROWS_AS(run_geometry(c, 13, {params("snapkv:budget=0.5")}), UsageError);
  const KvGeometry past = run_geometry(c, 60, {std::nullopt, params("none")});
  REQUIRE(past.layer_window == c.layer_window);
  const std::vector<std::int32_t> seq = tokens(60, 8);
  const PrefillResult pre = m.prefill(seq, true, 1);
  const std::unique_ptr<KvPolicy> cache = make_kv_policy(std::nullopt, past, 1);
  Gap g;
  for (std::size_t p = 0; p < seq.size(); ++p) compare(pre.logits, p, m.decode(seq[p], p, *cache), g);
  INFO("largest |logit difference| " << g.worst << " of logits up to " << g.scale);
  CHECK(g.worst <= 1e-4 * g.scale);
  CHECK(cache->view(1, 0).n == 12);
  // A plain cache is refused once a decode passes the window.
  const std::unique_ptr<KvPolicy> plain = make_kv_policy(std::nullopt, within, 1);
  for (std::size_t p = 0; p < 12; ++p) m.decode(seq[p], p, *plain);
  CHECK_THROWS_AS(m.decode(seq[12], 12, *plain), std::logic_error);
  // The window matters: the same weights without it differ past the window.
  ModelConfig g_c = c;
  g_c.layer_window.clear();
  const PrefillResult all = test::random_model(g_c, 41, 0.3).prefill(seq, true, 1);
  CHECK((all.logits.bottomRows(40) - pre.logits.bottomRows(40)).cwiseAbs().maxCoeff() > 1e-2);
  CHECK(all.logits.topRows(12) == pre.logits.topRows(12));
}
