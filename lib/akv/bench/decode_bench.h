#pragma once
// `akv bench decode`: prefill and decode throughput of the model with each cache method, next
// to the full f32 cache measured in the same run (decode cost ratio per token).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/perplexity.h"

namespace akv {

struct DecodeBenchRow {
  std::string spec, description;
  double decode_tokens_per_s = 0, ratio_to_full = 0;  // ratio = time per token / full's
  std::uint64_t bytes = 0;
};

struct DecodeBenchResult {
  std::size_t prompt = 0, decoded = 0, sequences = 0;
  int repeats = 1;
  double prefill_tokens_per_s = 0;
  std::vector<DecodeBenchRow> rows;
  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Decodes `sequences` token sequences (prompt = first `prompt` tokens, then teacher-forced
// tokens up to the end) once per method per repeat, methods interleaved; best of `repeats`.
DecodeBenchResult bench_decode(const Model& model,
                               const std::vector<std::vector<std::int32_t>>& sequences,
                               const std::vector<PplMethod>& methods, std::size_t prompt,
                               int repeats);

}  // namespace akv
