#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "akv/alloc/eviction.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/lanes.h"
#include "akv/eval/passkey.h"
#include "akv/eval/perplexity.h"
#include "akv/io/token_file.h"
#include "akv/kv/runtime.h"
#include "akv/method/registry.h"
#include "akv/model/llama2c.h"
#include "akv/model/tokenizer.h"
#include "akv/tensor/half.h"
#include "random_model.h"
#include "test_util.h"

using namespace akv;
using test::have_shared;
using test::shared_dir;

namespace {

// Reference StreamingLLM: f16 rows, keeps the first `sinks` rows and the newest `keep - sinks`.
class SlidingReference : public KvPolicy {
 public:
  SlidingReference(std::size_t layers, std::size_t heads, std::size_t d, std::size_t sinks, std::size_t keep)
      : heads_(heads), d_(d), sinks_(sinks), keep_(keep), k_(layers * heads), v_(layers * heads), p_(layers * heads) {}
  void ingest_prompt(const PromptKv& pr) override {
    for (std::size_t i = 0; i < k_.size(); ++i) {
      const std::size_t l = i / heads_, h = i % heads_;
      for (std::size_t t = 0; t < pr.n_tokens; ++t) add(i, pr.key[l].row(h, t), pr.value[l].row(h, t), t);
    }
  }
  void append(std::size_t l, const float* k, const float*, const float* v, std::size_t pos) override {
    for (std::size_t h = 0; h < heads_; ++h) add(l * heads_ + h, k + h * d_, v + h * d_, pos);
  }
  void end_step() override {
    for (std::size_t i = 0; i < k_.size(); ++i) {
      while (p_[i].size() > keep_) {
        k_[i].erase(k_[i].begin() + static_cast<std::ptrdiff_t>(sinks_ * d_), k_[i].begin() + static_cast<std::ptrdiff_t>((sinks_ + 1) * d_));
        v_[i].erase(v_[i].begin() + static_cast<std::ptrdiff_t>(sinks_ * d_), v_[i].begin() + static_cast<std::ptrdiff_t>((sinks_ + 1) * d_));
        p_[i].erase(p_[i].begin() + static_cast<std::ptrdiff_t>(sinks_));
      }
    }
  }
  KvView view(std::size_t l, std::size_t h) const override {
    const std::size_t i = l * heads_ + h;
    return dense_kv_view(k_[i].data(), v_[i].data(), p_[i].data(), p_[i].size());
  }
  std::uint64_t bytes() const override { return 0; }

 private:
  void add(std::size_t i, const float* k, const float* v, std::size_t pos) {
    for (std::size_t j = 0; j < d_; ++j) {
      k_[i].push_back(f16_to_f32_ref(f32_to_f16_ref(k[j])));
      v_[i].push_back(f16_to_f32_ref(f32_to_f16_ref(v[j])));
    }
    p_[i].push_back(static_cast<std::int32_t>(pos));
  }
  std::size_t heads_, d_, sinks_, keep_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<std::int32_t>> p_;
};

CompressParams params(const std::string& spec) { return resolve_params(parse_method_spec(spec)); }

// Reference H2O during decode: f16 rows in chronological order, erased from the middle. The
// prompt is cut by plan_eviction with the accumulated attention of every prompt query as the
// initial scores; each step adds (KV heads / query heads) x the reported probabilities, then
// evicts, while over budget, the lowest-scored row (the first of equals) outside the first
// `sinks` positions and the last `window` rows.
class H2OReference : public KvPolicy {
 public:
  H2OReference(const KvGeometry& g, const EvictionParams& e)
      : g_(g), e_(e), rows_(g.n_layers * g.n_kv_heads) {}
  void ingest_prompt(const PromptKv& pr) override {
    const std::size_t n = pr.n_tokens;
    const KvWindow m = g_.prompt_window(n, n);
    const EvictionPlan plan = plan_eviction(
        m, [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3*) {
          q = pr.query[l];
          k = pr.key[l];
        },
        e_, 1, {});
    ScoreOptions so = e_.score;
    so.window = std::min(so.window, n);
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
        Head& r = rows_[l * g_.n_kv_heads + h];
        const HeadScores hs = score_head(pr.query[l], pr.key[l], h, m, so);
        r.budget = plan.heads[l][h].tokens;
        for (std::int32_t t : plan.heads[l][h].kept) {
          const auto u = static_cast<std::size_t>(t);
          add(r, pr.key[l].row(h, u), pr.value[l].row(h, u), u, hs.score[u]);
        }
      }
    }
  }
  void append(std::size_t l, const float* k, const float*, const float* v, std::size_t pos) override {
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      add(rows_[l * g_.n_kv_heads + h], k + h * g_.head_dim, v + h * g_.head_dim, pos, 0.0);
    }
  }
  bool wants_probs() const override { return true; }
  void observe(std::size_t l, std::size_t h, const float* probs) override {
    Head& r = rows_[l * g_.n_kv_heads + h];
    const double w = static_cast<double>(g_.n_kv_heads) / static_cast<double>(g_.n_heads);
    for (std::size_t i = 0; i < r.score.size(); ++i) r.score[i] += w * probs[i];
  }
  void end_step() override {
    const std::size_t d = g_.head_dim;
    for (Head& r : rows_) {
      while (r.pos.size() > r.budget) {
        const std::size_t n = r.pos.size(), last = n - std::min(n, e_.score.window);
        std::size_t victim = n;
        for (std::size_t i = 0; i < last; ++i) {
          if (static_cast<std::size_t>(r.pos[i]) < e_.sinks) continue;
          if (victim == n || r.score[i] < r.score[victim]) victim = i;
        }
        if (victim == n) break;
        const auto at = static_cast<std::ptrdiff_t>(victim);
        r.k.erase(r.k.begin() + at * static_cast<std::ptrdiff_t>(d), r.k.begin() + (at + 1) * static_cast<std::ptrdiff_t>(d));
        r.v.erase(r.v.begin() + at * static_cast<std::ptrdiff_t>(d), r.v.begin() + (at + 1) * static_cast<std::ptrdiff_t>(d));
        r.pos.erase(r.pos.begin() + at);
        r.score.erase(r.score.begin() + at);
      }
    }
  }
  KvView view(std::size_t l, std::size_t h) const override {
    const Head& r = rows_[l * g_.n_kv_heads + h];
    return dense_kv_view(r.k.data(), r.v.data(), r.pos.data(), r.pos.size());
  }
  std::uint64_t bytes() const override { return 0; }

 private:
  struct Head {
    std::vector<float> k, v;
    std::vector<std::int32_t> pos;
    std::vector<double> score;
    std::size_t budget = 0;
  };
  void add(Head& r, const float* k, const float* v, std::size_t pos, double score) {
    for (std::size_t j = 0; j < g_.head_dim; ++j) {
      r.k.push_back(f16_to_f32_ref(f32_to_f16_ref(k[j])));
      r.v.push_back(f16_to_f32_ref(f32_to_f16_ref(v[j])));
    }
    r.pos.push_back(static_cast<std::int32_t>(pos));
    r.score.push_back(score);
  }
  KvGeometry g_;
  EvictionParams e_;
  std::vector<Head> rows_;
};

}  // namespace

