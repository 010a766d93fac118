// RULER runs through a model (stories260K with the byte tokenizer: the answers mean nothing, the
// plumbing is what is checked): a question decoded after the prompt continues as the whole
// prompt does, reports are deterministic for any thread count and batch, and --ratios expands
// eviction specs into budgets.
#include <catch2/catch.hpp>

#include "akv/core/errors.h"
#include "akv/eval/lanes.h"
#include "akv/eval/model_parts.h"
#include "akv/eval/model_run.h"
#include "akv/eval/ruler.h"
#include "akv/method/params.h"
#include "akv/model/llama2c.h"
#include "test_util.h"

using namespace akv;
using akv::test::have_shared;
using akv::test::shared_dir;

TEST_CASE("expand_ratios: eviction specs without a budget, one per ratio", "[eval][ruler]") {
  const auto r = expand_ratios({"snapkv", "kivi-2", "h2o:budget=0.3", "adakv:quant=k4v2", "full"}, {0.25, 0.875});
  std::vector<std::string> specs;
  for (const RatioSpec& s : r) specs.push_back(s.spec);
  CHECK(specs == std::vector<std::string>{"snapkv:budget=0.75", "snapkv:budget=0.125", "kivi-2", "h2o:budget=0.3",
                                          "adakv:quant=k4v2:budget=0.75", "adakv:quant=k4v2:budget=0.125", "full"});
  CHECK(r[1].base == "snapkv");
  CHECK(r[1].ratio == 0.875);
  CHECK(!r[2].ratio);
  CHECK(!r[3].ratio);
  CHECK(r[3].base == "h2o:budget=0.3");
  CHECK(expand_ratios({"snapkv"}, {}).at(0).spec == "snapkv");
  const auto t = expand_ratios({"knorm:threshold=-3"}, {0.5});  // a threshold is not swept
  REQUIRE(t.size() == 1);
  CHECK(t[0].spec == "knorm:threshold=-3");
  CHECK(!t[0].ratio);
  CHECK_THROWS_WITH(expand_ratios({"snapkv"}, {1.0}), Catch::Contains("--ratios"));
  CHECK_THROWS_AS(expand_ratios({"snapkv"}, {-0.1}), InvalidInput);
}

TEST_CASE("continue_lanes: a question decoded through the full cache continues as the whole prompt", "[eval][ruler]") {
  if (!have_shared()) return;
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  std::vector<std::int32_t> prompt{1};
  for (int i = 0; i < 90; ++i) prompt.push_back(3 + (i * 37) % 500);
  const std::vector<std::int32_t> context(prompt.begin(), prompt.begin() + 70), question(prompt.begin() + 70, prompt.end());
  const std::vector<std::optional<CompressParams>> full{std::nullopt};
  const Continuations whole = continue_lanes(m, {prompt}, {8}, full, 2, AttentionMode::exact, nullptr);
  const std::vector<std::vector<std::int32_t>> questions{question};
  const Continuations split = continue_lanes(m, {context}, {8}, full, 2, AttentionMode::exact, nullptr, &questions);
  CHECK(split.tokens == whole.tokens);
  // Both are the argmax of one prefill over the prompt and its continuation.
  std::vector<std::int32_t> ext = prompt;
  ext.insert(ext.end(), whole.tokens[0].begin(), whole.tokens[0].end() - 1);
  const PrefillResult r = m.prefill(ext, true);
  for (std::size_t i = 0; i < whole.tokens[0].size(); ++i) {
    Eigen::Index best;
    r.logits.row(static_cast<Eigen::Index>(prompt.size() - 1 + i)).maxCoeff(&best);
    CHECK(best == whole.tokens[0][i]);
  }
}

