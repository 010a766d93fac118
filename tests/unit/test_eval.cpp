#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <algorithm>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/alloc/calibration_file.h"
#include "akv/alloc/eviction.h"
#include "akv/eval/calibrate.h"
#include "akv/eval/fidelity.h"
#include "akv/eval/model_parts.h"
#include "akv/eval/token_metrics.h"
#include "akv/io/hdf5.h"
#include "akv/kv/cache_file.h"
#include "akv/kv/compress.h"
#include "akv/method/params.h"
#include "akv/score/qfilter.h"
#include <fstream>
#include "akv/synth/synth.h"
#include "synth_shape.h"
#include "test_util.h"

using namespace akv;

namespace {

struct Case {
  std::size_t nq, nk, d;
  std::vector<float> q, k, v, k2, v2;
  std::vector<std::size_t> qpos, kpos;
};

Case random_case(std::size_t nq, std::size_t nk, std::size_t d, double noise, std::uint64_t seed) {
  Case c{nq, nk, d, std::vector<float>(nq * d), std::vector<float>(nk * d),
         std::vector<float>(nk * d), {}, {}, std::vector<std::size_t>(nq), std::vector<std::size_t>(nk)};
  Rng r(seed);
  for (auto& x : c.q) x = static_cast<float>(2.0 * r.normal());
  for (auto& x : c.k) x = static_cast<float>(r.normal());
  for (auto& x : c.v) x = static_cast<float>(r.normal());
  c.k2 = c.k;
  c.v2 = c.v;
  for (auto& x : c.k2) x += static_cast<float>(noise * r.normal());
  for (auto& x : c.v2) x += static_cast<float>(noise * r.normal());
  std::iota(c.kpos.begin(), c.kpos.end(), std::size_t{0});
  for (std::size_t i = 0; i < nq; ++i) c.qpos[i] = nk - nq + i;
  return c;
}

AttentionInput orig(const Case& c) {
  return {c.q.data(), c.k.data(), c.v.data(), c.nq, c.nk, c.d, c.qpos.data(), c.kpos.data()};
}
AttentionInput comp(const Case& c) {
  return {c.q.data(), c.k2.data(), c.v2.data(), c.nq, c.nk, c.d, c.qpos.data(), c.kpos.data()};
}

}  // namespace

TEST_CASE("attention fidelity: hand-computed two-token case", "[eval]") {
  // d = 1, q = 1: original logits [0, 0] -> p = [1/2, 1/2]; compressed logits [ln 3, 0] ->
  // p^ = [3/4, 1/4]. v = [1, 3]: o = 2, o^ = 1.5.
  const float q[1] = {1.0f}, k[2] = {0.0f, 0.0f}, k2[2] = {std::log(3.0f), 0.0f},
              v[2] = {1.0f, 3.0f};
  const std::size_t qpos[1] = {1}, kpos[2] = {0, 1};
  const AttentionInput o{q, k, v, 1, 2, 1, qpos, kpos};
  const AttentionInput c{q, k2, v, 1, 2, 1, qpos, kpos};
  for (const AttentionFidelity& f : {attention_fidelity(o, c), attention_fidelity_ref(o, c)}) {
    CHECK(f.queries == 1);
    CHECK(f.out_err2 == Approx(0.25).epsilon(1e-6));
    CHECK(f.out_norm2 == Approx(4.0).epsilon(1e-6));
    CHECK(f.kl == Approx(0.5 * std::log(4.0 / 3.0)).epsilon(1e-6));
    CHECK(f.recall[0] == 1.0);  // tie in the original: the lower index wins
    CHECK(f.recall[1] == 1.0);  // k = 8 > 2 tokens: both
    CHECK(f.evicted_mass == Approx(0.0).margin(1e-12));
  }
  // Evict token 0: the kept distribution is [1] on both sides (KL 0); half the mass is gone.
  const float k3[1] = {0.0f}, v3[1] = {3.0f};
  const std::size_t kpos3[1] = {1};
  const AttentionInput e{q, k3, v3, 1, 1, 1, qpos, kpos3};
  for (const AttentionFidelity& f : {attention_fidelity(o, e), attention_fidelity_ref(o, e)}) {
    CHECK(f.kl == Approx(0.0).margin(1e-12));
    CHECK(f.evicted_mass == Approx(0.5).epsilon(1e-9));
    CHECK(f.recall[0] == 0.0);  // original top-1 is token 0
    CHECK(f.out_err2 == Approx(1.0).epsilon(1e-6));
  }
  // Causality: a query at position 0 sees only token 0.
  const std::size_t qpos0[1] = {0};
  const AttentionInput o0{q, k, v, 1, 2, 1, qpos0, kpos};
  const AttentionInput c0{q, k2, v, 1, 2, 1, qpos0, kpos};
  const AttentionFidelity f0 = attention_fidelity(o0, c0);
  CHECK(f0.out_err2 == 0.0);
  CHECK(f0.kl == Approx(0.0).margin(1e-12));
}