TEST_CASE("runtime cache after the prompt equals akv compress of the same tokens", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::int32_t> prompt(seqs[2].begin(), seqs[2].begin() + 200);
  const PrefillResult pre = m.prefill(prompt, false);
  const ModelConfig& c = m.config();
  const KvGeometry g{c.kv_shape(), c.seq_len};
  const RopeTable table(c.head_dim, c.rope_theta, 0, c.seq_len);
  for (const std::string spec : {"kivi-2", "kivi-2:quant-rule=bounded", "k4v3:outlier-fraction=0.25:pre-rope",
                                 "uniform:bits=3", "adakv:budget=0.4:window=16:quant=kivi-4"}) {
    const CompressParams p = params(spec);
    auto cache = make_kv_policy(p, g);
    cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, 200});
    std::uint64_t bytes = 0;
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      for (std::size_t h = 0; h < c.n_kv_heads; ++h) {
        const KvView v = cache->view(l, h);
        HeadInput in;
        std::vector<std::int32_t> kept(v.position, v.position + v.n);
        std::vector<float> k, kp, val;
        for (std::int32_t t : kept) {
          k.insert(k.end(), pre.key[l].row(h, static_cast<std::size_t>(t)), pre.key[l].row(h, static_cast<std::size_t>(t)) + c.head_dim);
          kp.insert(kp.end(), pre.key_pre_rope[l].row(h, static_cast<std::size_t>(t)), pre.key_pre_rope[l].row(h, static_cast<std::size_t>(t)) + c.head_dim);
          val.insert(val.end(), pre.value[l].row(h, static_cast<std::size_t>(t)), pre.value[l].row(h, static_cast<std::size_t>(t)) + c.head_dim);
        }
        in.key = k.data();
        in.key_pre_rope = kp.data();
        in.value = val.data();
        in.n = kept.size();
        in.n_tokens = 200;
        in.head_dim = c.head_dim;
        if (kept.size() < 200) in.kept = kept;
        const HeadCache hc = compress_head(in, p);
        std::vector<float> rk(kept.size() * c.head_dim), rv(rk.size());
        reconstruct_head(hc, {c.rope_layout, &table}, rk.data(), rv.data());
        INFO(spec << " layer " << l << " head " << h);
        std::vector<float> vk(rk.size()), vv(rv.size());
        dequantize_rows(v.segments[0].key, c.head_dim, 0, v.n, vk.data());
        dequantize_rows(v.segments[0].value, c.head_dim, 0, v.n, vv.data());
        CHECK(vk == rk);
        CHECK(vv == rv);
        bytes += hc.bytes().total();
      }
    }
    CHECK(cache->bytes() == bytes);
  }
}

// A synthetic cache geometry: L layers, H KV heads of head_dim d, 4 query heads, 512 positions.
KvGeometry small_geometry(std::size_t L, std::size_t H, std::size_t d) {
  KvGeometry g;
  g.n_layers = L;
  g.n_heads = 4;
  g.n_kv_heads = H;
  g.head_dim = d;
  g.max_positions = 512;
  return g;
}

