// The chunked prompt protocol (--prefill-mode chunked:N, eval/lanes.h; kv/chunk_cache.h): each
// chunk attends exactly to its own rows and to the method's compressed cache of the earlier
// chunks, then the method compresses it. And decode-time compression (every=N:target=T) in the
// model's decode loop.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>

#include "akv/attention/kv_view.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/lanes.h"
#include "akv/eval/perplexity.h"
#include "akv/kv/runtime.h"
#include "akv/method/registry.h"
#include "random_model.h"

using namespace akv;

namespace {

CompressParams params(const std::string& spec) { return resolve_params(parse_method_spec(spec)); }

// A random Llama: 2 layers, 4 query heads over 2 KV heads of 32 dims, a 64-token vocabulary.
Model random_model() {
  return test::random_model(test::small_config(2, 32, 64, 256), 11, 0.4);
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(r.uniform() * 63.999);
  return t;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    e += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return std::sqrt(e / s);
}

// Every row of a cache head as f32 (dequantized), in view order.
std::vector<float> rows_of(const KvPolicy& c, std::size_t layer, std::size_t head, std::size_t d, bool key) {
  const KvView v = c.view(layer, head);
  std::vector<float> out;
  for (const HeadView& s : v.segments) {
    const TensorView& t = key ? s.key : s.value;
    std::vector<float> r(t.rows() * d);
    if (t.rows() > 0) dequantize_rows(t, d, 0, t.rows(), r.data());
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// A reference cache: f32 rows, set from outside between chunks.
class DenseCache : public KvPolicy {
 public:
  DenseCache(std::size_t layers, std::size_t heads, std::size_t d) : L(layers), H(heads), d(d), k(L * H), v(L * H), p(L * H) {}
  void ingest_prompt(const PromptKv&) override {}
  void append(std::size_t l, const float* key, const float*, const float* value, std::size_t pos) override {
    for (std::size_t h = 0; h < H; ++h) {
      k[l * H + h].insert(k[l * H + h].end(), key + h * d, key + (h + 1) * d);
      v[l * H + h].insert(v[l * H + h].end(), value + h * d, value + (h + 1) * d);
      p[l * H + h].push_back(static_cast<std::int32_t>(pos));
    }
  }
  KvView view(std::size_t l, std::size_t h) const override {
    return dense_kv_view(k[l * H + h].data(), v[l * H + h].data(), p[l * H + h].data(), p[l * H + h].size());
  }
  std::uint64_t bytes() const override { return 0; }
  std::size_t L, H, d;
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<std::int32_t>> p;
};

}  // namespace

TEST_CASE("prefill modes by name", "[chunked]") {
  CHECK(parse_prefill_mode("chunked:16") == PrefillMode(PrefillMode::chunked, 16));
  CHECK(prefill_mode_name(parse_prefill_mode("chunked:512")) == "chunked:512");
  CHECK(prefill_mode_name(PrefillMode::exact) == "exact");
  CHECK(parse_prefill_mode("chunked:16:replan") == PrefillMode(PrefillMode::chunked, 16, true));
  CHECK(parse_prefill_mode("chunked:16:replan") != PrefillMode(PrefillMode::chunked, 16));
  CHECK(prefill_mode_name(parse_prefill_mode("chunked:512:replan")) == "chunked:512:replan");
  for (const char* bad : {"chunked", "chunked:", "chunked:0", "chunked:x", "chunked:-3", "chunked:1e3", "chunk:4",
                          "chunked:replan", "chunked::replan", "chunked:8:replan:replan", "chunked:8:re"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_prefill_mode(bad), InvalidInput);
  }
}

TEST_CASE("chunked prefill through the full cache equals the exact prefill", "[chunked]") {
  const Model m = random_model();
  const std::vector<std::vector<std::int32_t>> prompts = {tokens(40, 1), tokens(25, 2)};
  const std::vector<std::optional<CompressParams>> methods = {std::nullopt};
  const PromptLanes exact = prefill_lanes(m, prompts, methods, 64, 2);
  for (std::size_t n : {1, 7, 16, 64}) {
    INFO("chunk " << n);
    const PromptLanes chunked = prefill_lanes(m, prompts, methods, 64, 2, {{PrefillMode::chunked, n}});
    for (std::size_t lane = 0; lane < 2; ++lane) {
      CHECK(rel(chunked.last_logits[lane], exact.last_logits[lane]) < 1e-5);
      CHECK(chunked.caches[lane]->bytes() == exact.caches[lane]->bytes());
      CHECK(rel(rows_of(*chunked.caches[lane], 1, 1, 32, true), rows_of(*exact.caches[lane], 1, 1, 32, true)) < 1e-5);
    }
    // The same for any thread count, bit for bit.
    const PromptLanes one = prefill_lanes(m, prompts, methods, 64, 1, {{PrefillMode::chunked, n}});
    CHECK(one.last_logits == chunked.last_logits);
  }
}

TEST_CASE("chunked prefill of a quantizer: each chunk over the dequantized earlier chunks and its own exact rows",
          "[chunked]") {
  const Model m = random_model();
  const std::vector<std::int32_t> prompt = tokens(48, 3);
  const std::size_t N = 20, d = 32;
  for (const std::string spec : {"kivi-2:residual=8:group=8", "uniform:bits=3:group=16", "uniform:bits=3:group=16:rotate=hadamard", "ggml:k=q4_0:v=q8_0"}) {
    INFO(spec);
    const CompressParams p = params(spec);
    const PromptLanes lanes = prefill_lanes(m, {prompt}, {p}, 64, 2, {{PrefillMode::chunked, N}});
    // Reference: each chunk decoded token by token over f32 rows - the method's cache of the
    // earlier chunks dequantized, then the chunk's own rows - and the chunk's rows fed to the
    // method afterwards (its K/V as the f32 decode computed them).
    const KvGeometry g{m.config().kv_shape(), 64};
    auto method = make_kv_policy(p, g);
    std::vector<float> last;
    for (std::size_t c0 = 0; c0 < prompt.size(); c0 += N) {
      DenseCache ref(2, 2, d);
      for (std::size_t l = 0; l < 2; ++l) {
        for (std::size_t h = 0; h < 2; ++h) {
          ref.k[l * 2 + h] = rows_of(*method, l, h, d, true);
          ref.v[l * 2 + h] = rows_of(*method, l, h, d, false);
          ref.p[l * 2 + h].assign(ref.k[l * 2 + h].size() / d, 0);
        }
      }
      const std::size_t n = std::min(N, prompt.size() - c0);
      for (std::size_t t = c0; t < c0 + n; ++t) last = m.decode(prompt[t], t, ref);
      std::vector<Tensor3> key(2), value(2), query(2);
      for (std::size_t l = 0; l < 2; ++l) {
        key[l] = Tensor3(2, n, d);
        value[l] = Tensor3(2, n, d);
        for (std::size_t h = 0; h < 2; ++h) {
          const std::size_t before = ref.k[l * 2 + h].size() / d - n;
          std::copy_n(ref.k[l * 2 + h].data() + before * d, n * d, key[l].row(h, 0));
          std::copy_n(ref.v[l * 2 + h].data() + before * d, n * d, value[l].row(h, 0));
        }
      }
      method->ingest_chunk({&query, &key, &key, &value, n, nullptr}, c0, ChunkPlan::alone);
    }
    CHECK(rel(lanes.last_logits[0], last) < 1e-4);
    CHECK(lanes.caches[0]->bytes() == method->bytes());
    CHECK(rel(rows_of(*lanes.caches[0], 1, 0, d, false), rows_of(*method, 1, 0, d, false)) < 1e-3);
    // And not the exact protocol's logits: the chunks after the first read quantized rows.
    const PromptLanes exact = prefill_lanes(m, {prompt}, {p}, 64, 2);
    CHECK(rel(lanes.last_logits[0], exact.last_logits[0]) > 1e-4);
  }
}

TEST_CASE("chunked prefill of one-shot eviction: each chunk planned alone to budget x its tokens", "[chunked]") {
  const Model m = random_model();
  const std::vector<std::int32_t> prompt = tokens(40, 4);
  const std::vector<std::optional<CompressParams>> methods = {params("snapkv:budget=0.5:window=4"),
                                                              params("adakv:budget=0.5:window=4:sinks=2"),
                                                              params("knorm:budget=0.25"),
                                                              params("expected-attention:budget=0.5:future=16")};
  const PromptLanes lanes = prefill_lanes(m, {prompt}, methods, 64, 2, {{PrefillMode::chunked, 16}});
  // Chunks 0-15, 16-31, 32-39. snapkv keeps 8 + 8 of the full chunks (their last 4 among them)
  // and the last chunk's window alone (round(0.5 x 8) = 4 does not pass it).
  for (std::size_t h = 0; h < 2; ++h) {
    const KvView v = lanes.caches[0]->view(1, h);
    std::vector<std::int32_t> pos(v.position, v.position + v.n);
    REQUIRE(pos.size() == 20);
    CHECK(std::is_sorted(pos.begin(), pos.end()));
    CHECK(std::count_if(pos.begin(), pos.end(), [](int p) { return p < 16; }) == 8);
    CHECK(std::count_if(pos.begin(), pos.end(), [](int p) { return p >= 16 && p < 32; }) == 8);
    for (int p : {12, 13, 14, 15, 28, 29, 30, 31, 36, 37, 38, 39}) CHECK(std::count(pos.begin(), pos.end(), p) == 1);
  }
  // Ada-KV spreads each chunk's budget over the layer's heads (at most 8 per head on average:
  // its safeguard rounds down); its 2 sinks in the first chunk only.
  std::size_t total = 0;
  for (std::size_t h = 0; h < 2; ++h) {
    const KvView v = lanes.caches[1]->view(0, h);
    total += v.n;
    for (int p : {0, 1, 12, 13, 14, 15, 28, 29, 30, 31, 36, 37, 38, 39}) CHECK(std::count(v.position, v.position + v.n, p) == 1);
  }
  CHECK(total <= 2 * 20);
  CHECK(total >= 2 * 14);
  // Expected Attention: 4 sinks in the first chunk, 8 per head of each full chunk, the last 8
  // tokens' 4.
  CHECK(lanes.caches[3]->view(1, 0).n == 8 + 8 + 4);
  // The first chunk's plan is the plan of those 16 tokens prefilled alone.
  const std::vector<std::int32_t> first(prompt.begin(), prompt.begin() + 16);
  const PromptLanes alone = prefill_lanes(m, {first}, {methods[0]}, 64, 2);
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      const KvView a = alone.caches[0]->view(l, h), c = lanes.caches[0]->view(l, h);
      CHECK(std::vector<std::int32_t>(a.position, a.position + a.n) == std::vector<std::int32_t>(c.position, c.position + 8));
    }
  }
  // Peak resident bytes: the earlier chunks' cache plus one chunk in f32, below the exact
  // protocol's whole prompt in f32 (2 layers x 2 heads x 40 tokens x 32 dims x K, V x 4 bytes).
  const PromptLanes exact = prefill_lanes(m, {prompt}, methods, 64, 2);
  CHECK(exact.peak_bytes[0] == 2ull * 2 * 40 * 32 * 2 * 4);
  // snapkv's most: while the second chunk runs, the first chunk's 8 kept rows per head (f16 keys
  // and values, a 4-byte position) beside the second chunk's 16 f32 rows.
  CHECK(lanes.peak_bytes[0] == 2ull * 2 * (8 * (32 * 2 * 2 + 4) + 16 * 32 * 2 * 4));
  CHECK(lanes.peak_bytes[0] < exact.peak_bytes[0]);
  CHECK(lanes.peak_bytes[0] >= lanes.caches[0]->bytes());
  // Methods the protocol cannot run.
  for (const std::string spec : {"h2o:budget=0.5", "streamingllm:budget=0.5", "kvzip:budget=0.5",
                                 "snapkv:budget-tokens=20:window=4", "snapkv:budget=0.25", "tiered"}) {
    INFO(spec);
    CHECK_THROWS_AS(prefill_lanes(m, {prompt}, {params(spec)}, 64, 1, {{PrefillMode::chunked, 16}}), UsageError);
  }
}