TEST_CASE("attention fidelity: fast path matches the f64 reference", "[eval]") {
  for (double noise : {0.0, 0.01, 0.3}) {
    const Case c = random_case(16, 300, 32, noise, 3 + static_cast<std::uint64_t>(noise * 100));
    const AttentionFidelity a = attention_fidelity(orig(c), comp(c));
    const AttentionFidelity b = attention_fidelity_ref(orig(c), comp(c));
    INFO("noise " << noise);
    CHECK(a.queries == b.queries);
    CHECK(a.out_norm2 == Approx(b.out_norm2).epsilon(1e-5));
    // Error terms: relative 1e-3 of the error or 1e-9 of the norm (f32 logits vs f64).
    CHECK(a.out_err2 == Approx(b.out_err2).epsilon(1e-3).margin(1e-9 * b.out_norm2));
    CHECK(a.kl == Approx(b.kl).epsilon(1e-3).margin(1e-9));
    // Recall may differ only where f32 logits reorder near-ties: at most one query per k.
    for (int r = 0; r < 3; ++r) CHECK(std::fabs(a.recall[r] - b.recall[r]) <= 1.0);
    if (noise == 0.0) {
      CHECK(a.out_err2 == 0.0);
      for (int r = 0; r < 3; ++r) CHECK(a.recall[r] == 16.0);
    }
  }
}

TEST_CASE("attention_outputs: each query's entropy against -sum p log p of f64 logits", "[eval]") {
  // The brute force: f64 dot products, softmax, -sum p log p over the visible keys. The fast
  // entropy takes the f32 logits of the outputs' softmax: relative 1e-5. Queries that see no
  // key (position before the first key) get 0; a query that sees one key has entropy 0.
  Case c = random_case(12, 200, 16, 0.0, 5);
  for (std::size_t i = 0; i < c.nq; ++i) c.qpos[i] = 17 * i;
  for (std::size_t& p : c.kpos) p += 1;
  const AttentionOutputs r = attention_outputs(orig(c), true);
  REQUIRE(r.entropy.size() == c.nq);
  CHECK(attention_outputs(orig(c)).entropy.empty());
  for (std::size_t i = 0; i < c.nq; ++i) {
    const auto n = static_cast<std::size_t>(std::upper_bound(c.kpos.begin(), c.kpos.end(), c.qpos[i]) - c.kpos.begin());
    std::vector<double> s(n), p(n);
    for (std::size_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < c.d; ++t) dot += static_cast<double>(c.q[i * c.d + t]) * c.k[j * c.d + t];
      s[j] = dot / std::sqrt(static_cast<double>(c.d));
    }
    double m = -INFINITY, sum = 0, h = 0;
    for (double x : s) m = std::max(m, x);
    for (std::size_t j = 0; j < n; ++j) sum += (p[j] = std::exp(s[j] - m));
    for (double& x : p) {
      x /= sum;
      if (x > 0) h -= x * std::log(x);
    }
    INFO("query " << i << " sees " << n);
    CHECK(r.entropy[i] == Approx(h).epsilon(1e-5).margin(1e-12));
    if (n <= 1) CHECK(r.entropy[i] == 0.0);
  }
}

