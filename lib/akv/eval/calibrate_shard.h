#pragma once
// Sharded `akv calibrate` (docs/scale.md): each shard measures a range of layers and writes a part;
// `akv merge` assembles the parts into the unsharded calib.json.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/eval/calibrate.h"
#include "akv/eval/parts.h"

namespace akv {

// Sharded calibration (docs/scale.md): shard K of N measures layers [(K-1) L / N, K L / N) of
// every dump and returns a partial file (format akv-calibration-part v1: the options, the dumps'
// paths and hashes, every head's raw measurements); merge_calibration_parts checks that the parts
// are shards 1..N of one run (InvalidInput naming the file and field otherwise), re-reads the
// dumps' shapes, and runs the allocation: the unsharded calib.json, byte for byte.
nlohmann::json calibrate_part(const std::vector<std::string>& dumps, const CalibrateOptions& o, const Shard& shard,
                              const ProgressFn& progress);
nlohmann::json merge_calibration_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
