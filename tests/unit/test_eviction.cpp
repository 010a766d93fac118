#include <catch2/catch.hpp>
#include <fstream>

#include "akv/alloc/knapsack.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/fidelity.h"
#include "akv/kv/compress.h"
#include "akv/kv/joint.h"
#include <cmath>
#include <functional>
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <numeric>
#include "akv/alloc/budgets_file.h"
#include "akv/io/file_hash.h"
#include "akv/io/hdf5.h"
#include "akv/synth/synth.h"
#include "test_util.h"

using namespace akv;

namespace {

SynthOptions mixed() {
  SynthOptions so;
  so.n_layers = 3;
  so.n_heads = 16;
  so.n_kv_heads = 8;
  so.head_dim = 64;
  so.n_tokens = 1024;
  so.window = 32;
  so.seed = 5;
  so.threads = 2;
  return so;
}

// mixed() with 2 layers of 256 tokens (16 KV heads in all).
SynthOptions small_mixed() {
  SynthOptions so = mixed();
  so.n_layers = 2;
  so.n_tokens = 256;
  return so;
}

CompressParams evict(const std::string& method, double budget, const std::string& quant = "none",
                     const std::string& capacity_rule = "official") {
  CompressRequest r;
  r.method = method;
  r.quant = quant;
  r.eviction.budget = budget;
  if (method.rfind("adakv", 0) == 0) r.eviction.capacity_rule = capacity_rule;
  return resolve_params(r);
}

// Every head's kept positions, [layer][kv head].
std::vector<std::vector<std::vector<std::int32_t>>> kept_of(const EvictionPlan& plan) {
  std::vector<std::vector<std::vector<std::int32_t>>> out;
  for (const auto& layer : plan.heads) {
    out.emplace_back();
    for (const HeadPlan& h : layer) out.back().push_back(h.kept);
  }
  return out;
}

// A joint budgets file `j` written to dir/j.json and applied by akv compress to dir/d.h5 (-> dir/j.h5).
MemoryReport compress_with_budgets(const test::TempDir& dir, const nlohmann::json& j) {
  {
    std::ofstream out(dir.file("j.json"));
    out << j.dump(2);
  }
  CompressRequest r;
  r.method = "snapkv";
  r.quant = "kivi";
  r.eviction.budgets_file = dir.file("j.json");
  return compress_dump(dir.file("d.h5"), dir.file("j.h5"), resolve_params(r), 2, {});
}

}  // namespace