TEST_CASE("top_k: the k largest by a stable sort, ties to the lower index", "[eval]") {
  // Many ties, distinct scores, and a rising ramp (every score enters the best, so they are
  // compacted again and again), at sizes around the blocks of eight.
  Rng r(4);
  for (const std::size_t n : {0, 1, 5, 40, 300, 3001}) {
    for (const std::size_t k : {0, 1, 8, 32, 500}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<double> s(n);
        for (std::size_t j = 0; j < n; ++j) {
          s[j] = pattern == 0 ? std::round(3.0 * r.normal()) / 2.0 : pattern == 1 ? r.normal() : 0.25 * static_cast<double>(j / 3);
        }
        std::vector<std::size_t> want(n);
        std::iota(want.begin(), want.end(), std::size_t{0});
        std::stable_sort(want.begin(), want.end(), [&](std::size_t a, std::size_t b) { return s[a] > s[b]; });
        want.resize(std::min(k, n));
        CAPTURE(n, k, pattern);
        CHECK(top_k(s.data(), n, k) == want);
      }
    }
  }
}

TEST_CASE("attention fidelity: one reference serves several compressed sides", "[eval]") {
  // The reference keeps what a side that keeps every key shares (the kept mass, the renormalized
  // probabilities) once one such side has been compared: every later side, whole or evicted,
  // gets what a fresh reference gives it, bit for bit.
  const Case c = random_case(8, 200, 16, 0.05, 9);
  std::vector<std::size_t> kept_pos;
  std::vector<float> k, v;
  for (std::size_t j = 0; j < c.nk; j += 3) {
    kept_pos.push_back(j);
    k.insert(k.end(), c.k2.begin() + static_cast<std::ptrdiff_t>(j * c.d), c.k2.begin() + static_cast<std::ptrdiff_t>((j + 1) * c.d));
    v.insert(v.end(), c.v2.begin() + static_cast<std::ptrdiff_t>(j * c.d), c.v2.begin() + static_cast<std::ptrdiff_t>((j + 1) * c.d));
  }
  const AttentionInput o = orig(c), whole = comp(c);
  const AttentionInput evicted{c.q.data(), k.data(), v.data(), c.nq, kept_pos.size(), c.d, c.qpos.data(), kept_pos.data()};
  const auto same = [](const AttentionFidelity& a, const AttentionFidelity& b) {
    CHECK(a.out_err2 == b.out_err2);
    CHECK(a.kl == b.kl);
    CHECK(a.evicted_mass == b.evicted_mass);
    for (int r = 0; r < 3; ++r) CHECK(a.recall[r] == b.recall[r]);
    CHECK(a.queries == b.queries);
  };
  AttentionReference ref = attention_reference(o);
  for (const AttentionInput* side : {&whole, &evicted, &whole, &o}) same(attention_fidelity(ref, o, *side), attention_fidelity(o, *side));
  const AttentionFidelity self = attention_fidelity(ref, o, o);
  CHECK(self.kl == Approx(0.0).margin(1e-12));
  CHECK(self.evicted_mass == Approx(0.0).margin(1e-12));
}