TEST_CASE("kvzap takes the prompt a layer at a time, its scores with each layer, as whole (threshold, global "
          "bottom-k)", "[runtime]") {
  const std::size_t L = 3, H = 2, d = 8, n = 96;
  const KvGeometry g = small_geometry(L, H, d);
  Rng rng(21);
  auto fill = [&](std::size_t rows, std::size_t heads) {
    Tensor3 t(heads, rows, d);
    for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(rng.normal());
    return t;
  };
  std::vector<Tensor3> q, k, v;
  TokenScores scores(L, std::vector<std::vector<double>>(H, std::vector<double>(n)));
  for (std::size_t l = 0; l < L; ++l) {
    q.push_back(fill(16, 4));
    k.push_back(fill(n, H));
    v.push_back(fill(n, H));
    for (auto& head : scores[l]) {
      for (double& x : head) x = rng.normal();
    }
  }
  // The surrogate file is read by whoever computes the scores (eval/lanes.h), not by the prompt's cache.
  const CompressParams p = params("kvzap:surrogate=unread.json:threshold=0.3:window=16");
  // kvzap's own allocation, the bottom-k over every head of every layer: the layers stored whole
  // as they come, cut after the last; with quant= the prefill keeps the prompt for it instead.
  const CompressParams global = params("kvzap:surrogate=unread.json:budget=0.3");
  auto whole_global = make_kv_policy(global, g), layers_global = make_kv_policy(global, g);
  REQUIRE(layers_global->takes_prompt_layers());
  CHECK(!make_kv_policy(params("kvzap:surrogate=unread.json:budget=0.3:quant=kivi-4"), g)->takes_prompt_layers());
  whole_global->ingest_prompt({&q, &k, &k, &v, n, &scores});
  for (std::size_t l = 0; l < L; ++l) layers_global->ingest_prompt_layer(l, {&k[l], &k[l], &v[l], &q[l], &scores[l]});
  CHECK(whole_global->bytes() == layers_global->bytes());
  std::size_t kept = 0;
  for (std::size_t l = 0; l < L; ++l) {
    for (std::size_t h = 0; h < H; ++h) {
      const KvView a = whole_global->view(l, h), b = layers_global->view(l, h);
      REQUIRE(a.n == b.n);
      CHECK(std::equal(a.position, a.position + a.n, b.position));
      CHECK(std::equal(static_cast<const std::uint16_t*>(a.segments[0].key.dense.data),
                       static_cast<const std::uint16_t*>(a.segments[0].key.dense.data) + a.n * d,
                       static_cast<const std::uint16_t*>(b.segments[0].key.dense.data)));
      kept += a.n;
    }
  }
  CHECK(kept == static_cast<std::size_t>(std::llround(0.3 * n)) * L * H);
  auto whole = make_kv_policy(p, g), layers = make_kv_policy(p, g);
  REQUIRE(layers->takes_prompt_layers());
  whole->ingest_prompt({&q, &k, &k, &v, n, &scores});
  for (std::size_t l = 0; l < L; ++l) layers->ingest_prompt_layer(l, {&k[l], &k[l], &v[l], &q[l], &scores[l]});
  CHECK(whole->bytes() == layers->bytes());
  for (std::size_t l = 0; l < L; ++l) {
    for (std::size_t h = 0; h < H; ++h) {
      const KvView a = whole->view(l, h), b = layers->view(l, h);
      std::vector<std::int32_t> want;  // 4 sinks, the last 16, and every score >= 0.3
      for (std::size_t t = 0; t < n; ++t) {
        if (t < 4 || t + 16 >= n || scores[l][h][t] >= 0.3) want.push_back(static_cast<std::int32_t>(t));
      }
      CHECK(std::vector<std::int32_t>(a.position, a.position + a.n) == want);
      CHECK(std::vector<std::int32_t>(b.position, b.position + b.n) == want);
    }
  }
  // Without the layer's scores the planner refuses, as a dump without attention inputs.
  auto bare = make_kv_policy(p, g);
  CHECK_THROWS_AS(bare->ingest_prompt_layer(0, {&k[0], &k[0], &v[0], &q[0]}), UsageError);
}

TEST_CASE("runtime decode: KIVI's key residual fills to R, then R keys are quantized at once", "[runtime]") {
  const std::size_t L = 1, H = 2, d = 32, n0 = 100;
  const KvGeometry g = small_geometry(L, H, d);
  CompressParams p = params("kivi-2:residual=64");
  auto cache = make_kv_policy(p, g);
  Rng rng(5);
  auto fill = [&](std::size_t n) {
    Tensor3 t(H, n, d);
    for (std::size_t i = 0; i < H * n * d; ++i) t.data()[i] = static_cast<float>(rng.normal());
    return t;
  };
  std::vector<Tensor3> q{Tensor3(4, n0, d)}, k{fill(n0)}, v{fill(n0)};
  cache->ingest_prompt({&q, &k, &k, &v, n0});
  std::vector<float> row(H * d, 0.5f);
  for (std::size_t n = n0; n <= 200; ++n) {
    const KvView view = cache->view(0, 1);
    INFO("tokens " << n);
    CHECK(view.segments[0].key.packed.rows == n - n % 64);  // KIVI: 64, then 128 at token 128...
    CHECK(view.segments[0].value.packed.rows == n - 64);    // the newest 64 values in f16
    if (n < 200) cache->append(0, row.data(), row.data(), row.data(), n);
  }
}

// Drives two caches with the same rows: the model attends over (and reports to) the first.
class TeePolicy : public KvPolicy {
 public:
  TeePolicy(KvPolicy& a, KvPolicy& b) : a_(a), b_(b) {}
  void ingest_prompt(const PromptKv& p) override {
    a_.ingest_prompt(p);
    b_.ingest_prompt(p);
  }
  void append(std::size_t l, const float* k, const float* kp, const float* v, std::size_t pos) override {
    a_.append(l, k, kp, v, pos);
    b_.append(l, k, kp, v, pos);
  }
  KvView view(std::size_t l, std::size_t h) const override { return a_.view(l, h); }
  bool wants_probs() const override { return a_.wants_probs(); }
  // The second cache gets the same probabilities, matched to its rows by position.
  void observe(std::size_t l, std::size_t h, const float* probs) override {
    a_.observe(l, h, probs);
    if (!b_.wants_probs()) return;
    const KvView va = a_.view(l, h), vb = b_.view(l, h);
    std::map<std::int32_t, float> by_position;
    for (std::size_t i = 0; i < va.n; ++i) by_position[va.position[i]] = probs[i];
    std::vector<float> pb(vb.n);
    for (std::size_t i = 0; i < vb.n; ++i) pb[i] = by_position.at(vb.position[i]);
    b_.observe(l, h, pb.data());
  }
  void end_step() override {
    a_.end_step();
    b_.end_step();
  }
  std::uint64_t bytes() const override { return a_.bytes(); }