TEST_CASE("plan_eviction: totals, forced tokens kept, full budget keeps all", "[eviction]") {
  test::TempDir dir;
  SynthOptions so = mixed();
  write_synth_dump(dir.file("d.h5"), so, {});
  DumpReader dump(dir.file("d.h5"));
  for (const std::string& name : eviction_method_names()) {
    // joint is planned by plan_joint, kvzip's scores (also duo's) come from the model (tested below),
    // kvzap's from attention inputs synth dumps lack (test_golden, tests/cli/test_model.sh)
    if (name == "joint" || score_is_given(eviction_method(name).score.method)) continue;
    EvictionParams p = eviction_method(name);
    if (p.critical) continue;  // reads W_o, which synth dumps lack (its own test below)
    if (p.score.method == ScoreMethod::qfilter) continue;  // reads a calibration file (test_eval)
    p.budget_tokens = 150;
    p.score.window = 16;
    const EvictionPlan plan = plan_eviction(dump, p, 2, {});
    INFO(name);
    if (name.rfind("adakv", 0) == 0) {
      // The official capacity rule truncates int(alpha * base) and rounds each head on its own:
      // every head within (alpha * base - int(alpha * base)) + 1/2 below and 1/2 above its share.
      const double base = 150.0 - static_cast<double>(plan.forced);
      const double below = 0.2 * base - std::floor(0.2 * base) + 0.5;
      CHECK(static_cast<double>(plan.total_tokens()) >= 3 * 8 * (150 - below));
      CHECK(static_cast<double>(plan.total_tokens()) <= 3 * 8 * 150.5);
      p.capacity_rule = CapacityRule::exact_total;
      CHECK(plan_eviction(dump, p, 2, {}).total_tokens() == 3 * 8 * 150);
    } else {
      CHECK(plan.total_tokens() == 3 * 8 * 150);
    }
    const std::size_t floor = static_cast<std::size_t>(0.2 * (150 - plan.forced));
    for (const auto& layer : plan.heads) {
      for (const HeadPlan& h : layer) {
        CHECK(h.tokens == h.kept.size());
        CHECK(std::is_sorted(h.kept.begin(), h.kept.end()));
        CHECK(std::adjacent_find(h.kept.begin(), h.kept.end()) == h.kept.end());
        // the window (last 16) and the sinks are always kept
        for (std::int32_t t = 1024 - 16; t < 1024; ++t) {
          CHECK(std::binary_search(h.kept.begin(), h.kept.end(), t));
        }
        for (std::int32_t t = 0; t < static_cast<std::int32_t>(p.sinks); ++t) {
          CHECK(std::binary_search(h.kept.begin(), h.kept.end(), t));
        }
        if (name == "adakv" || name == "adakv-global") CHECK(h.tokens >= plan.forced + floor);
        CHECK(h.retained_mass > 0.0);
        CHECK(h.retained_mass <= 1.0 + 1e-9);
      }
    }
  }
  // StreamingLLM: sinks plus the most recent tokens, nothing else.
  EvictionParams s = eviction_method("streamingllm");
  s.budget_tokens = 100;
  const EvictionPlan sp = plan_eviction(dump, s, 1, {});
  CHECK(sp.heads[1][3].kept.front() == 0);
  CHECK(sp.heads[1][3].kept[4] == 1024 - 96);
  // Bad budgets.
  EvictionParams b = eviction_method("snapkv");
  b.budget_tokens = 32;  // == window
  CHECK_THROWS_AS(plan_eviction(dump, b, 1, {}), InvalidInput);
  b.budget_tokens.reset();
  b.budget_fraction = 1.5;
  CHECK_THROWS_AS(plan_eviction(dump, b, 1, {}), InvalidInput);
  b.budget_fraction = 0.5;
  b.score.window = 33;  // > n_query
  CHECK_THROWS_AS(plan_eviction(dump, b, 1, {}), InvalidInput);
}

TEST_CASE("eviction with a budget >= n_tokens equals method none bit for bit", "[eviction]") {
  test::TempDir dir;
  SynthOptions so = mixed();
  so.n_layers = 1;
  write_synth_dump(dir.file("d.h5"), so, {});
  CompressRequest none;
  none.method = "none";
  const MemoryReport a = compress_dump(dir.file("d.h5"), dir.file("n.h5"), resolve_params(none), 2, {});
  const MemoryReport b = compress_dump(dir.file("d.h5"), dir.file("e.h5"), evict("adakv", 1.0), 2, {});
  CHECK(a.total.total() == b.total.total());
  CHECK(b.total.indices == 0);
  CacheReader ca(dir.file("n.h5")), cb(dir.file("e.h5"));
  for (std::size_t h = 0; h < 8; ++h) {
    const HeadCache x = ca.read_head(0, h), y = cb.read_head(0, h);
    CHECK(y.kept.empty());
    for (const auto& [s, t] : {std::pair{&x.key, &y.key}, std::pair{&x.value, &y.value}}) {
      REQUIRE(s->dense_rows() == t->dense_rows());
      CHECK(std::equal(s->dense_f16(0), s->dense_f16(0) + s->dense_rows() * s->head_dim(), t->dense_f16(0)));
    }
  }
}