// The caches fed SyntheticChunks: 2 layers of the small test shape, 64 positions.
KvGeometry synthetic_geometry() {
  KvGeometry g;
  g.kv_shape() = test::small_config(2, 8, 16, 64).kv_shape();
  g.max_positions = 64;
  return g;
}

// A chunk of n synthetic rows per layer for a cache fed by hand: normal queries and values, keys of
// varied scale; each key's norm appended to norm[layer * n_kv_heads + head].
struct SyntheticChunk {
  std::vector<Tensor3> query, key, value;
  SyntheticChunk(const KvGeometry& g, std::size_t n, Rng& r, std::vector<std::vector<float>>& norm) {
    const std::size_t H = g.n_kv_heads, d = g.head_dim;
    for (std::size_t l = 0; l < g.n_layers; ++l) {
      query.emplace_back(g.n_heads, n, d);
      key.emplace_back(H, n, d);
      value.emplace_back(H, n, d);
      for (std::size_t i = 0; i < query[l].size(); ++i) query[l].data()[i] = static_cast<float>(r.normal());
      for (std::size_t i = 0; i < value[l].size(); ++i) value[l].data()[i] = static_cast<float>(r.normal());
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t t = 0; t < n; ++t) {
          double ss = 0;
          for (std::size_t j = 0; j < d; ++j) {
            const float x = static_cast<float>(r.normal() * (0.5 + r.uniform()));
            key[l].row(h, t)[j] = x;
            ss += static_cast<double>(x) * x;
          }
          norm[l * H + h].push_back(static_cast<float>(std::sqrt(ss)));
        }
      }
    }
  }
};

