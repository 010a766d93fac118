#pragma once
// `akv evaluate --task ruler`: RULER's synthetic tasks (eval/ruler_tasks.h) through cache
// methods. Each sample's prompt is prefilled once, ingested by every method's cache, and its
// answer decoded greedily through each cache (the lane engine, eval/lanes.h); the score of a
// sample is RULER's string_match_all (the fraction of the reference answers found in the decoded
// answer, case-insensitive), reported in percent as RULER does (docs/ruler.md).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/core/shard.h"
#include "akv/eval/batch.h"
#include "akv/eval/perplexity.h"
#include "akv/eval/ruler_tasks.h"

namespace akv {

// A method of a ratio sweep: its spec, the spec it was expanded from, and the compression ratio
// (nullopt: a method without one, such as a quantizer, or a budget given in the spec).
struct RatioSpec {
  std::string spec, base;
  std::optional<double> ratio;
};

struct RulerOptions {
  std::vector<std::string> tasks;           // empty: all of ruler_tasks()
  std::vector<std::size_t> lengths = {4096};  // prompt tokens (at most)
  // Needle depths in [0, 1] (needle tasks only; make_ruler_sample): the grid becomes (task,
  // length, depth, sample), a needle-in-a-haystack heatmap per task. Empty: needles at random.
  std::vector<double> depths;
  std::size_t samples = 10;                 // per (task, length), per depth when depths are given
  std::uint64_t seed = 1;
  std::size_t answer_tokens = 0;            // greedy tokens per answer; 0: the task's (RULER's)
  AnswerPrefix prefix = AnswerPrefix::ruler;
  // false (kvpress's default): each cache ingests the context alone and the question is decoded
  // through the compressed cache; true: the whole prompt, question included, is ingested.
  bool query_aware = false;
  // The methods of a --ratios sweep (expand_ratios), found by spec: a method among them has their
  // base and ratio; any other is its own base, without a ratio.
  std::vector<RatioSpec> ratio_specs;
  Shard shard;  // evaluate samples [shard.range(total)) of the (task, length, sample) grid
  int threads = 1;
  std::size_t batch = kBatchAuto;  // prompts decoded together: see PplOptions::batch
  AttentionMode attention = AttentionMode::exact;
  PrefillMode prefill_mode = PrefillMode::exact;  // see PplOptions::prefill_mode
};

struct RulerReport {
  std::vector<std::string> specs, descriptions;  // methods, the full cache first
  std::vector<std::string> bases;                // [method]: the spec a --ratios sweep expanded
  std::vector<std::optional<double>> ratios;     // [method]: its compression ratio, if any
  std::vector<std::string> tasks;
  std::vector<std::size_t> lengths;
  std::vector<double> depths;                    // empty: needles at random depths
  std::size_t samples = 0;                       // per (task, length[, depth])
  std::string prefix;                            // answer prefix: ruler | restate
  bool query_aware = false;
  // score[i][method] in [0, 1] of samples first_sample + i of total_samples, in grid order (task,
  // length, [depth,] sample); all of them except in a shard's report.
  std::size_t first_sample = 0, total_samples = 0;
  std::vector<std::vector<double>> score;
  std::vector<std::size_t> prompt_tokens;        // [i]: the prompt's length
  std::vector<std::vector<std::uint64_t>> kv_bytes;  // [i][method]: the cache's bytes after the answer
  // [i][method]: the most KV bytes resident at once (Continuations::peak_bytes).
  std::vector<std::vector<std::uint64_t>> peak_kv_bytes;
  // Mean score in percent of (method, task, length), and of (method) over every task and length
  // (of a whole report).
  double cell(std::size_t method, std::size_t task, std::size_t length) const;
  double average(std::size_t method) const;
  // Samples of one (task, length): samples x depths (at least one depth).
  std::size_t cell_samples() const { return samples * std::max<std::size_t>(depths.size(), 1); }
  // Mean score in percent of (method, task, depth, length) (with depths).
  double depth_cell(std::size_t method, std::size_t task, std::size_t depth, std::size_t length) const;
  // Mean cache bytes after the answer, of (method, task, length) and of (method).
  double cell_bytes(std::size_t method, std::size_t task, std::size_t length) const;
  double mean_bytes(std::size_t method) const;
  double mean_peak_bytes(std::size_t method) const;  // mean of peak_kv_bytes
  nlohmann::json to_json() const;
  // With ratios: the average of each base (rows) at each ratio (columns); empty otherwise.
  std::string leaderboard() const;
  std::string to_table() const;
  std::string to_csv() const;
};

RulerReport evaluate_ruler(const Model& model, const Tokenizer& tok, const std::vector<PplMethod>& methods,
                           const RulerOptions& o, const ProgressFn& progress);

}  // namespace akv