TEST_CASE("adakv beats uniform SnapKV on mixed heads at 10%, 20%, 50%", "[eviction]") {
  // Compared at exactly equal totals (exact-total capacities).
  test::TempDir dir;
  const SynthOptions so = mixed();
  write_synth_dump(dir.file("d.h5"), so, {});
  DumpReader dump(dir.file("d.h5"));
  for (double budget : {0.1, 0.2, 0.5}) {
    const EvictionPlan snap = plan_eviction(dump, *evict("snapkv", budget).eviction(), 2, {});
    const EvictionPlan ada = plan_eviction(dump, *evict("adakv", budget, "none", "exact-total").eviction(), 2, {});
    CHECK(snap.total_tokens() == ada.total_tokens());
    for (std::size_t l = 0; l < so.n_layers; ++l) {
      double ms = 0, ma = 0;
      for (std::size_t h = 0; h < so.n_kv_heads; ++h) {
        ms += snap.heads[l][h].retained_mass;
        ma += ada.heads[l][h].retained_mass;
      }
      INFO("budget " << budget << " layer " << l << " snapkv " << ms / 8 << " adakv " << ma / 8);
      CHECK(ma > ms);
    }
    compress_dump(dir.file("d.h5"), dir.file("s.h5"), evict("snapkv", budget), 2, {});
    compress_dump(dir.file("d.h5"), dir.file("a.h5"), evict("adakv", budget, "none", "exact-total"), 2, {});
    const FidelityMetrics fs = metrics(evaluate_cache(dir.file("d.h5"), dir.file("s.h5"), 2, true, {}).total());
    const FidelityMetrics fa = metrics(evaluate_cache(dir.file("d.h5"), dir.file("a.h5"), 2, true, {}).total());
    INFO("budget " << budget << " attn error snapkv " << fs.attn_rel_err << " adakv " << fa.attn_rel_err);
    CHECK(fa.attn_rel_err < fs.attn_rel_err);
    CHECK(fa.retained_mass > fs.retained_mass);
  }
}

TEST_CASE("budgets file: round trip through compress, shape check; eviction + quantization",
          "[eviction]") {
  test::TempDir dir;
  SynthOptions so = mixed();
  so.n_layers = 2;
  write_synth_dump(dir.file("d.h5"), so, {});
  DumpReader dump(dir.file("d.h5"));
  const EvictionParams p = *evict("adakv", 0.25).eviction();
  const EvictionPlan plan = plan_eviction(dump, p, 2, {});
  {
    std::ofstream out(dir.file("b.json"));
    out << budgets_json(plan, dump, file_hash(dir.file("d.h5"))).dump(2);
  }
  CompressRequest r;
  r.method = "snapkv";  // the file decides the budgets and the scoring
  r.eviction.budgets_file = dir.file("b.json");
  r.quant = "k4v2";
  const MemoryReport rep = compress_dump(dir.file("d.h5"), dir.file("c.h5"), resolve_params(r), 2, {});
  CacheReader c(dir.file("c.h5"));
  std::uint64_t kept = 0;
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 8; ++h) {
      const HeadCache hc = c.read_head(l, h);
      CHECK(hc.kept == plan.heads[l][h].kept);
      if (hc.key.packed_rows() > 0) CHECK(hc.key.packed_params().bits == 4);
      if (hc.value.packed_rows() > 0) CHECK(hc.value.packed_params().bits == 2);
      CHECK(hc.value.packed_rows() == hc.kept.size() - std::min<std::size_t>(hc.kept.size(), 128));
      kept += hc.kept.size();
    }
  }
  CHECK(rep.total.indices == 4 * kept);
  CHECK(rep.eviction["total_tokens"].get<std::uint64_t>() == kept);
  // A budgets file for another shape is refused.
  so.n_layers = 3;
  write_synth_dump(dir.file("other.h5"), so, {});
  CHECK_THROWS_AS(compress_dump(dir.file("other.h5"), dir.file("x.h5"), resolve_params(r), 1, {}),
                  InvalidInput);
}

TEST_CASE("joint knapsack with real costs equals brute force on integer costs", "[eviction][joint]") {
  Rng r(21);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + r.below(4), k = 1 + r.below(4);
    std::vector<std::vector<double>> err(n, std::vector<double>(k)), cost(n, std::vector<double>(k));
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        err[i][j] = r.uniform();
        cost[i][j] = static_cast<double>(1 + r.below(10));
      }
    }
    const double budget = static_cast<double>(n * 3 + r.below(20));
    double best = INFINITY;
    std::function<void(std::size_t, double, double)> rec = [&](std::size_t i, double c, double e) {
      if (c > budget) return;
      if (i == n) {
        best = std::min(best, e);
        return;
      }
      for (std::size_t j = 0; j < k; ++j) rec(i + 1, c + cost[i][j], e + err[i][j]);
    };
    rec(0, 0, 0);
    if (!std::isfinite(best)) {
      CHECK_THROWS_AS(knapsack_real(err, cost, budget, static_cast<std::size_t>(budget)), InvalidInput);
      continue;
    }
    const auto pick = knapsack_real(err, cost, budget, static_cast<std::size_t>(budget));
    double e = 0, c = 0;
    for (std::size_t i = 0; i < n; ++i) {
      e += err[i][pick[i]];
      c += cost[i][pick[i]];
    }
    INFO("trial " << trial);
    CHECK(c <= budget);
    CHECK(e == Approx(best).epsilon(1e-12));
  }
}