 private:
  KvPolicy &a_, &b_;
};
TEST_CASE("runtime decode: a cache grown token by token equals one that took the same tokens at once", "[runtime]") {
  // Per-token values leave the f16 window every step and keys leave it a group at a time: the
  // window and the quantization queue drop rows from their fronts (compacting now and then).
  // Without outlier channels (chosen from the first rows quantized, which differ) the stored
  // codes, the rows attention reads (pre-RoPE keys: dequantized and rotated) and the bytes
  // must equal those of one ingest of all the tokens.
  const std::size_t L = 2, H = 2, d = 32, n0 = 70, n = 300;
  const KvGeometry g = small_geometry(L, H, d);
  Rng rng(11);
  auto fill = [&](std::size_t rows) {
    Tensor3 t(H, rows, d);
    for (std::size_t i = 0; i < H * rows * d; ++i) t.data()[i] = static_cast<float>(rng.normal());
    return t;
  };
  std::vector<Tensor3> q, k, kp, v;
  for (std::size_t l = 0; l < L; ++l) {
    q.push_back(Tensor3(4, n, d));
    k.push_back(fill(n));
    kp.push_back(fill(n));
    v.push_back(fill(n));
  }
  auto head_rows = [&](const std::vector<Tensor3>& t, std::size_t l, std::size_t h, std::size_t pos) {
    return t[l].row(h, pos);
  };
  for (const std::string spec : {"kivi-2", "kivi-4:residual=48:group=16", "kivi-2:pre-rope", "uniform:bits=3"}) {
    INFO(spec);
    const CompressParams p = params(spec);
    auto grown = make_kv_policy(p, g), whole = make_kv_policy(p, g);
    whole->ingest_prompt({&q, &k, &kp, &v, n});
    // The prompt's first n0 tokens, then one token at a time.
    std::vector<Tensor3> q0, k0, kp0, v0;
    for (std::size_t l = 0; l < L; ++l) {
      q0.push_back(Tensor3(4, n0, d));
      k0.push_back(Tensor3(H, n0, d));
      kp0.push_back(Tensor3(H, n0, d));
      v0.push_back(Tensor3(H, n0, d));
      for (std::size_t h = 0; h < H; ++h) {
        std::copy_n(k[l].row(h, 0), n0 * d, k0[l].row(h, 0));
        std::copy_n(kp[l].row(h, 0), n0 * d, kp0[l].row(h, 0));
        std::copy_n(v[l].row(h, 0), n0 * d, v0[l].row(h, 0));
      }
    }
    grown->ingest_prompt({&q0, &k0, &kp0, &v0, n0});
    std::vector<float> key(H * d), key_pre(H * d), value(H * d);
    for (std::size_t pos = n0; pos < n; ++pos) {
      for (std::size_t l = 0; l < L; ++l) {
        for (std::size_t h = 0; h < H; ++h) {
          std::copy_n(head_rows(k, l, h, pos), d, key.data() + h * d);
          std::copy_n(head_rows(kp, l, h, pos), d, key_pre.data() + h * d);
          std::copy_n(head_rows(v, l, h, pos), d, value.data() + h * d);
        }
        grown->append(l, key.data(), key_pre.data(), value.data(), pos);
      }
      grown->end_step();
    }
    CHECK(grown->bytes() == whole->bytes());
    for (std::size_t l = 0; l < L; ++l) {
      for (std::size_t h = 0; h < H; ++h) {
        const KvView a = grown->view(l, h), b = whole->view(l, h);
        REQUIRE(a.n == n);
        REQUIRE(b.n == n);
        CHECK(a.segments[0].key.packed.rows == b.segments[0].key.packed.rows);
        CHECK(a.segments[0].value.packed.rows == b.segments[0].value.packed.rows);
        std::vector<float> ka(n * d), kb(n * d), va(n * d), vb(n * d);
        dequantize_rows(a.segments[0].key, d, 0, n, ka.data());
        dequantize_rows(b.segments[0].key, d, 0, n, kb.data());
        dequantize_rows(a.segments[0].value, d, 0, n, va.data());
        dequantize_rows(b.segments[0].value, d, 0, n, vb.data());
        CHECK(ka == kb);
        CHECK(va == vb);
        CHECK(std::equal(a.position, a.position + n, b.position));
      }
    }
  }
}