TEST_CASE("evaluate_cache on a synth dump: bits order the errors; 8 bits is near exact",
          "[eval]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(8, 2, 64, 1024, 32, 2);
  const std::string dump = dir.file("d.h5");
  write_synth_dump(dump, so, {});
  FidelityMetrics prev;
  prev.key_rel_mse = prev.value_rel_mse = prev.attn_rel_err = INFINITY;
  for (int bits : {2, 3, 4, 8}) {
    CompressRequest req;
    req.method = "uniform";
    req.bits = bits;
    const std::string cache = dir.file("c" + std::to_string(bits) + ".h5");
    compress_dump(dump, cache, resolve_params(req), 2, {});
    const FidelityReport r = evaluate_cache(dump, cache, 2, true, {});
    const FidelityMetrics m = metrics(r.total());
    INFO("bits " << bits << " key " << m.key_rel_mse << " value " << m.value_rel_mse << " attn "
                 << m.attn_rel_err << " kl " << m.kl);
    CHECK(m.key_rel_mse < prev.key_rel_mse);
    CHECK(m.value_rel_mse < prev.value_rel_mse);
    CHECK(m.attn_rel_err < prev.attn_rel_err);
    if (bits == 8) {
      CHECK(m.attn_rel_err < 1e-2);
      CHECK(m.recall[0] > 0.95);
    }
    CHECK(r.heads.size() == 2);
    CHECK(r.total().attn.queries == 2 * 8 * 32);
    prev = m;
  }
  // A cache of another dump is refused.
  so.seed = 99;
  write_synth_dump(dir.file("other.h5"), so, {});
  CHECK_THROWS_AS(evaluate_cache(dir.file("other.h5"), dir.file("c4.h5"), 1, true, {}), InvalidInput);
  // Thread count does not change the report.
  const auto a = evaluate_cache(dump, dir.file("c2.h5"), 1, true, {}).to_json();
  const auto b = evaluate_cache(dump, dir.file("c2.h5"), 3, true, {}).to_json();
  CHECK(a == b);
}

TEST_CASE("spearman: hand cases", "[eval][calibrate]") {
  CHECK(spearman({1, 2, 3, 4}, {10, 20, 30, 40}) == Approx(1.0));
  CHECK(spearman({1, 2, 3, 4}, {4, 3, 2, 1}) == Approx(-1.0));
  CHECK(spearman({1, 2, 3}, {5, 5, 5}) == 0.0);
  // ranks with a tie: a = (1, 2.5, 2.5, 4), b = (1, 2, 3, 4): r = 0.9486833
  CHECK(spearman({1, 2, 2, 3}, {1, 2, 3, 4}) == Approx(0.9486833).epsilon(1e-6));
}

TEST_CASE("calibrate: measured allocation meets the target and beats uniform", "[eval][calibrate]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(8, 4, 64, 512, 16, 2);
  write_synth_dump(dir.file("a.h5"), so, {});
  so.seed = 7;
  write_synth_dump(dir.file("b.h5"), so, {});
  CalibrateOptions o;
  o.target_bits = 3.0;
  o.threads = 2;
  const auto j = calibrate({dir.file("a.h5"), dir.file("b.h5")}, o, {});
  CHECK(j["summary"]["achieved_bits"].get<double>() == Approx(3.0));
  CHECK(j["summary"]["predicted_error"].get<double>() <= j["summary"]["uniform_predicted_error"]["3"].get<double>());
  // per-head bits land in the cache
  std::ofstream(dir.file("c.json")) << j.dump();
  CompressRequest r;
  r.method = "kivi";
  r.calibration = dir.file("c.json");
  compress_dump(dir.file("a.h5"), dir.file("c.h5"), resolve_params(r), 2, {});
  CacheReader c(dir.file("c.h5"));
  const auto& h = j["layers"][1]["heads"][2];
  const HeadCache hc = c.read_head(1, 2);
  CHECK(hc.key.packed_params().bits == h["bits_key"].get<int>());
  CHECK(hc.value.packed_params().bits == h["bits_value"].get<int>());
  // Bad input.
  o.target_bits = 5.0;
  CHECK_THROWS_AS(calibrate({dir.file("a.h5")}, o, {}), InvalidInput);
  o.target_bits = 3.0;
  o.candidates.clear();
  CHECK_THROWS_AS(calibrate({dir.file("a.h5")}, o, {}), InvalidInput);
  o.candidates = {2, 3, 4};
  o.allocator = "adakv-proxy";
  o.lo = 4;
  o.hi = 2;
  CHECK_THROWS_AS(calibrate({dir.file("a.h5")}, o, {}), InvalidInput);
  so.n_layers = 3;
  write_synth_dump(dir.file("other.h5"), so, {});
  CHECK_THROWS_AS(compress_dump(dir.file("other.h5"), dir.file("x.h5"), resolve_params(r), 1, {}), InvalidInput);
  // The streaming proxy honours the update interval.
  o.lo = 2;
  o.hi = 4;
  o.update_interval = 128;
  const auto p = calibrate({dir.file("a.h5")}, o, {});
  CHECK(p["summary"]["bits_history"].size() == 4);
}

