#pragma once
// `akv evaluate --task ruler`: RULER's synthetic tasks (eval/ruler_tasks.h) through cache
// methods. Each sample's prompt is prefilled once, ingested by every method's cache, and its
// answer decoded greedily through each cache (the lane engine, eval/lanes.h); the score of a
// sample is RULER's string_match_all (the fraction of the reference answers found in the decoded
// answer, case-insensitive), reported in percent as RULER does (docs/ruler.md).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/eval/batch.h"
#include "akv/eval/perplexity.h"
#include "akv/eval/ruler_tasks.h"

namespace akv {

struct RulerOptions {
  std::vector<std::string> tasks;           // empty: all of ruler_tasks()
  std::vector<std::size_t> lengths = {4096};  // prompt tokens (at most)
  std::size_t samples = 10;                 // per (task, length)
  std::uint64_t seed = 1;
  std::size_t answer_tokens = 0;            // greedy tokens per answer; 0: the task's (RULER's)
  AnswerPrefix prefix = AnswerPrefix::ruler;
  int threads = 1;
  std::size_t batch = kBatchAuto;  // prompts decoded together: see PplOptions::batch
  AttentionMode attention = AttentionMode::exact;
};

struct RulerReport {
  std::vector<std::string> specs, descriptions;  // methods, the full cache first
  std::vector<std::string> tasks;
  std::vector<std::size_t> lengths;
  std::size_t samples = 0;
  std::string prefix;                            // answer prefix: ruler | restate
  // score[sample][method] in [0, 1], samples in grid order (task, length, sample).
  std::vector<std::vector<double>> score;
  std::vector<std::size_t> prompt_tokens;        // [sample]: the prompt's length
  // Mean score in percent of (method, task, length), and of (method) over every task and length.
  double cell(std::size_t method, std::size_t task, std::size_t length) const;
  double average(std::size_t method) const;
  nlohmann::json to_json() const;
  std::string to_table() const;
  std::string to_csv() const;
};

RulerReport evaluate_ruler(const Model& model, const Tokenizer& tok, const std::vector<PplMethod>& methods,
                           const RulerOptions& o, const ProgressFn& progress);

}  // namespace akv