TEST_CASE("evaluate_ruler: deterministic report of the requested shape, ratios labelled", "[eval][ruler]") {
  if (!have_shared()) return;
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const Tokenizer tok = Tokenizer::bytes();
  RulerOptions o;
  o.tasks = {"niah_single_1", "niah_multikey_2", "vt"};
  o.lengths = {420, 500};
  o.samples = 2;
  o.answer_tokens = 6;
  o.threads = 2;
  o.ratio_specs = expand_ratios({"streamingllm", "kivi-2"}, {0.5});
  std::vector<PplMethod> methods;
  for (const RatioSpec& s : o.ratio_specs) methods.push_back({s.spec, resolve_method_spec(s.spec)});
  const RulerReport a = evaluate_ruler(m, tok, methods, o, {});
  o.threads = 1;
  o.batch = 1;
  CHECK(evaluate_ruler(m, tok, methods, o, {}).to_json() == a.to_json());
  REQUIRE(a.specs == std::vector<std::string>{"full", "streamingllm:budget=0.5", "kivi-2"});
  CHECK(a.bases == std::vector<std::string>{"full", "streamingllm", "kivi-2"});
  CHECK(a.ratios[1] == 0.5);
  CHECK(!a.ratios[2]);
  CHECK(a.score.size() == 3 * 2 * 2);
  for (std::size_t n : a.prompt_tokens) CHECK((n <= 500 && n > 300));
  // Cache bytes after the answer: the full cache holds every position in f32 (K and V: 8 bytes
  // per element), the prompt's and the answer's decode steps (the last token is never appended).
  REQUIRE(a.kv_bytes.size() == a.score.size());
  const ModelConfig& c = m.config();
  for (std::size_t i = 0; i < a.kv_bytes.size(); ++i) {
    CHECK(a.kv_bytes[i][0] == c.n_layers * c.n_kv_heads * c.head_dim * 8 * (a.prompt_tokens[i] + o.answer_tokens - 1));
    CHECK(a.kv_bytes[i][1] < a.kv_bytes[i][0]);
    CHECK(a.kv_bytes[i][2] < a.kv_bytes[i][0]);
  }
  const nlohmann::json j = a.to_json();
  CHECK(j["format"] == "akv-ruler");
  CHECK(j["methods"][1]["ratio"] == 0.5);
  CHECK(j["methods"][2]["ratio"].is_null());
  CHECK(j["methods"][0]["score"].size() == 3);
  CHECK(j["methods"][0]["score"][0].size() == 2);
  CHECK(a.to_table().find("leaderboard") != std::string::npos);
  CHECK(a.to_csv().find("streamingllm:budget=0.5,streamingllm,0.5,vt,500,2,") != std::string::npos);
  CHECK(j["methods"][0]["mean_kv_bytes"].get<double>() > j["methods"][2]["mean_kv_bytes"].get<double>());
  // Peak resident bytes: the full cache holds its most at the end; streamingllm (exact protocol)
  // holds the context's f32 K/V before it evicts (the question comes after).
  const std::size_t f32_row = c.n_layers * c.n_kv_heads * c.head_dim * 8;
  for (std::size_t i = 0; i < a.kv_bytes.size(); ++i) {
    CHECK(a.peak_kv_bytes[i][0] == a.kv_bytes[i][0]);
    CHECK(a.peak_kv_bytes[i][1] % f32_row == 0);
    CHECK(a.peak_kv_bytes[i][1] < f32_row * a.prompt_tokens[i]);
    CHECK(a.peak_kv_bytes[i][1] > a.kv_bytes[i][1]);
  }
  CHECK(j["methods"][1]["mean_peak_kv_bytes"].get<double>() > j["methods"][1]["mean_kv_bytes"].get<double>());
  // Query-aware is another protocol: the same prompts, the question compressed with the context.
  o.query_aware = true;
  const RulerReport b = evaluate_ruler(m, tok, methods, o, {});
  CHECK(b.prompt_tokens == a.prompt_tokens);
  CHECK(b.to_json()["question"] != j["question"]);
  // llama.cpp's batch protocol: the caches hold the same rows as after the exact prefill; methods
  // say so in their descriptions; eviction methods are refused.
  o.query_aware = false;
  o.prefill_mode = PrefillMode::batch;
  const std::vector<PplMethod> quant = {{"kivi-2", resolve_method_spec("kivi-2")}};
  const RulerReport batch = evaluate_ruler(m, tok, quant, o, {});
  for (std::size_t i = 0; i < batch.kv_bytes.size(); ++i) CHECK(batch.kv_bytes[i][0] == a.kv_bytes[i][0]);
  CHECK(batch.descriptions[1].find("; prompt batch") != std::string::npos);
  CHECK_THROWS_AS(evaluate_ruler(m, tok, methods, o, {}), UsageError);
  // Chunked prefill: SnapKV compresses each chunk of 128 tokens, so less than the prompt (here
  // with its question) is ever resident; streamingllm is refused.
  o.query_aware = true;
  o.prefill_mode = {PrefillMode::chunked, 128};
  const std::vector<PplMethod> snap = {{"snapkv:budget=0.5", resolve_method_spec("snapkv:budget=0.5")}};
  const RulerReport chunked = evaluate_ruler(m, tok, snap, o, {});
  o.prefill_mode = PrefillMode::exact;
  const RulerReport whole = evaluate_ruler(m, tok, snap, o, {});
  o.prefill_mode = {PrefillMode::chunked, 128};
  CHECK(chunked.descriptions[1].find("; prompt chunked:128") != std::string::npos);
  for (std::size_t i = 0; i < chunked.kv_bytes.size(); ++i) {
    CHECK(chunked.peak_kv_bytes[i][1] < whole.peak_kv_bytes[i][1]);
    CHECK(chunked.peak_kv_bytes[i][1] >= chunked.kv_bytes[i][1]);
  }
  CHECK_THROWS_AS(evaluate_ruler(m, tok, methods, o, {}), UsageError);
  o.prefill_mode = PrefillMode::exact;
  o.query_aware = false;
  // A length the model cannot hold is refused before any work.
  o.lengths = {600};
  CHECK_THROWS_WITH(evaluate_ruler(m, tok, methods, o, {}), Catch::Contains("--lengths"));
}