TEST_CASE("calibrate: Q-Filters pool the dumps' queries; the calibration file carries them to qfilter",
          "[eval][calibrate]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(8, 2, 32, 128, 32, 2);
  write_synth_dump(dir.file("a.h5"), so, {});
  CalibrateOptions o;
  o.candidates = {2, 4};
  const auto one = calibrate({dir.file("a.h5")}, o, {});
  const auto twice = calibrate({dir.file("a.h5"), dir.file("a.h5")}, o, {});  // every row twice: the same direction
  CHECK(one["summary"]["qfilter_rows"] == 32);
  CHECK(twice["summary"]["qfilter_rows"] == 64);
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      const auto a = one["layers"][l]["heads"][h]["qfilter"].get<std::vector<double>>();
      const auto b = twice["layers"][l]["heads"][h]["qfilter"].get<std::vector<double>>();
      REQUIRE(a.size() == 32);
      for (std::size_t c = 0; c < 32; ++c) CHECK(a[c] == Approx(b[c]).margin(1e-12));
    }
  }
  std::ofstream(dir.file("c.json")) << one.dump();
  const DumpReader dump(dir.file("a.h5"));
  const QFilters f = read_calibration_qfilters(dir.file("c.json"), dump.meta());
  CHECK(f[1][1] == one["layers"][1]["heads"][1]["qfilter"].get<std::vector<double>>());
  // Read for the global layers alone of a model whose layer 0 is local: file layer 1 is layer 0.
  KvWindow globals = dump.meta();
  globals.layer_window = {8, 0};
  globals.kv_shape() = globals.global_shape();
  const QFilters g = read_calibration_qfilters(dir.file("c.json"), globals);
  REQUIRE(g.size() == 1);
  CHECK(g[0] == f[1]);
  // qfilter keeps each head's best -(f . k).
  EvictionParams p = eviction_method("qfilter");
  p.budget_fraction = 0.25;
  p.score.qfilters = dir.file("c.json");
  const EvictionPlan plan = plan_eviction(dump, p, 1, {});
  Tensor3 key;
  dump.read_into(key, 1, DumpField::key);
  const std::vector<double> s = qfilter_scores(key, 0, f[1][0]);
  std::vector<std::size_t> order(s.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return s[x] > s[y]; });
  std::vector<std::int32_t> best(order.begin(), order.begin() + 32);
  std::sort(best.begin(), best.end());
  CHECK(plan.heads[1][0].kept == best);
  // No file, bad files: a head without its filter, one of the wrong length, another model's shape.
  CHECK_THROWS_AS(plan_eviction(dump, [&] { EvictionParams q = p; q.score.qfilters.clear(); return q; }(), 1, {}),
                  UsageError);
  nlohmann::json bad = one;
  bad["layers"][0]["heads"][1].erase("qfilter");
  std::ofstream(dir.file("bad.json")) << bad.dump();
  CHECK_THROWS_AS(read_calibration_qfilters(dir.file("bad.json"), dump.meta()), CorruptData);
  bad = one;
  bad["layers"][1]["heads"][0]["qfilter"].erase(0);
  std::ofstream(dir.file("bad.json")) << bad.dump();
  CHECK_THROWS_AS(plan_eviction(dump, [&] { EvictionParams q = p; q.score.qfilters = dir.file("bad.json"); return q; }(), 1, {}),
                  InvalidInput);
  so.n_kv_heads = 4;
  write_synth_dump(dir.file("other.h5"), so, {});
  CHECK_THROWS_AS(plan_eviction(DumpReader(dir.file("other.h5")), p, 1, {}), InvalidInput);
}

