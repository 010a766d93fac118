#pragma once
// Sharded `akv evaluate --model --task ruler` (docs/scale.md): shard K of N evaluates a
// contiguous range of the (task, length, [depth,] sample) grid and writes a partial report (format
// akv-ruler-part) with each sample's score per method; `akv merge` checks that the parts are
// shards 1..N of one run and rebuilds the report the unsharded run writes, byte for byte.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/ppl_shard.h"
#include "akv/eval/ruler.h"

namespace akv {

// The partial report of the shard that made `r` (its samples start at r.first_sample).
nlohmann::json ruler_part_json(const RulerReport& r, const Shard& s, const PplRun& run);

// InvalidInput (exit 2) naming the file and field: another format, parts of different runs, a
// shard missing or given twice, samples that do not line up, scores outside [0, 1].
RulerReport merge_ruler_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
