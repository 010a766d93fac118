#pragma once
// `akv bench decode`: prefill and decode throughput of the model with each cache method, next
// to the full f32 cache measured in the same run (decode cost ratio per token).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/shard.h"
#include "akv/eval/perplexity.h"

namespace akv {

struct DecodeBenchRow {
  std::string spec, description;
  double decode_tokens_per_s = 0, ratio_to_full = 0;  // ratio = time per token / full's (same run; NaN without full)
  std::uint64_t bytes = 0;
  std::size_t shard = 0;  // the shard that timed the row (0: unsharded run)
};

struct DecodeBenchResult {
  std::size_t prompt = 0, decoded = 0, sequences = 0;
  int repeats = 1;
  double prefill_tokens_per_s = 0;
  std::vector<DecodeBenchRow> rows;
  // Sharded runs (docs/scale.md): set on a part (format akv-bench-decode-part, with the run's
  // inputs and params) and on a merged report (format akv-bench-decode, "shards" = each shard's
  // prefill figure).
  std::optional<Shard> shard;
  nlohmann::json inputs, params;
  std::vector<double> shard_prefill_tokens_per_s;
  std::size_t batch = 1;  // sequences decoded together (the lane engine, eval/lanes.h)
  int threads = 1;
  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Decodes `sequences` token sequences (prompt = first `prompt` tokens, then teacher-forced
// tokens up to the end) once per method per repeat, methods interleaved; best of `repeats`.
// `batch` sequences decode together (one lane-engine call per step, on `threads` threads).
// With `shard`, times the full cache and methods [shard.range(methods.size())] (the methods
// other than full), rows marked with the shard. `full` false: no full-cache lane (its f32 K/V,
// the largest cache, then does not count in the process's peak memory); the ratios are NaN.
DecodeBenchResult bench_decode(const Model& model,
                               const std::vector<std::vector<std::int32_t>>& sequences,
                               const std::vector<PplMethod>& methods, std::size_t prompt,
                               int repeats, const std::optional<Shard>& shard = std::nullopt,
                               std::size_t batch = 1, int threads = 1, bool full = true);

// Parts -> the report: full then the methods, shards in order, each shard's full row kept (its
// methods' ratios are against it). InvalidInput (exit 2) naming the file and field.
DecodeBenchResult merge_decode_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