TEST_CASE("passkey shards: parts of a patterned grid merge to the whole report", "[eval][shard]") {
  // 2 depths x 3 lengths x 4 trials, 2 methods; outcome of prompt j, method m: (j * 7 + m) % 3 == 0.
  PasskeyReport whole;
  whole.mode = "token";
  whole.specs = {"full", "kivi-2"};
  whole.descriptions = {"a", "b"};
  whole.lengths = {32, 64, 128};
  whole.depths = {0.0, 1.0};
  whole.trials = 4;
  whole.total_prompts = 24;
  for (std::size_t j = 0; j < 24; ++j) {
    whole.outcomes.push_back({static_cast<char>(j * 7 % 3 == 0), static_cast<char>((j * 7 + 1) % 3 == 0)});
    whole.key_logprob.push_back({-0.1 * static_cast<double>(j), -1.0 / static_cast<double>(j + 3)});
    whole.kv_bytes.push_back({1000 + j, 100});
    whole.bits.push_back({32.0, 3.0 + 0.25 * static_cast<double>(j % 2)});
    whole.peak_kv_bytes.push_back({2000 + j, 300 + 2 * j});
  }
  whole.tally();
  // By hand: depth 0, length 128 holds prompts 8..11: -0.1 * (8 + 9 + 10 + 11) / 4 trials.
  CHECK(whole.to_json()["methods"][0]["key_logprob"][0][2].get<double>() == Approx(-0.95));
  // By hand: bytes 1000 + mean(0..23) = 1011.5; bits of method 1: half 3, half 3.25.
  CHECK(whole.to_json()["methods"][0]["mean_kv_bytes"].get<double>() == Approx(1011.5));
  CHECK(whole.to_json()["methods"][1]["bits_per_element"].get<double>() == Approx(3.125));
  CHECK(whole.to_json()["methods"][1]["mean_peak_kv_bytes"].get<double>() == Approx(323.0));  // 300 + 2 x 11.5
  // By hand: depth 1 (prompts 12..23), length 64 (prompts 16..19): j*7%3==0 for j = 18 only.
  CHECK(whole.successes[0][1][1] == 1);
  std::size_t sum = 0;
  for (const auto& d : whole.successes[1]) sum += std::accumulate(d.begin(), d.end(), std::size_t{0});
  CHECK(sum == 8);  // (7j + 1) % 3 == 0 <=> j % 3 == 2: j = 2, 5, ..., 23
  const PplRun run{{{"model", "m"}}, {{"methods", {"kivi-2"}}}};
  std::vector<std::pair<std::string, nlohmann::json>> parts;
  for (std::size_t k : {3, 1, 2}) {  // any order
    const Shard s{k, 3};
    const auto [lo, hi] = s.range(24);
    PasskeyReport p = whole;
    p.first_prompt = lo;
    p.outcomes.assign(whole.outcomes.begin() + static_cast<std::ptrdiff_t>(lo),
                      whole.outcomes.begin() + static_cast<std::ptrdiff_t>(hi));
    p.key_logprob.assign(whole.key_logprob.begin() + static_cast<std::ptrdiff_t>(lo),
                         whole.key_logprob.begin() + static_cast<std::ptrdiff_t>(hi));
    p.kv_bytes.assign(whole.kv_bytes.begin() + static_cast<std::ptrdiff_t>(lo),
                      whole.kv_bytes.begin() + static_cast<std::ptrdiff_t>(hi));
    p.bits.assign(whole.bits.begin() + static_cast<std::ptrdiff_t>(lo), whole.bits.begin() + static_cast<std::ptrdiff_t>(hi));
    p.peak_kv_bytes.assign(whole.peak_kv_bytes.begin() + static_cast<std::ptrdiff_t>(lo),
                           whole.peak_kv_bytes.begin() + static_cast<std::ptrdiff_t>(hi));
    p.tally();
    parts.emplace_back("p" + std::to_string(k), passkey_part_json(p, s, run));
  }
  CHECK(merge_passkey_parts(parts).to_json() == whole.to_json());
  parts.pop_back();
  CHECK_THROWS_WITH(merge_passkey_parts(parts), Catch::Contains("shard missing"));
}