// A head's rows by position: position -> key and value row (dequantized view).
std::map<std::int32_t, std::vector<float>> rows_by_position(const KvPolicy& p, std::size_t l, std::size_t h, std::size_t d) {
  const KvView v = p.view(l, h);
  std::vector<float> k(v.n * d), val(v.n * d);
  dequantize_rows(v.segments[0].key, d, 0, v.n, k.data());
  dequantize_rows(v.segments[0].value, d, 0, v.n, val.data());
  std::map<std::int32_t, std::vector<float>> m;
  for (std::size_t i = 0; i < v.n; ++i) {
    std::vector<float> r(k.begin() + static_cast<std::ptrdiff_t>(i * d), k.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    r.insert(r.end(), val.begin() + static_cast<std::ptrdiff_t>(i * d), val.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    m[v.position[i]] = std::move(r);
  }
  return m;
}

// Decodes the 100 tokens after position P with attention reading `cache`, `ref` receiving the
// same rows and probabilities (TeePolicy); after every step both must hold the same `budget`
// rows at the same positions, bit for bit, and in the end the cache's rows must be out of
// chronological order (so that the order-free bookkeeping was exercised).
void decode_same_rows(const Model& m, const std::vector<std::int32_t>& seq, std::size_t P, KvPolicy& cache,
                      KvPolicy& ref, std::size_t budget) {
  const ModelConfig& c = m.config();
  TeePolicy tee(cache, ref);
  bool unordered = false;
  for (std::size_t pos = P; pos < P + 100; ++pos) {
    m.decode(seq[pos], pos, tee);
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      for (std::size_t h = 0; h < c.n_kv_heads; ++h) {
        INFO("position " << pos << " layer " << l << " head " << h);
        REQUIRE(rows_by_position(cache, l, h, c.head_dim) == rows_by_position(ref, l, h, c.head_dim));
        const KvView v = cache.view(l, h);
        REQUIRE(v.n == budget);
        unordered = unordered || !std::is_sorted(v.position, v.position + v.n);
      }
    }
  }
  CHECK(unordered);
}

TEST_CASE("runtime streamingllm keeps the rows of a plain sliding-window reference", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const auto& seq = seqs[5];
  const std::size_t P = 100;
  const PrefillResult pre = m.prefill(std::vector<std::int32_t>(seq.begin(), seq.begin() + P), false);
  const ModelConfig& c = m.config();
  const KvGeometry g{c.kv_shape(), c.seq_len};
  // The runtime cache replaces an evicted row by its last row, so its rows are in another order
  // than the reference's; attention reads the runtime cache, both receive the same rows, and
  // after every step both hold the same rows (bit for bit) at the same positions.
  auto cache = make_kv_policy(params("streamingllm:budget-tokens=60:window=16"), g);
  SlidingReference ref(c.n_layers, c.n_kv_heads, c.head_dim, 4, 60);
  const PromptKv pk{&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P};
  cache->ingest_prompt(pk);
  ref.ingest_prompt(pk);
  ref.end_step();  // the prompt is cut to the budget too
  decode_same_rows(m, seq, P, *cache, ref, 60);
}

TEST_CASE("runtime h2o keeps the rows of a plain chronological H2O reference", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const auto& seq = seqs[4];
  const std::size_t P = 100;
  const PrefillResult pre = m.prefill(std::vector<std::int32_t>(seq.begin(), seq.begin() + P), false);
  const ModelConfig& c = m.config();
  const KvGeometry g{c.kv_shape(), c.seq_len};
  const CompressParams p = params("h2o:budget-tokens=60:window=16");
  auto cache = make_kv_policy(p, g);
  H2OReference ref(g, *p.eviction());
  const PromptKv pk{&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P};
  cache->ingest_prompt(pk);
  ref.ingest_prompt(pk);
  decode_same_rows(m, seq, P, *cache, ref, 60);
}

TEST_CASE("perplexity through compressed caches on stories260K", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  PplOptions o;
  for (const std::string spec : {"none", "kivi:bits=8", "kivi-4", "kivi-2", "snapkv:budget=1:window=16"}) {
    o.methods.push_back({spec, params(spec)});
  }
  o.max_sequences = 6;
  o.threads = 2;
  const PplReport r = evaluate_perplexity(m, seqs, o, {});
  const double full = r.total(0).ppl();
  auto ppl = [&](std::size_t i) { return r.total(i).ppl(); };
  INFO("full " << full << " none " << ppl(1) << " kivi8 " << ppl(2) << " kivi4 " << ppl(3) << " kivi2 " << ppl(4));
  CHECK(std::fabs(ppl(1) / full - 1) < 1e-3);  // f16 storage
  CHECK(std::fabs(ppl(2) / full - 1) < 5e-3);  // 8-bit KIVI within 0.5%
  CHECK(ppl(4) > ppl(3));                      // 2-bit worse than 4-bit
  CHECK(ppl(3) > ppl(2));
  CHECK(ppl(5) == Approx(ppl(1)).epsilon(1e-12));  // a full budget keeps everything
  CHECK(r.total(1).bytes < r.total(0).bytes);
  // Same report on one thread.
  o.threads = 1;
  CHECK(evaluate_perplexity(m, seqs, o, {}).to_json() == r.to_json());
  // Streaming eviction does not combine with quantization in the model.
  const KvGeometry g{{5, 8, 4, 8, 10000.0, RopeLayout::interleaved, ""}, 512};
  CHECK_THROWS_AS(make_kv_policy(params("h2o:budget=0.5:quant=kivi-2"), g), UsageError);
}

TEST_CASE("batch prefill (llama.cpp's protocol): the prompt decoded through each cache", "[runtime][batch]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const std::vector<std::vector<std::int32_t>> prompts = {{seqs[0].begin(), seqs[0].begin() + 40},
                                                          {seqs[1].begin(), seqs[1].begin() + 25}};
  const std::vector<std::optional<CompressParams>> methods = {std::nullopt, params("kivi-4"), params("none")};
  const PromptLanes exact = prefill_lanes(m, prompts, methods, 64, 2);
  const PromptLanes batch = prefill_lanes(m, prompts, methods, 64, 2, {PrefillMode::batch, AttentionMode::llama, 7});
  const KvGeometry g{m.config().kv_shape(), 64};
  for (std::size_t lane = 0; lane < 6; ++lane) {
    // Each lane equals its prompt decoded token by token through a fresh cache of its method.
    const auto cache = make_kv_policy(methods[lane % 3], g);
    std::vector<float> x;
    for (std::size_t t = 0; t < prompts[lane / 3].size(); ++t) x = m.decode(prompts[lane / 3][t], t, *cache);
    INFO("lane " << lane);
    CHECK(batch.last_logits[lane] == x);
    CHECK(batch.caches[lane]->bytes() == cache->bytes());
  }
  // The f32 cache gives the exact prefill's logits up to the order of sums; the others differ from it.
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      e += (a[i] - b[i]) * (a[i] - b[i]);
      s += b[i] * b[i];
    }
    return std::sqrt(e / s);
  };
  CHECK(rel(batch.last_logits[0], exact.last_logits[0]) < 1e-5);
  CHECK(exact.last_logits[0] == exact.last_logits[1]);  // exact mode: one prefill per prompt
  CHECK(batch.last_logits[4] != exact.last_logits[4]);  // sequence 1 through kivi-4's f16 window
  // Methods with an end-of-prompt decision, and int8 attention, are refused.
  CHECK_THROWS_AS(prefill_lanes(m, prompts, {params("snapkv:budget=0.5")}, 64, 1, {PrefillMode::batch}), UsageError);
  PplOptions o;
  o.methods.push_back({"kivi-4", params("kivi-4")});
  o.max_sequences = 2;
  o.prefill_mode = PrefillMode::batch;
  const PplReport r = evaluate_perplexity(m, seqs, o, {});
  CHECK(r.to_json().at("prefill_mode") == "batch");
  CHECK(std::fabs(r.total(0).ppl() / evaluate_perplexity(m, seqs, [&] {
                                        PplOptions e = o;
                                        e.prefill_mode = PrefillMode::exact;
                                        return e;
                                      }(), {}).total(0).ppl() - 1) < 1e-5);
  o.attention = AttentionMode::int8;
  CHECK_THROWS_AS(evaluate_perplexity(m, seqs, o, {}), UsageError);
  CHECK(parse_prefill_mode("batch") == PrefillMode::batch);
  CHECK_THROWS_AS(parse_prefill_mode("chunked"), InvalidInput);
}