TEST_CASE("joint allocation: bytes within budget, prediction confirmed, beats uniform SnapKV", "[eviction][joint]") {
  test::TempDir dir;
  SynthOptions so = mixed();
  so.n_layers = 2;
  write_synth_dump(dir.file("d.h5"), so, {});
  // Uniform SnapKV at 20% in f16: one of the joint candidates for every head.
  const MemoryReport snap = compress_dump(dir.file("d.h5"), dir.file("s.h5"), evict("snapkv", 0.2), 2, {});
  JointOptions o;
  o.bytes_fraction = 1.01 * static_cast<double>(snap.total.total()) / static_cast<double>(snap.f16_bytes());
  o.threads = 2;
  const nlohmann::json j = allocate_joint(dir.file("d.h5"), o, {});
  const MemoryReport rep = compress_with_budgets(dir, j);
  CHECK(rep.total.total() == j["joint"]["predicted_bytes"].get<std::uint64_t>());
  CHECK(static_cast<double>(rep.total.total()) <= j["joint"]["bytes_budget"].get<double>());
  const FidelityMetrics fj = metrics(evaluate_cache(dir.file("d.h5"), dir.file("j.h5"), 2, true, {}).total());
  const FidelityMetrics fs = metrics(evaluate_cache(dir.file("d.h5"), dir.file("s.h5"), 2, true, {}).total());
  INFO("joint " << fj.attn_rel_err << " predicted " << j["joint"]["predicted_error"].get<double>() << " snapkv "
                << fs.attn_rel_err);
  CHECK(fj.attn_rel_err == Approx(j["joint"]["predicted_error"].get<double>()).epsilon(1e-4));
  CHECK(fj.attn_rel_err <= fs.attn_rel_err);
  // Too small a budget names the minimum.
  o.bytes_fraction = 0.001;
  try {
    allocate_joint(dir.file("d.h5"), o, {});
    FAIL("expected InvalidInput");
  } catch (const InvalidInput& e) {
    CHECK(std::string(e.what()).find("cheapest choice of every head needs") != std::string::npos);
  }
}

TEST_CASE("joint allocation with a choice of rotation: each head rotated or not by its error, no worse than either "
          "rotation alone, stored and predicted alike", "[eviction][joint][rotation]") {
  test::TempDir dir;
  SynthOptions so = mixed();
  so.n_layers = 2;
  write_synth_dump(dir.file("d.h5"), so, {});
  JointOptions o;
  o.bytes_fraction = 0.2;
  o.threads = 2;
  o.bits = {2, 4};
  auto predicted = [](const nlohmann::json& j) { return j["joint"]["predicted_error"].get<double>(); };
  const double none = predicted(allocate_joint(dir.file("d.h5"), o, {}));
  o.rotate = RotationKind::hadamard;
  const double hadamard = predicted(allocate_joint(dir.file("d.h5"), o, {}));
  o.rotate_choice = true;
  const nlohmann::json j = allocate_joint(dir.file("d.h5"), o, {});
  INFO("none " << none << " hadamard " << hadamard << " choice " << predicted(j));
  CHECK(predicted(j) <= std::min(none, hadamard) * (1 + 1e-12));
  std::map<std::string, int> chosen;
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) ++chosen[h.at("rotate").get<std::string>()];
  }
  CHECK(chosen.size() == 2);  // these heads differ: some take the rotation, some do not
  const MemoryReport rep = compress_with_budgets(dir, j);
  CHECK(rep.total.total() == j["joint"]["predicted_bytes"].get<std::uint64_t>());
  const FidelityMetrics f = metrics(evaluate_cache(dir.file("d.h5"), dir.file("j.h5"), 2, true, {}).total());
  CHECK(f.attn_rel_err == Approx(predicted(j)).epsilon(1e-4));
  const CacheReader c(dir.file("j.h5"));
  CHECK(c.version() == kCacheVersionRotation);
  const std::size_t H = so.n_kv_heads;
  for (std::size_t i = 0; i < so.n_layers * H; ++i) {
    const std::string want = j["layers"][i / H]["heads"][i % H]["rotate"].get<std::string>();
    const HeadCache h = c.read_head(i / H, i % H);
    INFO("layer " << i / H << " head " << i % H << " " << want);
    CHECK(h.key.rotation().active() == (want == "hadamard"));
    CHECK(h.value.rotation().active() == (want == "hadamard"));
  }
  // The choice needs a rotation to choose.
  o.rotate = RotationKind::none;
  CHECK_THROWS_AS(allocate_joint(dir.file("d.h5"), o, {}), UsageError);
  CHECK_THROWS_AS(resolve_method_spec("joint:budget=0.2:quant=kivi:rotate-choice=on"), UsageError);
  CHECK_THROWS_AS(resolve_method_spec("snapkv:budget=0.2:quant=kivi:rotate=hadamard:rotate-choice=on"), UsageError);
  CHECK(resolve_method_spec("joint:budget=0.2:quant=kivi:rotate=hadamard:rotate-choice=on")->eviction()->rotate_choice);
}