TEST_CASE("token metrics: lse, KL and argmax against the log-probability definitions", "[eval][metrics]") {
  // Logit rows as a model gives them (a few large, a long tail) and a perturbed copy, at a
  // vocabulary size with a remainder for the vector loops. Tolerance: 1e-12 relative on the
  // nll, 1e-12 + 1e-9 relative on the KL (f64 sums of 32003 terms in different orders).
  Rng rng(7);
  const std::size_t n = 32003;
  for (const double noise : {0.0, 1e-4, 1e-2, 1.0}) {
    std::vector<float> r(n), x(n);
    for (std::size_t j = 0; j < n; ++j) {
      r[j] = static_cast<float>(3.0 * rng.normal() + (j % 997 == 0 ? 12.0 : 0.0));
      x[j] = static_cast<float>(r[j] + noise * rng.normal());
    }
    ReferenceRow ref;
    ref.set(r.data(), n);
    const double lse = log_sum_exp(x.data(), n);
    for (const std::size_t target : {std::size_t{0}, std::size_t{5}, n - 1}) {
      const TokenMetricsRef want = token_metrics_ref(r.data(), x.data(), n, target);
      CHECK(lse - x[target] == Approx(want.nll).epsilon(1e-12));
    }
    const TokenMetricsRef want = token_metrics_ref(r.data(), x.data(), n, 0);
    const double kl = kl_divergence(ref, x.data(), lse);
    INFO("noise " << noise << " kl " << kl << " ref " << want.kl);
    CHECK(std::fabs(kl - std::max(0.0, want.kl)) <= 1e-12 + 1e-9 * want.kl);
    if (noise == 0.0) CHECK(kl == 0.0);
    CHECK(ref.lse == Approx(log_sum_exp(r.data(), n)).epsilon(1e-15));
  }
  const std::vector<float> ties = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  CHECK(argmax(ties.data(), ties.size()) == 1);  // the first of equal maxima
  // Against std::max_element over lengths around the 64-value search chunks, the maximum
  // anywhere (first, last, at chunk edges) and repeated in later chunks.
  for (const std::size_t len : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{200}, n}) {
    for (const std::size_t at : {std::size_t{0}, len / 2, len - 1, std::min<std::size_t>(64, len - 1), std::min<std::size_t>(127, len - 1)}) {
      std::vector<float> v(len);
      for (float& f : v) f = static_cast<float>(rng.normal());
      v[at] = 100.0f;
      if (at + 70 < len) v[at + 70] = 100.0f;
      const auto want = static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());
      CHECK(want == at);
      CHECK(argmax(v.data(), len) == want);
    }
  }
}