TEST_CASE("evaluate_ruler with needle depths: a heatmap per task, shards merge to it", "[eval][ruler]") {
  if (!have_shared()) return;
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const Tokenizer tok = Tokenizer::bytes();
  RulerOptions o;
  o.tasks = {"niah_single_1", "niah_multikey_2"};
  o.lengths = {420};
  o.depths = {0.0, 1.0};
  o.samples = 2;
  o.answer_tokens = 4;
  o.threads = 2;
  const std::vector<PplMethod> methods = {{"kivi-2", resolve_method_spec("kivi-2")}};
  const RulerReport r = evaluate_ruler(m, tok, methods, o, {});
  REQUIRE(r.score.size() == 2 * 1 * 2 * 2);
  const nlohmann::json j = r.to_json();
  CHECK(j["depths"] == nlohmann::json({0.0, 1.0}));
  const auto& heat = j["methods"][1]["depth_score"];
  REQUIRE(heat.size() == 2);
  REQUIRE(heat[0].size() == 2);
  REQUIRE(heat[0][0].size() == 1);
  // A (task, length) cell is the mean of its depths; samples of one index differ only in depth.
  CHECK(r.cell(1, 1, 0) == Approx((r.depth_cell(1, 1, 0, 0) + r.depth_cell(1, 1, 1, 0)) / 2));
  CHECK(r.prompt_tokens[0] == r.prompt_tokens[2]);
  CHECK(r.to_csv().find("length,depth,samples") != std::string::npos);
  CHECK(r.to_table().find("niah_multikey_2 by needle depth") != std::string::npos);
  // Shards of the (task, length, depth, sample) grid merge to the whole report.
  std::vector<std::pair<std::string, nlohmann::json>> parts;
  for (std::size_t k : {1, 2, 3}) {
    RulerOptions s = o;
    s.shard = {k, 3};
    parts.emplace_back("p" + std::to_string(k), ruler_part_json(evaluate_ruler(m, tok, methods, s, {}), s.shard, {}));
  }
  CHECK(merge_ruler_parts(parts).to_json() == j);
  // Depths are for the needle tasks, in [0, 1].
  o.tasks = {"vt"};
  CHECK_THROWS_WITH(evaluate_ruler(m, tok, methods, o, {}), Catch::Contains("--tasks"));
  o.tasks = {"niah_single_1"};
  o.depths = {1.5};
  CHECK_THROWS_WITH(evaluate_ruler(m, tok, methods, o, {}), Catch::Contains("--depths"));
}