TEST_CASE("chunked prefill with a threshold: each chunk keeps what passes, its last W rows and (the first) the "
          "sinks", "[chunked]") {
  // knorm:threshold=-T: a row stays while |k| <= T (a brute-force reference over the true rows).
  const KvGeometry g = synthetic_geometry();
  const std::size_t L = g.n_layers, H = g.n_kv_heads, N = 10, W = 2, sinks = 1;
  const float T = 4.0f;
  auto cache = make_kv_policy(params("knorm:threshold=-4:window=2:sinks=1"), g, 1);
  Rng r(9);
  std::vector<std::vector<float>> norm(L * H);        // [layer * H + head][position]: |k|
  std::vector<std::vector<std::int32_t>> kept(L * H);  // the reference's kept positions
  std::size_t dropped = 0;
  for (std::size_t c0 = 0; c0 < 37; c0 += N) {
    const std::size_t n = std::min<std::size_t>(N, 37 - c0);
    SyntheticChunk c(g, n, r, norm);
    for (std::size_t i = 0; i < L * H; ++i) {
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t pos = c0 + t;
        if (pos < sinks || t + W >= n || norm[i][pos] <= T) {
          kept[i].push_back(static_cast<std::int32_t>(pos));
        } else {
          ++dropped;
        }
      }
    }
    cache->ingest_chunk({&c.query, &c.key, &c.key, &c.value, n, nullptr}, c0, ChunkPlan::alone);
    for (std::size_t i = 0; i < L * H; ++i) {
      const KvView v = cache->view(i / H, i % H);
      INFO("chunk at " << c0 << ", layer " << i / H << ", head " << i % H);
      CHECK(std::vector<std::int32_t>(v.position, v.position + v.n) == kept[i]);
    }
  }
  CHECK(dropped > 0);
  // Re-planning cuts to a budget; the decoding queue spans chunks: both refused by the protocol.
  const Model m = random_model();
  CHECK_THROWS_AS(prefill_lanes(m, {tokens(40, 4)}, {params("knorm:threshold=-4:decoding=on")}, 64, 1,
                                {{PrefillMode::chunked, 16}}),
                  UsageError);
  CHECK_THROWS_AS(prefill_lanes(m, {tokens(40, 4)}, {params("knorm:threshold=-4")}, 64, 1, {{PrefillMode::chunked, 16, true}}),
                  UsageError);
}

