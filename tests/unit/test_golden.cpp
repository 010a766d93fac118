// akv's named methods against outputs of their official implementations (data/golden, written by
// scripts/dev/golden/official.py and scripts/dev/golden/kivi.py; docs/eviction.md, "Fidelity to the
// reference implementations").
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "akv/alloc/calibration_file.h"
#include "akv/alloc/eviction.h"
#include "akv/core/errors.h"
#include "akv/eval/calibrate.h"
#include "akv/eval/kvzip.h"
#include "akv/io/dump.h"
#include "akv/kv/runtime.h"
#include "akv/method/registry.h"
#include "akv/model/llama2c.h"
#include "akv/kv/stored_head.h"
#include "akv/quant/nuq.h"
#include "akv/quant/pack.h"
#include "akv/score/kvzap.h"
#include "akv/tensor/half.h"
#include "test_util.h"

using namespace akv;

namespace {

const std::string kGolden = std::string(AKV_SOURCE_DIR) + "/data/golden/";

// Every method of a golden file: each head keeps as many tokens as the official code, and the
// same tokens except where the official scores tie at the head's cutoff (torch's sort and topk
// leave their order open; akv keeps the earliest).
// `adjust` sets what a file cannot say (e.g. where qfilter's filters are).
void check_golden(const std::string& name, const std::function<void(EvictionParams&)>& adjust = {}) {
  std::ifstream in(kGolden + name);
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const DumpReader dump(kGolden + g["dump"].get<std::string>());
  for (const auto& [entry, official] : g["methods"].items()) {
    // An entry names its method, or is one ("critical-adakv/knorm": critical-adakv with score knorm).
    const std::string method = official.value("method", entry);
    EvictionParams p = eviction_method(method);
    // A budget, window, sinks (and lagkv's lag; an allocator's score, capacity rule and alpha;
    // expected-attention's vnorm) per method where the references differ, else the file's.
    if (official.contains("score")) p.score.method = parse_score_method(official["score"].get<std::string>());
    p.score.vnorm = official.value("vnorm", p.score.vnorm);
    if (official.contains("capacity_rule")) p.capacity_rule = parse_capacity_rule(official["capacity_rule"].get<std::string>());
    p.alpha = official.value("alpha", p.alpha);
    p.budget_fraction = official.value("budget", g["budget"].get<double>());
    p.score.window = official.value("window", g.value("window", std::size_t{0}));
    p.sinks = official.value("sinks", p.sinks);
    p.score.lag = official.value("lag", p.score.lag);
    if (adjust) adjust(p);
    const EvictionPlan plan = plan_eviction(dump, p, 1, {});
    const nlohmann::json& layers = official["layers"];
    REQUIRE(layers.size() == plan.heads.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      for (std::size_t h = 0; h < layers[l].size(); ++h) {
        const nlohmann::json& want = layers[l][h];
        const HeadPlan& mine = plan.heads[l][h];
        INFO(name << ": " << entry << " (" << official["reference"].get<std::string>() << ") layer " << l
                  << " head " << h);
        CHECK(mine.tokens == want["budget"].get<std::size_t>());
        const auto kept = want["kept"].get<std::vector<std::int32_t>>();
        const auto tied = want["tied"].get<std::set<std::int32_t>>();
        std::vector<std::int32_t> differ;
        std::set_symmetric_difference(mine.kept.begin(), mine.kept.end(), kept.begin(), kept.end(),
                                      std::back_inserter(differ));
        for (std::int32_t t : differ) {
          INFO("position " << t << " kept by one side only");
          CHECK(tied.count(t) == 1);
        }
      }
    }
  }
}

// One tensor part against KIVI's codes (one hex digit each), scales and zeros (f16 bits).
void check_kivi_part(const PackedTensor& mine, const nlohmann::json& want, std::size_t d) {
  REQUIRE(mine.packed_rows() == want["n_quant"].get<std::size_t>());
  CHECK(mine.scales() == want["scale"].get<std::vector<std::uint16_t>>());
  CHECK(mine.zeros() == want["zero"].get<std::vector<std::uint16_t>>());
  const std::string hex = want["codes"].get<std::string>();
  REQUIRE(hex.size() == mine.packed_rows() * d);
  std::vector<std::uint8_t> codes(hex.size());
  if (!codes.empty()) unpack_codes_ref(mine.codes(), codes.size(), mine.packed_params().bits, codes.data());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < hex.size(); ++i) {
    differ += codes[i] != static_cast<std::uint8_t>(std::stoi(std::string(1, hex[i]), nullptr, 16));
  }
  CHECK(differ == 0);
}