TEST_CASE("joint allocation with cache types: each tensor kivi bits or a type by its error, no worse than kivi "
          "alone, stored and predicted alike", "[eviction][joint][ggml]") {
  test::TempDir dir;
  SynthOptions so = small_mixed();
  write_synth_dump(dir.file("d.h5"), so, {});
  JointOptions o;
  o.bytes_fraction = 0.25;
  o.threads = 2;
  o.bits = {2, 4};
  o.window = 16;
  auto predicted = [](const nlohmann::json& j) { return j["joint"]["predicted_error"].get<double>(); };
  const double kivi = predicted(allocate_joint(dir.file("d.h5"), o, {}));
  o.types = {"q8_0", "fp8_e4m3", "q4_0+hadamard"};
  const nlohmann::json j = allocate_joint(dir.file("d.h5"), o, {});
  INFO("kivi " << kivi << " with types " << predicted(j));
  CHECK(predicted(j) <= kivi * (1 + 1e-12));
  const MemoryReport rep = compress_with_budgets(dir, j);
  CHECK(rep.total.total() == j["joint"]["predicted_bytes"].get<std::uint64_t>());
  const FidelityMetrics f = metrics(evaluate_cache(dir.file("d.h5"), dir.file("j.h5"), 2, true, {}).total());
  CHECK(f.attn_rel_err == Approx(predicted(j)).epsilon(1e-4));
  // Each tensor as its head chose: bits 0 and its type's blocks (q8_0: 34 bytes per 32 values; the
  // suffix's rotation), else kivi codes.
  const CacheReader c(dir.file("j.h5"));
  const std::size_t H = so.n_kv_heads, d = so.head_dim;
  std::map<std::string, int> chosen;
  for (std::size_t i = 0; i < so.n_layers * H; ++i) {
    const nlohmann::json& jh = j["layers"][i / H]["heads"][i % H];
    const HeadCache h = c.read_head(i / H, i % H);
    for (const auto& [bits, type, t] : {std::tuple{"key_bits", "key_type", &h.key}, std::tuple{"value_bits", "value_type", &h.value}}) {
      INFO("layer " << i / H << " head " << i % H << " " << jh.dump());
      const int b = jh.at(bits).get<int>();
      CHECK((b == 0) == jh.contains(type));
      CHECK((b == 0) == (t->ggml_type() != nullptr));
      if (b != 0) continue;
      const std::string name = jh.at(type).get<std::string>();
      ++chosen[name];
      CHECK(t->rotation().active() == (name == "q4_0+hadamard"));
      if (name == "q8_0") CHECK(t->bytes() == h.n_kept() * d / 32 * 34);
      if (name == "fp8_e4m3") CHECK(t->bytes() == h.n_kept() * d + 4);
    }
  }
  CHECK(!chosen.empty());  // at this budget some tensors are better stored as a type
  CHECK(c.version() == (chosen.count("fp8_e4m3") ? kCacheVersionFp8
                        : chosen.count("q4_0+hadamard") ? kCacheVersionRotation
                                                        : kCacheVersionGgml));
  // The runtime method's spelling, and its refusals.
  const auto p = resolve_method_spec("joint:budget=0.2:quant=kivi:cache-types=q8_0/fp8_e4m3/q4_0+hadamard");
  CHECK(p->eviction()->cache_types == o.types);
  CHECK(EvictionParams::from_json(p->eviction()->to_json(), "").cache_types == o.types);
  CHECK_THROWS_AS(resolve_method_spec("snapkv:budget=0.2:quant=kivi:cache-types=q8_0"), UsageError);
  CHECK_THROWS_AS(resolve_method_spec("joint:budget=0.2:quant=kivi:cache-types=q9_0"), InvalidInput);
  CHECK_THROWS_AS(resolve_method_spec("joint:budget=0.2:quant=kivi:cache-types=q8_0//q4_0"), InvalidInput);
  CHECK_THROWS_AS(resolve_method_spec("joint:budget=0.2:quant=kivi:cache-types=q8_0/q8_0"), InvalidInput);
  o.types = {"q4_0+sideways"};
  CHECK_THROWS_AS(allocate_joint(dir.file("d.h5"), o, {}), InvalidInput);
}