TEST_CASE("chunked:N:replan: after each chunk the whole cache is cut back to budget x the tokens so far",
          "[chunked]") {
  // The method's cache fed chunks of synthetic rows: knorm keeps, per head, its sinks, the newest
  // W rows and the smallest-norm keys among the rest of what it held before and the chunk's rows
  // (a brute-force reference over the true rows).
  const KvGeometry g = synthetic_geometry();
  const std::size_t L = g.n_layers, H = g.n_kv_heads, N = 10, W = 2, sinks = 1;
  const double budget = 0.4;
  auto cache = make_kv_policy(params("knorm:budget=0.4:window=2:sinks=1"), g, 1);
  Rng r(5);
  std::vector<std::vector<float>> norm(L * H);              // [layer * H + head][position]: |k|
  std::vector<std::vector<std::int32_t>> kept(L * H);        // the reference's kept positions
  for (std::size_t c0 = 0; c0 < 37; c0 += N) {
    const std::size_t n = std::min<std::size_t>(N, 37 - c0);
    SyntheticChunk c(g, n, r, norm);
    cache->ingest_chunk({&c.query, &c.key, &c.key, &c.value, n, nullptr}, c0, ChunkPlan::whole);
    const std::size_t target = static_cast<std::size_t>(std::llround(budget * static_cast<double>(c0 + n)));
    for (std::size_t i = 0; i < L * H; ++i) {
      std::vector<std::int32_t> all = kept[i], forced, rest;
      for (std::size_t t = c0; t < c0 + n; ++t) all.push_back(static_cast<std::int32_t>(t));
      for (std::size_t j = 0; j < all.size(); ++j) {
        (static_cast<std::size_t>(all[j]) < sinks || j + W >= all.size() ? forced : rest).push_back(all[j]);
      }
      std::stable_sort(rest.begin(), rest.end(), [&](std::int32_t a, std::int32_t b) { return norm[i][a] < norm[i][b]; });
      rest.resize(std::min(rest.size(), target - std::min(target, sinks + W)));
      kept[i] = forced;
      kept[i].insert(kept[i].end(), rest.begin(), rest.end());
      std::sort(kept[i].begin(), kept[i].end());
      const KvView v = cache->view(i / H, i % H);
      INFO("chunk at " << c0 << ", layer " << i / H << ", head " << i % H);
      CHECK(std::vector<std::int32_t>(v.position, v.position + v.n) == kept[i]);
      CHECK(v.n == std::max(target, forced.size()));
    }
  }
}