// KVzip's golden file `file` (scripts/dev/golden/kvpress_kvzip.py) on stories260K: every score
// within 1e-4 relative, and the kept pairs equal but within 1e-4 of the cutoff (skipped, with a
// warning, without ../shared).
void check_kvzip_golden(const std::string& file) {
  if (!test::have_shared()) {
    WARN("skipped: " << test::shared_dir() << "/models/stories260K.bin not found (set AKV_SHARED_DIR)");
    return;
  }
  std::ifstream in(kGolden + file);
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const Model model = load_llama2c(test::shared_dir() + "/models/stories260K.bin");
  const auto context = g["context"].get<std::vector<std::int32_t>>();
  const KvzipPrompts prompts{g["prompts"]["first"].get<std::vector<std::int32_t>>(),
                             g["prompts"]["later"].get<std::vector<std::int32_t>>(),
                             g["prompts"]["suffix"].get<std::vector<std::int32_t>>()};
  const std::size_t n = context.size(), sinks = g["n_sink"].get<std::size_t>();
  const TokenScores mine = kvzip_scores(model, context, prompts, sinks, 2, g["chunk"].get<std::size_t>(),
                                        g.value("kvzip_plus_normalization", false));
  // Scores: torch and akv run the same f32 forward in another order.
  const nlohmann::json& layers = g["layers"];
  REQUIRE(layers.size() == mine.size());
  std::vector<double> all;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (std::size_t h = 0; h < layers[l].size(); ++h) {
      const auto want = layers[l][h]["score"].get<std::vector<double>>();
      REQUIRE(want.size() == n);
      for (std::size_t t = 0; t < n; ++t) {
        INFO("layer " << l << " head " << h << " token " << t);
        CHECK(mine[l][h][t] == Approx(want[t]).epsilon(1e-4).margin(1e-7));
        all.push_back(want[t]);
      }
    }
  }
  // The KVzip authors' scoring function (snu-mllab/KVzip KVScore._get_score) on the same forwards:
  // equal for every chunk after the first; in the first its sink tokens enter the softmax twice
  // (the authors always put a system prompt before the context), so it is not compared.
  if (g.contains("authors")) {
    const nlohmann::json& authors = g["authors"];
    REQUIRE(authors["sink"].get<std::size_t>() == sinks);
    std::size_t compared = 0;
    for (const auto& chunk : authors["chunks"]) {
      const auto start = chunk[0].get<std::size_t>(), end = chunk[1].get<std::size_t>();
      if (start < sinks) continue;
      for (std::size_t l = 0; l < mine.size(); ++l) {
        for (std::size_t h = 0; h < mine[l].size(); ++h) {
          for (std::size_t t = start; t < end; ++t) {
            INFO("authors' score: layer " << l << " head " << h << " token " << t);
            CHECK(mine[l][h][t] == Approx(authors["scores"][l][h][t].get<double>()).epsilon(1e-4).margin(1e-7));
            ++compared;
          }
        }
      }
    }
    CHECK(compared > 0);
  }
  // Kept: kvpress prunes the int(ratio * numel) lowest (head, token) pairs over all layers, sinks
  // included (its sink scores are overwritten by the first chunk's); akv's kvzip without forced
  // sinks (sinks 0) is the same global top-k. Pairs kept by one side only lie within 1e-4 of the
  // cutoff score.
  std::sort(all.begin(), all.end(), std::greater<double>());
  const std::size_t kept_total = all.size() - static_cast<std::size_t>(g["ratio"].get<double>() * static_cast<double>(all.size()));
  const double cutoff = all[kept_total - 1];
  KvWindow m;
  m.kv_shape() = model.config().kv_shape();
  m.n_tokens = n;
  m.n_query = n;
  EvictionParams p = eviction_method("kvzip");
  p.score.plus = g.value("kvzip_plus_normalization", false);
  p.sinks = 0;
  p.budget_fraction = 1.0 - g["ratio"].get<double>();
  const PrefillResult pre = model.prefill(context, false, 1);
  const EvictionPlan plan = plan_eviction(
      m, [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3*) { q = pre.query[l]; k = pre.key[l]; }, p, 1, {}, &mine);
  CHECK(plan.total_tokens() == kept_total);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (std::size_t h = 0; h < layers[l].size(); ++h) {
      const auto kept = layers[l][h]["kept"].get<std::vector<std::int32_t>>();
      const auto want = layers[l][h]["score"].get<std::vector<double>>();
      std::vector<std::int32_t> differ;
      std::set_symmetric_difference(plan.heads[l][h].kept.begin(), plan.heads[l][h].kept.end(), kept.begin(),
                                    kept.end(), std::back_inserter(differ));
      for (std::int32_t t : differ) {
        INFO("layer " << l << " head " << h << " token " << t << " kept by one side only");
        CHECK(std::fabs(want[static_cast<std::size_t>(t)] - cutoff) <= 1e-4 * cutoff);
      }
    }
  }
}

}  // namespace