TEST_CASE("streaming_victim on rows in any order equals a chronological scan", "[eviction]") {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    // Kept positions (ascending = chronological), scores with many ties.
    std::vector<std::int32_t> pos;
    for (std::int32_t p = 0; p < 80; ++p) {
      if (rng.uniform() < 0.5) pos.push_back(p);
    }
    const std::size_t n = pos.size(), sinks = static_cast<std::size_t>(rng.uniform() * 5);
    std::vector<double> score(n);
    for (double& s : score) s = std::floor(rng.uniform() * 4.0);
    const std::size_t window = static_cast<std::size_t>(rng.uniform() * 20);
    const std::int64_t newest = window == 0 ? std::numeric_limits<std::int64_t>::max()
                                : window > n ? std::numeric_limits<std::int64_t>::min()
                                             : pos[n - window];
    for (const bool oldest : {true, false}) {
      // Reference: the rows in chronological order, the last `window` and the sinks forced.
      std::size_t want = n;
      for (std::size_t i = 0; i + std::min(n, window) < n; ++i) {
        if (static_cast<std::size_t>(pos[i]) < sinks) continue;
        if (want == n || (!oldest && score[i] < score[want])) want = i;
        if (oldest) break;
      }
      // The same rows shuffled.
      std::vector<std::size_t> perm(n);
      std::iota(perm.begin(), perm.end(), std::size_t{0});
      for (std::size_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[static_cast<std::size_t>(rng.uniform() * static_cast<double>(i))]);
      std::vector<std::int32_t> p2(n);
      std::vector<double> s2(n);
      for (std::size_t i = 0; i < n; ++i) {
        p2[i] = pos[perm[i]];
        s2[i] = score[perm[i]];
      }
      const std::size_t got = streaming_victim(p2.data(), s2.data(), n, sinks, newest, oldest);
      INFO("trial " << trial << " oldest " << oldest << " n " << n << " sinks " << sinks << " window " << window);
      if (want == n) {
        CHECK(got == n);
      } else {
        REQUIRE(got < n);
        CHECK(p2[got] == pos[want]);
      }
    }
  }
}