TEST_CASE("chunked:N:replan through the model: one chunk is chunked:N's plan; later chunks re-plan the whole "
          "cache", "[chunked]") {
  const Model m = random_model();
  const std::vector<std::int32_t> prompt = tokens(40, 4);
  const std::vector<std::optional<CompressParams>> methods = {params("snapkv:budget=0.5:window=4"),
                                                              params("adakv:budget=0.5:window=4:sinks=2")};
  // A prompt in one chunk: the same kept rows and logits as chunked:N (the chunk planned alone).
  const PromptLanes one = prefill_lanes(m, {prompt}, methods, 64, 2, {{PrefillMode::chunked, 64, true}});
  const PromptLanes alone = prefill_lanes(m, {prompt}, methods, 64, 2, {{PrefillMode::chunked, 64}});
  for (std::size_t lane = 0; lane < 2; ++lane) {
    CHECK(one.last_logits[lane] == alone.last_logits[lane]);
    for (std::size_t h = 0; h < 2; ++h) {
      const KvView a = one.caches[lane]->view(1, h), b = alone.caches[lane]->view(1, h);
      CHECK(std::vector<std::int32_t>(a.position, a.position + a.n) == std::vector<std::int32_t>(b.position, b.position + b.n));
    }
  }
  // Chunks of 16: snapkv ends at round(0.5 x 40) = 20 rows per head, its window the prompt's last
  // 4; positions of every chunk may go (chunked:16 keeps 8 + 8 + 4 by chunk).
  const PromptLanes re = prefill_lanes(m, {prompt}, methods, 64, 2, {{PrefillMode::chunked, 16, true}});
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      const KvView v = re.caches[0]->view(l, h);
      REQUIRE(v.n == 20);
      CHECK(std::is_sorted(v.position, v.position + v.n));
      for (int p : {36, 37, 38, 39}) CHECK(std::count(v.position, v.position + v.n, p) == 1);
    }
  }
  // Ada-KV's 2 sinks stay through every cut.
  for (std::size_t h = 0; h < 2; ++h) {
    const KvView v = re.caches[1]->view(0, h);
    for (int p : {0, 1, 36, 37, 38, 39}) CHECK(std::count(v.position, v.position + v.n, p) == 1);
  }
  CHECK(prefill_lanes(m, {prompt}, methods, 64, 1, {{PrefillMode::chunked, 16, true}}).last_logits == re.last_logits);
  // Scores and allocators the cut cannot take.
  for (const std::string spec : {"expected-attention:budget=0.5", "tova:budget=0.5", "pyramid:budget=0.5:window=4",
                                 "snapkv:budget=0.5:window=4:critical=on", "snapkv:budget=0.5:window=4:quant=k4v2"}) {
    INFO(spec);
    CHECK_THROWS_AS(prefill_lanes(m, {prompt}, {params(spec)}, 64, 1, {{PrefillMode::chunked, 16, true}}), UsageError);
  }
}