TEST_CASE("runtime caches size their RoPE tables by the run, not by the model's declared context", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model small = load_llama2c(shared_dir() + "/models/stories260K.bin");
  ModelConfig c = small.config();
  c.seq_len = std::size_t{1} << 40;  // a file may declare this; a table of it would take 2^48 bytes
  const Model big(c, small.weights());
  auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  seqs.resize(2);
  for (auto& s : seqs) s.resize(48);
  PplOptions o;
  for (const std::string spec : {"kivi-2:residual=32:pre-rope", "kivi-4"}) o.methods.push_back({spec, params(spec)});
  o.prefill = 40;
  const PplReport a = evaluate_perplexity(small, seqs, o, {}), b = evaluate_perplexity(big, seqs, o, {});
  CHECK(a.to_json() == b.to_json());
  PasskeyOptions pk;
  pk.lengths = {40};
  pk.depths = {0.5};
  pk.trials = 2;
  CHECK(evaluate_passkey(big, seqs, o.methods, pk, {}).to_json() == evaluate_passkey(small, seqs, o.methods, pk, {}).to_json());
  // Lengths near 2^64 do not wrap the context check.
  pk.lengths = {~std::size_t{0}};
  CHECK_THROWS_WITH(evaluate_passkey(big, seqs, o.methods, pk, {}), Catch::Contains("longer than the model's context"));
  // A RoPE table refuses positions past its end instead of reading beyond it.
  const RopeTable t(8, 10000.0, 0, 4);
  std::vector<float> x(8, 1.0f);
  CHECK_NOTHROW(apply_rope(x.data(), 1, 3, RopeLayout::interleaved, t));
  CHECK_THROWS_AS(apply_rope(x.data(), 1, 4, RopeLayout::interleaved, t), InvalidInput);
}

TEST_CASE("perplexity_chunks: llama-perplexity's chunks, BOS first", "[runtime]") {
  std::vector<std::int32_t> t(10);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>(i);
  const auto c = perplexity_chunks(t, 4, 99, 0);
  REQUIRE(c.size() == 2);  // floor(10 / 4); the last 2 tokens are not used
  CHECK(c[0] == std::vector<std::int32_t>{99, 1, 2, 3});
  CHECK(c[1] == std::vector<std::int32_t>{99, 5, 6, 7});
  CHECK(perplexity_chunks(t, 4, 99, 1).size() == 1);
  CHECK(perplexity_chunks(t, 5, -1, 0)[1] == std::vector<std::int32_t>{5, 6, 7, 8, 9});  // no BOS
  CHECK_THROWS_AS(perplexity_chunks(t, 3, 99, 0), InvalidInput);
  CHECK_THROWS_AS(perplexity_chunks(t, 11, 99, 0), InvalidInput);
}

TEST_CASE("memory trace: bytes along sequence 0, tiers adding up", "[runtime]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  PplOptions o;
  for (const std::string spec : {"full", "kivi-2", "compact:warm=64:cold-bits=16"}) {
    o.methods.push_back({spec, spec == "full" ? std::nullopt : std::optional<CompressParams>(params(spec))});
  }
  o.max_sequences = 2;
  o.prefill = 100;
  const PplReport r = evaluate_perplexity(m, seqs, o, {});
  REQUIRE(r.traces.size() == 3);
  const std::size_t n = seqs[0].size();
  const ModelConfig& c = m.config();
  const std::uint64_t f32_per_token = 2ull * 4 * c.n_layers * c.n_kv_heads * c.head_dim;
  for (const MemoryTrace& t : r.traces) {
    REQUIRE(!t.tokens.empty());
    CHECK(t.tokens.front() == 100);    // after the prompt
    CHECK(t.tokens.back() == n - 1);   // the last token fed (the final one is only predicted)
    CHECK(t.tokens.size() <= MemoryTrace::kMaxTracePoints + 1);
    CHECK(std::is_sorted(t.tokens.begin(), t.tokens.end()));
  }
  for (std::size_t i = 0; i < r.traces[0].tokens.size(); ++i) {
    CHECK(r.traces[0].bytes[i] == r.traces[0].tokens[i] * f32_per_token);  // the f32 reference
  }
  CHECK(r.traces[1].tiers.empty());  // not tiered
  const MemoryTrace& tiered = r.traces[2];
  REQUIRE(tiered.tiers.size() == tiered.tokens.size());
  for (std::size_t i = 0; i < tiered.tokens.size(); ++i) {
    const TierBytes& b = tiered.tiers[i];
    CHECK(b.hot + b.warm + b.cold == tiered.bytes[i]);
    CHECK(b.hot_tokens + b.warm_tokens + b.cold_tokens == tiered.tokens[i] * c.n_layers * c.n_kv_heads);
  }
  CHECK(tiered.bytes.back() == r.sequences[0][2].bytes);
}