TEST_CASE("kvzip: the given scores' global top-k over every head of every layer; refused without them",
          "[eviction]") {
  KvWindow m;
  m.n_layers = 2;
  m.n_heads = m.n_kv_heads = 2;
  m.head_dim = 4;
  m.n_tokens = 20;
  m.n_query = 1;
  // Head (l, h) scores token t as (l * 2 + h + 1) * t: head (1, 1) holds the 8 largest selectable
  // scores, then (1, 0)...; budget 6 tokens per head on average, 4 sinks forced.
  TokenScores given(2, std::vector<std::vector<double>>(2, std::vector<double>(20)));
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t t = 0; t < 20; ++t) given[l][h][t] = static_cast<double>((l * 2 + h + 1) * t);
    }
  }
  const LayerSource source = [&](std::size_t, Tensor3& q, Tensor3& k, Tensor3*) {
    q = Tensor3(2, 1, 4);
    k = Tensor3(2, 20, 4);
  };
  EvictionParams p = eviction_method("kvzip");
  p.budget_tokens = 6;
  const EvictionPlan plan = plan_eviction(m, source, p, 1, {}, &given);
  // 4 x 2 = 8 selectable slots: a brute-force global top 8 of (l * 2 + h + 1) * t, t in 4..19.
  std::vector<std::tuple<double, std::size_t, std::size_t>> all;
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t t = 4; t < 20; ++t) all.emplace_back(given[l][h][t], l * 2 + h, t);
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::vector<std::vector<std::int32_t>> want(4, std::vector<std::int32_t>{0, 1, 2, 3});
  for (std::size_t i = 0; i < 8; ++i) want[std::get<1>(all[i])].push_back(static_cast<std::int32_t>(std::get<2>(all[i])));
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t h = 0; h < 2; ++h) {
      std::vector<std::int32_t>& w = want[l * 2 + h];
      std::sort(w.begin(), w.end());
      CHECK(plan.heads[l][h].kept == w);
    }
  }
  CHECK(plan.total_tokens() == 4 * 6);
  CHECK_THROWS_AS(plan_eviction(m, source, p, 1, {}), UsageError);
}

TEST_CASE("CriticalKV on a dump: a brute-force two-stage selection, stage 1 alone = the plain method, W_o required",
          "[eviction][critical]") {
  test::TempDir dir;
  const SynthOptions so = small_mixed();
  const std::string path = dir.file("d.h5");
  write_synth_dump(path, so, {});
  EvictionParams p = eviction_method("critical-snapkv");
  p.budget_tokens = 40;
  p.score.window = 16;
  CHECK_THROWS_WITH(plan_eviction(DumpReader(path), p, 1, {}), Catch::Contains("/layers/0/o_proj = missing"));
  const std::size_t cols = so.n_heads * so.head_dim;
  std::vector<RowMatrix> wo;
  {
    h5::File f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    Rng r(9);
    for (std::size_t l = 0; l < so.n_layers; ++l) {
      RowMatrix w(32, static_cast<Eigen::Index>(cols));
      for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(r.normal() * (i % 7 == 0 ? 3.0 : 0.2));
      h5::write_dataset(f.get(), "/layers/" + std::to_string(l) + "/o_proj", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                        {32, cols}, w.data());
      wo.push_back(w);
    }
  }
  const DumpReader dump(path);
  const KvWindow& m = dump.meta();
  const EvictionPlan plan = plan_eviction(dump, p, 1, {});
  CHECK(plan.total_tokens() == so.n_layers * so.n_kv_heads * 40);
  CHECK(kept_of(plan_eviction(dump, p, 2, {})) == kept_of(plan));
  // Brute force: forced 16 (window), stage 1 int(40 x 0.5) - 16 = 4 best-scored, stage 2 the best
  // 20 others by (score + 1e-4) x |W_o v|_1 (the f64 reference), ties to the earlier position.
  std::size_t stage2_differs = 0;
  for (std::size_t l = 0; l < so.n_layers; ++l) {
    const Tensor3 q = dump.read(l, DumpField::query), k = dump.read(l, DumpField::key), v = dump.read(l, DumpField::value);
    const auto norm = projected_value_norms_ref(v, wo[l], so.n_heads);
    for (std::size_t h = 0; h < so.n_kv_heads; ++h) {
      const std::vector<double> s = score_head(q, k, h, m, p.score, nullptr, 0).score;
      std::vector<std::size_t> sel(m.n_tokens - 16);
      std::iota(sel.begin(), sel.end(), 0);
      std::stable_sort(sel.begin(), sel.end(), [&](std::size_t a, std::size_t b) { return s[a] > s[b]; });
      std::vector<std::int32_t> want(sel.begin(), sel.begin() + 4);
      std::vector<std::size_t> rest(sel.begin() + 4, sel.end());
      std::stable_sort(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) {
        const double wa = (s[a] + 1e-4) * norm[h][a], wb = (s[b] + 1e-4) * norm[h][b];
        return wa > wb || (wa == wb && a < b);
      });
      want.insert(want.end(), rest.begin(), rest.begin() + 20);
      for (std::size_t t = m.n_tokens - 16; t < m.n_tokens; ++t) want.push_back(static_cast<std::int32_t>(t));
      std::sort(want.begin(), want.end());
      INFO("layer " << l << " head " << h);
      CHECK(plan.heads[l][h].kept == want);
      // The weighing changes what stage 2 keeps (else this test could not tell the methods apart).
      std::vector<std::int32_t> plain(sel.begin(), sel.begin() + 24);
      for (std::size_t t = m.n_tokens - 16; t < m.n_tokens; ++t) plain.push_back(static_cast<std::int32_t>(t));
      std::sort(plain.begin(), plain.end());
      stage2_differs += plain != want;
    }
  }
  CHECK(stage2_differs > 0);
  // Stage 1 over the whole budget is the plain method: SnapKV, and Ada-KV under kvpress's rule.
  p.first_stage = 1.0;
  EvictionParams snap = eviction_method("snapkv");
  snap.budget_tokens = 40;
  snap.score.window = 16;
  CHECK(kept_of(plan_eviction(dump, p, 1, {})) == kept_of(plan_eviction(dump, snap, 1, {})));
  EvictionParams ada = eviction_method("critical-adakv");
  ada.budget_tokens = 40;
  ada.score.window = 16;
  const EvictionPlan critical_ada = plan_eviction(dump, ada, 1, {});
  CHECK(critical_ada.total_tokens() == so.n_layers * so.n_kv_heads * 40);
  ada.first_stage = 1.0;
  const EvictionPlan stage1_ada = plan_eviction(dump, ada, 1, {});
  ada.critical = false;
  CHECK(kept_of(stage1_ada) == kept_of(plan_eviction(dump, ada, 1, {})));
  CHECK(kept_of(critical_ada) != kept_of(stage1_ada));
}