TEST_CASE("KIVI: codes, scales, zeros and the residual split equal the official quantizer's", "[golden][quant]") {
  // scripts/dev/golden/kivi.py KIVI_CHECKOUT data/golden/kivi-dump.h5 data/golden/kivi-official.json
  std::ifstream in(kGolden + "kivi-official.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const DumpReader dump(kGolden + g["dump"].get<std::string>());
  const std::size_t d = dump.meta().head_dim, n = dump.meta().n_tokens;
  REQUIRE(g["heads"].size() == 2 * dump.meta().n_layers * dump.meta().n_kv_heads);
  for (const nlohmann::json& e : g["heads"]) {
    const std::size_t layer = e["layer"].get<std::size_t>(), head = e["head"].get<std::size_t>();
    const int bits = e["bits"].get<int>();
    const Tensor3 k = dump.read(layer, DumpField::key, head, 1), v = dump.read(layer, DumpField::value, head, 1);
    HeadInput hi;
    hi.key = k.row(0, 0);
    hi.value = v.row(0, 0);
    hi.n = hi.n_tokens = n;
    hi.head_dim = d;
    QuantParams p;  // the defaults: kivi, rule kivi
    p.key = {bits, QuantAxis::channel, g["group"].get<std::size_t>()};
    p.value = {bits, QuantAxis::token, g["group"].get<std::size_t>()};
    p.residual = g["residual"].get<std::size_t>();
    for (bool ref : {false, true}) {
      INFO("layer " << layer << " head " << head << " bits " << bits << (ref ? " reference" : " fast"));
      const HeadCache c = ref ? compress_head_ref(hi, p) : compress_head(hi, p);
      check_kivi_part(c.key, e["key"], d);
      check_kivi_part(c.value, e["value"], d);
    }
  }
}

TEST_CASE("Ada-KV, SnapKV, PyramidKV and Ada-KV pyramid keep what their official code keeps (GQA 4, 20%)", "[golden][alloc]") {
  // scripts/dev/golden/official.py data/golden/gqa4-dump.h5 data/golden/gqa4-official.json
  //   --adakv ADAKV_CHECKOUT --kvcache-factory KVCACHE_FACTORY_CHECKOUT
  check_golden("gqa4-official.json");
}

TEST_CASE("knorm, keydiff, TOVA, Expected Attention (25%), LagKV (50%), AdaKV over knorm (25%) and CriticalKV / "
          "CriticalAdaKV over knorm and Expected Attention (25%) keep what kvpress's presses keep",
          "[golden][alloc]") {
  // scripts/dev/golden/kvpress.py KVPRESS data/golden/kvpress-dump.h5 data/golden/kvpress-official.json
  //   --add-o-proj 64
  // (every prompt query in the dump, a random W_o; ties within a relative 1e-5 of a cutoff)
  check_golden("kvpress-official.json");
}

TEST_CASE("Q-Filters: calibrate's filters equal the authors' make_filters.py, and qfilter keeps what kvpress's "
          "QFilterPress keeps (two stories260K dumps, 25%)",
          "[golden][alloc]") {
  // scripts/dev/golden/qfilter.py QFILTERS KVPRESS data/golden/qfilter-official.json
  //   data/golden/qfilter-stories-1.h5 data/golden/qfilter-stories-2.h5
  // (the filters fitted on both dumps' 2 x 96 queries; the press run on the second dump's keys)
  std::ifstream in(kGolden + "qfilter-official.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  std::vector<std::string> dumps;
  for (const auto& d : g["dumps"]) dumps.push_back(kGolden + d.get<std::string>());
  const nlohmann::json calib = calibrate(dumps, CalibrateOptions{}, {});
  const nlohmann::json& want = g["filters"]["values"];
  REQUIRE(want.size() == calib["layers"].size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    for (std::size_t h = 0; h < want[l].size(); ++h) {
      const auto mine = calib["layers"][l]["heads"][h]["qfilter"].get<std::vector<double>>();
      const auto ref = want[l][h].get<std::vector<double>>();
      REQUIRE(mine.size() == ref.size());
      for (std::size_t c = 0; c < ref.size(); ++c) {
        INFO("layer " << l << " head " << h << " channel " << c);
        CHECK(std::fabs(mine[c] - ref[c]) <= 2e-5);  // torch's SVD in f32, akv's in f64
      }
    }
  }
  const test::TempDir tmp;
  std::ofstream(tmp.file("calib.json")) << calib.dump();
  check_golden("qfilter-official.json", [&](EvictionParams& p) { p.score.qfilters = tmp.file("calib.json"); });
}

TEST_CASE("KVzap: calibrate's surrogate equals kvpress's train_linear, and kvzap keeps what KVzapPress keeps "
          "(two stories260K dumps, 50%)",
          "[golden][alloc]") {
  // scripts/dev/golden/kvzap.py KVPRESS data/golden/kvzap-official.json
  //   data/golden/kvzap-stories-1.h5 data/golden/kvzap-stories-2.h5
  // (the surrogate fitted on both dumps' tokens after their first 4; the press run on the second dump)
  std::ifstream in(kGolden + "kvzap-official.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  std::vector<std::string> dumps;
  for (const auto& d : g["dumps"]) dumps.push_back(kGolden + d.get<std::string>());
  CalibrateOptions o;
  o.kvzap_sinks = g["fit"]["sinks"].get<std::size_t>();
  nlohmann::json calib = calibrate(dumps, o, {});
  REQUIRE(calib["summary"]["kvzap"]["rows"].get<std::size_t>() == g["fit"]["rows"].get<std::size_t>());
  // The fits compared by their predictions on the last dump's attention inputs: scikit-learn solves in
  // f32 (train.py passes f32 tensors), akv in f64.
  const DumpReader last(dumps.back());
  const nlohmann::json& weight = g["fit"]["weight"];
  REQUIRE(weight.size() == calib["layers"].size());
  double worst = 0;
  for (std::size_t l = 0; l < weight.size(); ++l) {
    KvzapLayer mine, ref;
    for (std::size_t h = 0; h < weight[l].size(); ++h) {
      mine.weight.push_back(calib["layers"][l]["heads"][h]["kvzap"]["weight"].get<std::vector<double>>());
      mine.bias.push_back(calib["layers"][l]["heads"][h]["kvzap"]["bias"].get<double>());
      ref.weight.push_back(weight[l][h].get<std::vector<double>>());
      ref.bias.push_back(g["fit"]["bias"][l][h].get<double>());
    }
    std::vector<std::vector<double>> a, b;
    const RowMatrix x = last.read_matrix(l, DumpMatrix::attn_input);
    kvzap_layer_scores(mine, x, a);
    kvzap_layer_scores(ref, x, b);
    for (std::size_t h = 0; h < a.size(); ++h) {
      for (std::size_t t = 0; t < a[h].size(); ++t) worst = std::max(worst, std::fabs(a[h][t] - b[h][t]));
    }
    // The press's own scores (torch's f32 Linear) from those weights.
    const nlohmann::json& press = g["methods"]["kvzap"]["layers"][l];
    for (std::size_t h = 0; h < b.size(); ++h) {
      const auto scores = press[h]["scores"].get<std::vector<double>>();
      for (std::size_t t = 0; t < scores.size(); ++t) {
        INFO("layer " << l << " head " << h << " token " << t);
        CHECK(std::fabs(b[h][t] - scores[t]) <= 1e-5 * std::fabs(scores[t]));
      }
    }
    // The kept sets with the reference's weights: the same scores up to f32 rounding.
    for (std::size_t h = 0; h < weight[l].size(); ++h) {
      calib["layers"][l]["heads"][h]["kvzap"]["weight"] = weight[l][h];
      calib["layers"][l]["heads"][h]["kvzap"]["bias"] = g["fit"]["bias"][l][h];
    }
  }
  INFO("largest |prediction difference| " << worst);
  CHECK(worst <= 1e-5);  // measured 4.7e-7 (2026-12-04)
  const test::TempDir tmp;
  std::ofstream(tmp.file("calib.json")) << calib.dump();
  check_golden("kvzap-official.json", [&](EvictionParams& p) { p.score.surrogate = tmp.file("calib.json"); });
}

namespace {

// One run of kvzap-dms-official.json (kept positions per head) against akv's (`mine` [layer][head]).
void check_kept(const nlohmann::json& want, const std::vector<std::vector<std::vector<std::int32_t>>>& mine,
                const std::string& what) {
  REQUIRE(want.size() == mine.size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    for (std::size_t h = 0; h < want[l].size(); ++h) {
      INFO(what << " layer " << l << " head " << h);
      const auto kept = want[l][h]["kept"].get<std::vector<std::int32_t>>();
      const auto tied = want[l][h]["tied"].get<std::set<std::int32_t>>();
      std::vector<std::int32_t> differ;
      std::set_symmetric_difference(mine[l][h].begin(), mine[l][h].end(), kept.begin(), kept.end(),
                                    std::back_inserter(differ));
      CHECK(differ.size() <= tied.size());
      for (std::int32_t t : differ) {
        INFO("position " << t << " kept by one side only");
        CHECK(tied.count(t) == 1);
      }
    }
  }
}

}  // namespace

TEST_CASE("Threshold eviction keeps what kvpress's DMSPress(KVzapPress) keeps, in the prompt and while decoding",
          "[golden][alloc]") {
  // scripts/dev/golden/kvzap_dms.py KVPRESS data/golden/kvzap-dms-official.json
  //   data/golden/kvzap-stories-2.h5 data/golden/kvzap-official.json (threshold -5.2, window 16)
  std::ifstream in(kGolden + "kvzap-dms-official.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  std::ifstream fit_in(kGolden + g["fit"].get<std::string>());
  const nlohmann::json fit = nlohmann::json::parse(fit_in)["fit"];
  const std::string dump_path = kGolden + g["dump"].get<std::string>();
  // A calibration file holding the reference's surrogate.
  nlohmann::json calib = calibrate({dump_path}, CalibrateOptions{}, {});
  for (std::size_t l = 0; l < calib["layers"].size(); ++l) {
    for (std::size_t h = 0; h < calib["layers"][l]["heads"].size(); ++h) {
      calib["layers"][l]["heads"][h]["kvzap"]["weight"] = fit["weight"][l][h];
      calib["layers"][l]["heads"][h]["kvzap"]["bias"] = fit["bias"][l][h];
    }
  }
  const test::TempDir tmp;
  std::ofstream(tmp.file("calib.json")) << calib.dump();
  const std::string spec = "kvzap:surrogate=" + tmp.file("calib.json") + ":threshold=" +
                           format_number(g["threshold"].get<double>()) + ":window=" +
                           std::to_string(g["window"].get<int>()) + ":sinks=" + std::to_string(g["sinks"].get<int>());
  const DumpReader dump(dump_path);
  const DumpMeta& m = dump.meta();
  const std::size_t L = m.n_layers, H = m.n_kv_heads, d = m.head_dim, T = m.n_tokens;

  SECTION("prompt only: akv compress's plan") {
    const CompressParams p = resolve_params(parse_method_spec(spec));
    const EvictionPlan plan = plan_eviction(dump, *p.eviction(), 1, {});
    std::vector<std::vector<std::vector<std::int32_t>>> mine(L);
    for (std::size_t l = 0; l < L; ++l) {
      for (std::size_t h = 0; h < H; ++h) mine[l].push_back(plan.heads[l][h].kept);
    }
    check_kept(g["runs"]["prefill"]["layers"], mine, "prefill");
  }

  SECTION("decoding=on: the runtime cache fed the first tokens as the prompt, then one token a step") {
    const nlohmann::json& run = g["runs"]["decoding"];
    const std::size_t P = run["prompt"].get<std::size_t>();
    KvGeometry geo{m.kv_shape(), T, dump.input_dim()};
    const auto cache = make_kv_policy(resolve_params(parse_method_spec(spec + ":decoding=on")), geo, 1);
    REQUIRE(cache->wants_inputs());
    REQUIRE_FALSE(cache->layer_local());
    std::vector<Tensor3> key(L), key_pre(L), value(L), query(L);
    std::vector<RowMatrix> input(L);
    TokenScores scores(L);
    const KvzapModel zap = read_calibration_kvzap(tmp.file("calib.json"), m, dump.input_dim());
    for (std::size_t l = 0; l < L; ++l) {
      key[l] = dump.read(l, DumpField::key);
      key_pre[l] = dump.read(l, DumpField::key_pre_rope);
      value[l] = dump.read(l, DumpField::value);
      query[l] = Tensor3(m.n_heads, P, d);  // kvzap reads no queries
      input[l] = dump.read_matrix(l, DumpMatrix::attn_input);
      const RowMatrix prompt_input = input[l].topRows(static_cast<Eigen::Index>(P));
      kvzap_layer_scores(zap[l], prompt_input, scores[l]);
    }
    std::vector<Tensor3> pk(L), pkp(L), pv(L);
    for (std::size_t l = 0; l < L; ++l) {
      pk[l] = key[l].rows(0, P);
      pkp[l] = key_pre[l].rows(0, P);
      pv[l] = value[l].rows(0, P);
    }
    cache->ingest_prompt({&query, &pk, &pkp, &pv, P, &scores});
    auto kept = [&] {
      std::vector<std::vector<std::vector<std::int32_t>>> out(L);
      for (std::size_t l = 0; l < L; ++l) {
        for (std::size_t h = 0; h < H; ++h) {
          const KvView v = cache->view(l, h);
          out[l].emplace_back(v.position, v.position + v.n);
        }
      }
      return out;
    };
    check_kept(run["after_prompt"], kept(), "after the prompt");
    std::vector<float> k(H * d), kp(H * d), v(H * d);
    for (std::size_t t = P; t < T; ++t) {
      for (std::size_t l = 0; l < L; ++l) {
        for (std::size_t h = 0; h < H; ++h) {
          std::copy_n(key[l].row(h, t), d, k.data() + h * d);
          std::copy_n(key_pre[l].row(h, t), d, kp.data() + h * d);
          std::copy_n(value[l].row(h, t), d, v.data() + h * d);
        }
        cache->take_input(l, t, input[l].row(static_cast<Eigen::Index>(t)).data(), dump.input_dim());
        cache->append(l, k.data(), kp.data(), v.data(), t);
      }
      cache->end_step();
    }
    check_kept(run["layers"], kept(), "after decoding");
  }
}

TEST_CASE("H2O and StreamingLLM keep what their official code keeps (MHA, every prompt query, 25%)",
          "[golden][alloc]") {
  // scripts/dev/golden/official.py data/golden/mha-dump.h5 data/golden/mha-official.json --budget 0.25
  //   --h2o H2O_CHECKOUT --streaming-llm STREAMING_LLM_CHECKOUT
  check_golden("mha-official.json");
}

TEST_CASE("KVzip: scores and kept tokens equal kvpress's KVzipPress on stories260K (chunks of 96, 25%)",
          "[golden][alloc]") {
  // scripts/dev/golden/kvpress_kvzip.py KVPRESS stories260K.bin stories260K-samples.txt
  // data/golden/kvzip-official.json: KVzipPress unmodified on a torch transcription of the model
  // (200 context tokens, 3 chunks, compression ratio 0.75, global over layers and heads).
  check_kvzip_golden("kvzip-official.json");
}

TEST_CASE("KVzip+: scores and kept tokens equal kvpress's KVzipPress with kvzip_plus_normalization (stories260K)",
          "[golden][alloc]") {
  // scripts/dev/golden/kvpress_kvzip.py KVPRESS stories260K.bin stories260K-samples.txt
  // data/golden/kvzip-plus-official.json --plus: each repeat query's attention divided by the norm
  // of its attention input, each key's multiplied by |W_o v|_2 of the query head.
  check_kvzip_golden("kvzip-plus-official.json");
}

namespace {

std::uint64_t hex_bits(const std::string& h) { return std::stoull(h, nullptr, 16); }

double hex_f64(const std::string& h) {
  const std::uint64_t b = hex_bits(h);
  double d = 0;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

float hex_f32(const std::string& h) {
  const auto b = static_cast<std::uint32_t>(hex_bits(h));
  float f = 0;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// KVQuant's layout of one layer's tensor [heads, n, d]: rows [n, heads x d], the heads side by side.
std::vector<float> kvquant_rows(const Tensor3& t) {
  const std::size_t n = t.dim1(), d = t.dim2(), H = t.dim0(), C = H * d;
  std::vector<float> rows(n * C);
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t i = 0; i < n; ++i) std::copy(t.row(h, i), t.row(h, i) + d, rows.data() + i * C + h * d);
  }
  return rows;
}

// The values a nuq fit sees (and their weights, when `w` is given), as calibrate_nuq selects
// them from rows [n, C]: normalized by the keys' per-channel thresholds of `cal` or by each row's
// own percentiles, outliers and the first `sink` rows left out.
void nuq_fit_values(const std::vector<float>& rows, std::size_t n, std::size_t C, bool key, const NuqCalibration& cal,
                    double sparsity, std::size_t sink, const std::vector<float>* w, std::vector<double>& values,
                    std::vector<double>& weights) {
  for (std::size_t i = sink; i < n; ++i) {
    for (std::size_t j = 0; j < C; ++j) {
      double up = 0, lo = 0;
      if (key) {
        up = cal.upper[j];
        lo = cal.lower[j];
      } else {
        std::vector<double> r(rows.begin() + static_cast<std::ptrdiff_t>(i * C), rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * C));
        std::sort(r.begin(), r.end());
        up = percentile_sorted(r.data(), C, (1.0 - (1.0 - sparsity) / 2.0) * 100.0);
        lo = percentile_sorted(r.data(), C, (1.0 - (1.0 - (1.0 - sparsity) / 2.0)) * 100.0);
      }
      const double y = (rows[i * C + j] - (up + lo) / 2.0) / ((up - lo) / 2.0);
      if (y >= -1.0 && y <= 1.0) {
        values.push_back(static_cast<float>(y));
        if (w) weights.push_back((*w)[i * C + j]);
      }
    }
  }
}

}  // namespace

TEST_CASE("KVQuant nuq: thresholds, k-means and reconstruction against KVQuant's simquant module", "[golden][nuq]") {
  // scripts/dev/golden/kvquant_nuq.py SIMQUANT_PY data/fixtures/dump.h5 data/golden/kvquant-nuq.json
  // --commit 57a2383: SimQuant.quantize and QuantLinearSim.forward unmodified (sparsity threshold
  // 0.99, first_few_fp16 1), keys pre-RoPE per channel, values per token, heads side by side;
  // values also per KV head (the layout of akv's nuq caches).
  std::ifstream in(kGolden + "kvquant-nuq.json");
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const DumpReader dump(std::string(AKV_SOURCE_DIR) + "/" + g["dump"].get<std::string>());
  const double sparsity = g["sparsity_threshold"].get<double>();
  const auto sink = g["first_few_fp16"].get<std::size_t>();
  for (const nlohmann::json& c : g["cases"]) {
    const bool key = c["tensor"] == "key";
    const auto layer = c["layer"].get<std::size_t>();
    const int bits = c["bits"].get<int>();
    CAPTURE(layer, key, bits);
    const Tensor3 t = dump.read(layer, key ? DumpField::key_pre_rope : DumpField::value);
    const std::size_t n = t.dim1(), d = t.dim2(), H = t.dim0(), C = H * d;
    REQUIRE(C == c["channels"].get<std::size_t>());
    const std::vector<float> rows = kvquant_rows(t);
    const NuqCalibration mine = calibrate_nuq(rows.data(), n, C, bits, key, sparsity, sink);
    // Thresholds: numpy's percentiles, bit for bit.
    if (key) {
      for (std::size_t j = 0; j < C; ++j) {
        CHECK(mine.upper[j] == hex_f64(c["upper"][j].get<std::string>()));
        CHECK(mine.lower[j] == hex_f64(c["lower"][j].get<std::string>()));
      }
    }
    // Levels: KVQuant fits scikit-learn's KMeans (k-means++ seeds, random_state 0, 50 rounds);
    // akv's Lloyd rounds from quantile seeds must fit the same values at least as well (within
    // 0.1% of its cost).
    std::vector<double> theirs;
    for (const auto& h : c["levels"]) theirs.push_back(hex_f32(h.get<std::string>()));
    std::vector<double> mine_levels(mine.levels.begin(), mine.levels.end());
    NuqCalibration cal = mine;
    cal.levels.clear();
    for (const double v : theirs) cal.levels.push_back(static_cast<float>(v));
    std::sort(cal.levels.begin(), cal.levels.end());
    const double their_cost = c["kmeans_cost"].get<double>();
    std::vector<double> values, unused;
    nuq_fit_values(rows, n, C, key, mine, sparsity, sink, nullptr, values, unused);
    CHECK(values.size() == c["kmeans_values"].get<std::size_t>());
    CHECK(kmeans_1d_cost(values, {}, theirs) == Approx(their_cost).epsilon(1e-6));
    CHECK(kmeans_1d_cost(values, {}, mine_levels) <= their_cost * 1.001);
    // Reconstruction with KVQuant's own thresholds and levels: f16 bits equal, every element.
    std::vector<float> out(n * C);
    nuq_quantize(cal, rows.data(), n, C, sparsity, sink, out.data());
    const std::string want = c["reconstruction"].get<std::string>();
    REQUIRE(want.size() == 4 * n * C);
    std::size_t differ = 0;
    for (std::size_t e = 0; e < n * C; ++e) {
      differ += f32_to_f16_ref(out[e]) != static_cast<std::uint16_t>(hex_bits(want.substr(4 * e, 4))) ? 1 : 0;
    }
    CHECK(differ == 0);
    // One KV head at a time, as akv's caches store them (nuq_encode / nuq_decode under a head's
    // table): keys equal the layer's reconstruction in the head's channels; values equal KVQuant's
    // module run on the head's own rows.
    const std::string per_head = key ? want : c["per_head_reconstruction"].get<std::string>();
    REQUIRE(per_head.size() == 4 * n * C);
    std::size_t head_differ = 0;
    for (std::size_t h = 0; h < H; ++h) {
      const NuqTable table = nuq_table(cal, sparsity, sink, key ? h * d : 0, key ? d : 0);
      NuqRows stored;
      nuq_encode(table, t.row(h, 0), n, d, stored);
      std::vector<float> head(n * d);
      nuq_decode(stored.view(table), d, 0, n, head.data());
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < d; ++j) {
          const std::size_t e = key ? i * C + h * d + j : (h * n + i) * d + j;
          head_differ += f32_to_f16_ref(head[i * d + j]) != static_cast<std::uint16_t>(hex_bits(per_head.substr(4 * e, 4))) ? 1 : 0;
        }
      }
    }
    CHECK(head_differ == 0);
  }
  // Sensitivity-weighted fits (KVQuant's Fisher weights; here 1 + x^2 of each element, in f32):
  // akv's levels fit the weighted values at least as well as KVQuant's (within 0.1%).
  for (const nlohmann::json& c : g["weighted"]) {
    const bool key = c["tensor"] == "key";
    const auto layer = c["layer"].get<std::size_t>();
    const int bits = c["bits"].get<int>();
    CAPTURE(layer, key, bits);
    const Tensor3 t = dump.read(layer, key ? DumpField::key_pre_rope : DumpField::value);
    const std::size_t n = t.dim1(), C = t.dim0() * t.dim2();
    const std::vector<float> rows = kvquant_rows(t);
    std::vector<float> w(n * C);
    for (std::size_t e = 0; e < n * C; ++e) w[e] = 1.0f + rows[e] * rows[e];
    const NuqCalibration mine = calibrate_nuq(rows.data(), n, C, bits, key, sparsity, sink, w.data());
    std::vector<double> values, weights;
    nuq_fit_values(rows, n, C, key, mine, sparsity, sink, &w, values, weights);
    CHECK(values.size() == c["kmeans_values"].get<std::size_t>());
    std::vector<double> theirs;
    for (const auto& h : c["levels"]) theirs.push_back(hex_f32(h.get<std::string>()));
    const double their_cost = c["kmeans_cost"].get<double>();
    CHECK(kmeans_1d_cost(values, weights, theirs) == Approx(their_cost).epsilon(1e-6));
    const std::vector<double> mine_levels(mine.levels.begin(), mine.levels.end());
    CHECK(kmeans_1d_cost(values, weights, mine_levels) <= their_cost * 1.001);
    // Unweighted levels fit the weighted values worse than the weighted ones.
    const NuqCalibration plain = calibrate_nuq(rows.data(), n, C, bits, key, sparsity, sink);
    CHECK(kmeans_1d_cost(values, weights, std::vector<double>(plain.levels.begin(), plain.levels.end())) >
          kmeans_1d_cost(values, weights, mine_levels));
  }
}
