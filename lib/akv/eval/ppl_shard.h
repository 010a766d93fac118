#pragma once
// Sharded `akv evaluate --model` (docs/scale.md): shard K of N evaluates a contiguous range of the
// sequences and writes a partial report (format akv-perplexity-part) holding every sequence's raw
// sums; `akv merge` checks that the parts are shards 1..N of one run (same inputs and
// parameters, each once) and rebuilds the report the unsharded run writes, byte for byte (the
// totals are the same per-sequence sums added in the same order).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/perplexity.h"
#include "akv/eval/parts.h"

namespace akv {

// What a partial report must agree on with its siblings: the inputs (paths and content hashes)
// and every parameter that changes the numbers.
struct PplRun {
  nlohmann::json inputs;  // {"model": {path, hash}, "tokens": {path, hash} or "text": {path, hash, ctx}}
  nlohmann::json params;  // {"methods": [...], "prefill": ..., "sequences": ..., "weights": ...}
};

// The partial report of shard `s` whose sequences start at `first` of `total`.
nlohmann::json ppl_part_json(const PplReport& r, const Shard& s, std::size_t first, std::size_t total, const PplRun& run);

// Rebuilds the whole report from parts (each with the file it came from, for messages).
// InvalidInput (exit 2) naming the file and field: another format, parts of different runs,
// a shard missing, given twice, or sequences that do not line up.
PplReport merge_ppl_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