TEST_CASE("duo: the best-scored heads keep everything, the others their sinks and recent tokens", "[eviction][duo]") {
  test::TempDir dir;
  const SynthOptions so = small_mixed();
  write_synth_dump(dir.file("d.h5"), so, {});
  const DumpReader dump(dir.file("d.h5"));
  const KvWindow& m = dump.meta();
  CompressRequest r;
  r.method = "duo";
  r.eviction.score = "snapkv";
  r.eviction.window = 16;
  r.eviction.sinks = 8;
  r.eviction.budget_tokens = 100;
  const EvictionParams p = *resolve_params(r).eviction();
  CHECK(p.sinks == 8);
  CompressRequest defaults = r;  // score= alone keeps duo's 128 sinks and 256 recent tokens
  defaults.eviction.window.reset();
  defaults.eviction.sinks.reset();
  CHECK(resolve_params(defaults).eviction()->sinks == 128);
  CHECK(resolve_params(defaults).eviction()->score.window == 256);
  const EvictionPlan plan = plan_eviction(dump, p, 2, {});
  // 16 heads, 24 forced and 232 selectable tokens each: round(16 x 76 / 232) = 5 keep all.
  std::vector<std::pair<double, std::size_t>> best;  // (a head's best selectable score, l * H + h)
  for (std::size_t l = 0; l < so.n_layers; ++l) {
    const Tensor3 q = dump.read(l, DumpField::query), k = dump.read(l, DumpField::key);
    for (std::size_t h = 0; h < so.n_kv_heads; ++h) {
      const std::vector<double> s = score_head(q, k, h, m, p.score, nullptr, 8).score;
      best.emplace_back(*std::max_element(s.begin() + 8, s.end() - 16), l * so.n_kv_heads + h);
    }
  }
  std::stable_sort(best.begin(), best.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; i < best.size(); ++i) {
    const std::size_t l = best[i].second / so.n_kv_heads, h = best[i].second % so.n_kv_heads;
    INFO("rank " << i << " layer " << l << " head " << h);
    CHECK(plan.heads[l][h].tokens == (i < 5 ? 256u : 24u));
  }
  CHECK(plan.total_tokens() == 5 * 256 + 11 * 24);
  // A budget of the forced tokens alone is refused; the whole sequence keeps every head.
  EvictionParams all = p;
  all.budget_tokens = 256;
  CHECK(plan_eviction(dump, all, 1, {}).total_tokens() == 16 * 256);
  all.budget_tokens = 24;
  CHECK_THROWS_AS(plan_eviction(dump, all, 1, {}), InvalidInput);
}