TEST_CASE("nuq caches: calibrate's codebooks, compress_dump, file version 6 read back as built, corrupt data",
          "[eval][nuq]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 32, 120, 8, 2);
  so.write.dtype = DType::f32;
  so.write.key_pre_rope = true;
  const std::string dump = dir.file("d.h5"), calib = dir.file("calib.json"), cache = dir.file("c.h5");
  write_synth_dump(dump, so, {});
  CalibrateOptions co;
  co.nuq_bits = {2, 3};
  {
    std::ofstream(calib) << calibrate({dump}, co, {}).dump();
  }
  const CompressParams p = resolve_params(parse_method_spec("nuq:calibration=" + calib + ":bits-key=2:bits-value=3"));
  const MemoryReport rep = compress_dump(dump, cache, p, 2, {});
  CacheReader r(cache);
  CHECK(r.version() == kCacheVersionNuq);
  CHECK(cache_memory(r).total.total() == rep.total.total());
  // Every head as compress_head builds it with the head's tables of the calibration.
  DumpReader dr(dump);
  CompressParams withbooks = p;
  withbooks.codebooks = std::make_shared<const NuqCodebooks>(read_calibration_nuq(calib, dr.meta(), 2, 3));
  for (std::size_t l = 0; l < 2; ++l) {
    const Tensor3 k = dr.read(l, DumpField::key), kp = dr.read(l, DumpField::key_pre_rope), v = dr.read(l, DumpField::value);
    for (std::size_t h = 0; h < 2; ++h) {
      HeadInput in;
      in.key = k.row(h, 0);
      in.key_pre_rope = kp.row(h, 0);
      in.value = v.row(h, 0);
      in.n = in.n_tokens = 120;
      in.head_dim = 32;
      const HeadCache want = compress_head(in, withbooks.for_head(l, h, 2)), got = r.read_head(l, h);
      CHECK(got.key.pre_rope());
      CHECK(got.key.nuq_table()->upper == want.key.nuq_table()->upper);
      CHECK(got.key.nuq_table()->levels == want.key.nuq_table()->levels);
      CHECK(got.value.nuq_table()->levels.size() == 8);
      for (const auto& [a, b] : {std::pair{&got.key, &want.key}, std::pair{&got.value, &want.value}}) {
        CHECK(a->nuq_rows().codes == b->nuq_rows().codes);
        CHECK(a->nuq_rows().sink == b->nuq_rows().sink);
        CHECK(a->nuq_rows().offset == b->nuq_rows().offset);
        CHECK(a->nuq_rows().outlier_end == b->nuq_rows().outlier_end);
        CHECK(a->nuq_rows().outlier_channel == b->nuq_rows().outlier_channel);
        CHECK(a->nuq_rows().outlier_value == b->nuq_rows().outlier_value);
      }
      CHECK(got.bytes().total() == want.bytes().total());
    }
  }
  // Corrupt data names the object: a row's outlier channels out of order, a wrong sink count.
  const auto corrupt = [&](const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string bad = dir.file(name);
    std::filesystem::copy_file(cache, bad);
    {
      h5::File f(H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      h5::Group g(H5Gopen2(f.get(), (cache_head_path(1, 0) + "/value").c_str(), H5P_DEFAULT));
      edit(g.get());
    }
    return bad;
  };
  const std::string swapped = corrupt("swapped.h5", [](hid_t g) {
    h5::Dataset d(H5Dopen2(g, "sparse_channels", H5P_DEFAULT));
    const h5::Space space(H5Dget_space(d.get()));
    std::vector<std::uint16_t> c(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.get())));
    REQUIRE(c.size() >= 2);
    REQUIRE(H5Dread(d.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data()) >= 0);
    std::swap(c[0], c[1]);
    REQUIRE(H5Dwrite(d.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data()) >= 0);
  });
  CHECK_THROWS_WITH(CacheReader(swapped).read_head(1, 0), Catch::Contains("/layers/1/heads/0/value/sparse_channels[1]"));
  const std::string sink = corrupt("sink.h5", [](hid_t g) {
    REQUIRE(H5Adelete(g, "n_sink") >= 0);
    h5::write_attr_int(g, "n_sink", 3);
  });
  CHECK_THROWS_WITH(CacheReader(sink).read_head(1, 0), Catch::Contains("/layers/1/heads/0/value.n_sink = 3"));
}