namespace {

// The mean log-probability of q.key after q.tokens (nats per token) from one full prefill over
// the prompt and the key: the reference for the passkey's teacher-forced decode steps.
double key_logprob_by_prefill(const Model& m, const PasskeyPrompt& q) {
  std::vector<std::int32_t> seq = q.tokens;
  seq.insert(seq.end(), q.key.begin(), q.key.end() - 1);
  const PrefillResult f = m.prefill(seq, true);
  double lp = 0;
  for (std::size_t i = 0; i < q.key.size(); ++i) {
    const auto row = f.logits.row(static_cast<Eigen::Index>(q.tokens.size() - 1 + i));
    const double mx = row.maxCoeff();
    double sum = 0;
    for (Eigen::Index v = 0; v < row.size(); ++v) sum += std::exp(static_cast<double>(row(v)) - mx);
    lp += static_cast<double>(row(q.key[i])) - mx - std::log(sum);
  }
  return lp / static_cast<double>(q.key.size());
}

}  // namespace

TEST_CASE("passkey prompts: length, depth, marker, key; greedy continuation", "[runtime][passkey]") {
  std::vector<std::int32_t> filler(1000);
  for (std::size_t i = 0; i < filler.size(); ++i) filler[i] = static_cast<std::int32_t>(100 + i % 50);
  PasskeyOptions o;
  for (std::size_t len : {20u, 64u, 300u}) {
    for (double depth : {0.0, 0.5, 1.0}) {
      const PasskeyPrompt p = make_passkey_prompt(filler, 512, len, depth, 3, o);
      REQUIRE(p.tokens.size() == len);
      CHECK(p.tokens[0] == 1);
      const std::size_t n_fill = len - 1 - 8 - 4;
      CHECK(p.needle_pos == 1 + static_cast<std::size_t>(std::llround(depth * static_cast<double>(n_fill))));
      // marker at the needle and at the end, key right after the first marker
      for (std::size_t i = 0; i < 4; ++i) CHECK(p.tokens[p.needle_pos + i] == p.tokens[len - 4 + i]);
      for (std::size_t i = 0; i < 4; ++i) CHECK(p.tokens[p.needle_pos + 4 + i] == p.key[i]);
      for (std::int32_t t : p.key) CHECK((t >= 3 && t < 512));
      // the same inputs give the same prompt; another trial another one
      CHECK(make_passkey_prompt(filler, 512, len, depth, 3, o).tokens == p.tokens);
      CHECK(make_passkey_prompt(filler, 512, len, depth, 4, o).tokens != p.tokens);
    }
  }
  CHECK_THROWS_AS(make_passkey_prompt(filler, 512, 12, 0.5, 0, o), InvalidInput);
  CHECK_THROWS_AS(make_passkey_prompt(filler, 512, 64, 1.5, 0, o), InvalidInput);
  if (!have_shared()) return;
  // The full-cache greedy continuation equals the argmax of a prefill over the extended text.
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const PasskeyPrompt p = make_passkey_prompt(filler, 512, 120, 0.3, 0, o);
  const auto cont = greedy_continuation(m, p.tokens, 6, std::nullopt);
  std::vector<std::int32_t> ext = p.tokens;
  ext.insert(ext.end(), cont.begin(), cont.end() - 1);
  const PrefillResult r = m.prefill(ext, true);
  for (std::size_t i = 0; i < cont.size(); ++i) {
    Eigen::Index best;
    r.logits.row(static_cast<Eigen::Index>(p.tokens.size() - 1 + i)).maxCoeff(&best);
    CHECK(best == cont[i]);
  }
  // evaluate_passkey: deterministic grid of the requested shape.
  PasskeyOptions po;
  po.lengths = {64, 128};
  po.depths = {0.0, 1.0};
  po.trials = 2;
  po.threads = 2;
  const std::vector<PplMethod> methods = {{"kivi-4", params("kivi-4")}};
  const PasskeyReport a = evaluate_passkey(m, {filler}, methods, po, {});
  po.threads = 1;
  CHECK(evaluate_passkey(m, {filler}, methods, po, {}).to_json() == a.to_json());
  CHECK(a.successes.size() == 2);
  CHECK(a.successes[1].size() == 2);
  CHECK(a.successes[1][0].size() == 2);
  // Each prompt's full-cache key log-probability (teacher-forced decode steps) against a prefill
  // over prompt + key (another attention path: f32 rounding apart), and its success against the
  // greedy continuation.
  REQUIRE(a.key_logprob.size() == 8);
  std::size_t j = 0;
  for (double depth : po.depths) {
    for (std::size_t len : po.lengths) {
      for (std::size_t t = 0; t < po.trials; ++t, ++j) {
        const PasskeyPrompt q = make_passkey_prompt(filler, m.config().vocab_size, len, depth, t, po);
        INFO("prompt " << j);
        CHECK(a.key_logprob[j][0] == Approx(key_logprob_by_prefill(m, q)).margin(1e-3));
        CHECK(a.key_logprob[j][0] < 0.0);
        CHECK(a.outcomes[j][0] == (greedy_continuation(m, q.tokens, q.key.size(), std::nullopt) == q.key ? 1 : 0));
        // The full f32 cache holds 8 bytes per position and channel: 32 bits per element.
        const ModelConfig& c = m.config();
        CHECK(a.kv_bytes[j][0] == c.n_layers * c.n_kv_heads * c.head_dim * 8 * (len + q.key.size() - 1));
        CHECK(a.bits[j][0] == Approx(32.0).epsilon(1e-12));
        // kivi-4 keeps its last 128 tokens in f16: all of a 64-token prompt, some codes beyond.
        if (len == 64) CHECK(a.bits[j][1] == Approx(16.0).epsilon(1e-12));
        if (len == 128) CHECK(a.bits[j][1] < 16.0);
      }
    }
  }
  // Query-agnostic: the final marker decoded through the cache; through the full cache that is the
  // same computation (another attention path), so the outcomes agree and the log-probabilities
  // within f32 rounding.
  po.query_agnostic = true;
  const PasskeyReport g = evaluate_passkey(m, {filler}, methods, po, {});
  CHECK(g.to_json()["question"] == "decoded after compression");
  CHECK(a.to_json()["question"] == "compressed with the context");
  for (std::size_t i = 0; i < a.outcomes.size(); ++i) {
    CHECK(g.outcomes[i][0] == a.outcomes[i][0]);
    CHECK(g.key_logprob[i][0] == Approx(a.key_logprob[i][0]).margin(1e-3));
  }
}