TEST_CASE("decode-time compression in the model: the memory trace falls back to the target every N tokens",
          "[chunked][decode_compression]") {
  const Model m = random_model();
  PplOptions o;
  o.methods = {{"snapkv:budget=0.5:window=4:every=8:target=20", params("snapkv:budget=0.5:window=4:every=8:target=20")},
               {"snapkv:budget=0.5:window=4", params("snapkv:budget=0.5:window=4")}};
  o.prefill = 40;
  o.threads = 2;
  const PplReport r = evaluate_perplexity(m, {tokens(80, 7), tokens(70, 8)}, o, {});
  // Sequence 0: the prompt keeps 20 rows per head; the cut after every 8th decoded token takes
  // each head back to 20 rows: 2 layers x 2 heads x rows x (f16 K and V + a 4-byte position).
  const MemoryTrace& t = r.traces[1];
  const std::uint64_t row = 2 * 2 * (32 * 2 * 2 + 4);
  REQUIRE(t.tokens.size() == t.bytes.size());
  for (std::size_t i = 0; i < t.tokens.size(); ++i) {
    const std::size_t decoded = t.tokens[i] - 40;  // tokens appended after the prompt
    INFO("tokens " << t.tokens[i]);
    CHECK(t.bytes[i] == row * (20 + decoded % 8));
  }
  // Without it the cache only grows.
  CHECK(r.traces[2].bytes.back() == row * (20 + 39));
  // Peak resident: the prompt's f32 K/V (40 tokens) before the plan, above anything held later.
  const nlohmann::json j = r.to_json();
  CHECK(j["methods"][1]["mean_peak_kv_bytes"].get<double>() == 40.0 * 2 * 2 * 32 * 2 * 4);
  CHECK(j["methods"][0]["mean_peak_kv_bytes"].get<double>() == (79.0 + 69.0) / 2 * 2 * 2 * 32 * 2 * 4);  // full: f32 at the end
  CHECK(std::isfinite(r.total(1).ppl()));
  CHECK(r.descriptions[1].find("every 8 to 20") != std::string::npos);
  // Thread count does not change it.
  o.threads = 1;
  CHECK(evaluate_perplexity(m, {tokens(80, 7), tokens(70, 8)}, o, {}).to_json() == r.to_json());
}