TEST_CASE("passkey text mode: the key's log-probability and the greedy answer from one prefill", "[runtime][passkey]") {
  if (!have_shared()) return;
  // stories260K (vocabulary 512) read through the byte tokenizer (258 ids): a model that does
  // not retrieve, so the log-probabilities are those of an arbitrary continuation.
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const Tokenizer b = Tokenizer::bytes();
  PasskeyOptions po;
  po.lengths = {300};
  po.depths = {0.0, 1.0};
  po.trials = 2;
  po.answer_tokens = 7;
  const std::vector<PplMethod> methods = {{"kivi-2", params("kivi-2")}};
  const PasskeyReport a = evaluate_passkey(m, {}, methods, po, {}, &b);
  REQUIRE(a.key_logprob.size() == 4);
  for (std::size_t j = 0; j < 4; ++j) {
    const PasskeyPrompt q = make_text_passkey_prompt(b, 300, po.depths[j / 2], j % 2, po);
    CHECK(b.decode(q.key) == " " + q.key_text);
    INFO("prompt " << j);
    CHECK(a.key_logprob[j][0] == Approx(key_logprob_by_prefill(m, q)).margin(1e-3));
    CHECK(a.key_logprob[j][1] != a.key_logprob[j][0]);  // kivi-2 changes the distribution
    const auto greedy = greedy_continuation(m, q.tokens, po.answer_tokens, std::nullopt);
    CHECK(a.outcomes[j][0] == (b.decode(greedy).find(q.key_text) != std::string::npos ? 1 : 0));
    CHECK(a.kv_bytes[j][0] == m.config().n_layers * m.config().n_kv_heads * m.config().head_dim * 8 * (300 + 7 - 1));
  }
  po.query_agnostic = true;
  const PasskeyReport g = evaluate_passkey(m, {}, methods, po, {}, &b);
  for (std::size_t j = 0; j < 4; ++j) CHECK(g.key_logprob[j][0] == Approx(a.key_logprob[j][0]).margin(1e-3));
}

TEST_CASE("byte tokenizer", "[runtime][passkey]") {
  const Tokenizer b = Tokenizer::bytes();
  CHECK(b.bos() == 256);
  CHECK(b.vocab_size() == 258);
  const std::string text = "The pass key is 12345. \xc3\xa9";
  const auto ids = b.encode(text);
  CHECK(ids.size() == text.size());
  CHECK(ids[0] == 'T');
  CHECK(b.decode(ids) == text);
  CHECK(b.decode({256, 'a', 257, 'b'}) == "ab");  // BOS/EOS are not text
  PasskeyOptions o;
  const PasskeyPrompt p = make_text_passkey_prompt(b, 400, 0.5, 1, o);
  CHECK(p.tokens.size() == 400);
  CHECK(p.tokens[0] == 256);
}

TEST_CASE("passkey text mode: SentencePiece plumbing, prompt layout, end to end", "[runtime][passkey]") {
  const std::string tok_path = shared_dir() + "/models/llama2-tokenizer.model";
  if (!std::filesystem::exists(tok_path)) {
    WARN("skipped: " << tok_path << " not found");
    return;
  }
  const Tokenizer tok(tok_path);
  CHECK(tok.vocab_size() == 32000);
  CHECK(tok.bos() == 1);
  const std::string text = "The pass key is 12345. Remember it.";
  CHECK(tok.decode(tok.encode(text)) == text);
  PasskeyOptions o;
  for (std::size_t len : {120u, 300u}) {
    for (double depth : {0.0, 0.5, 1.0}) {
      const PasskeyPrompt p = make_text_passkey_prompt(tok, len, depth, 2, o);
      REQUIRE(p.tokens.size() == len);
      CHECK(p.key_text.size() == 5);
      const std::string whole = tok.decode(p.tokens);
      CHECK(whole.find("The pass key is " + p.key_text + ". Remember it. " + p.key_text + " is the pass key.") !=
            std::string::npos);
      CHECK(whole.rfind("What is the pass key? The pass key is") == whole.size() - 37);
      // the needle starts where the depth puts it
      const std::string from_needle = tok.decode({p.tokens.begin() + static_cast<std::ptrdiff_t>(p.needle_pos), p.tokens.end()});
      CHECK(from_needle.find("The pass key is " + p.key_text) <= 1);  // after an optional space
      if (depth == 0.0) CHECK(whole.find("The pass key is") < whole.find("The grass is green"));
      if (depth == 1.0) CHECK(whole.find("The pass key is") > whole.rfind("The grass is green"));
    }
  }
  CHECK_THROWS_AS(make_text_passkey_prompt(tok, 40, 0.5, 0, o), InvalidInput);
  // End to end on a tiny random model with the tokenizer's vocabulary.
  ModelConfig c;
  c.dim = 16;
  c.hidden_dim = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.vocab_size = 32000;
  c.seq_len = 512;
  c.rope_layout = RopeLayout::rotate_half;
  const Model m = test::random_model(c, 3, 0.3);
  PasskeyOptions po;
  po.lengths = {150};
  po.depths = {0.5};
  po.trials = 2;
  const PasskeyReport rep = evaluate_passkey(m, {}, {{"kivi-4", params("kivi-4")}}, po, {}, &tok);
  CHECK(rep.mode == "text");
  CHECK(rep.successes.size() == 2);
  CHECK(rep.to_json()["methods"][0]["accuracy"][0].size() == 1);
}
