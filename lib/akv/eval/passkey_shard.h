#pragma once
// Sharded `akv evaluate --model --task passkey` (docs/scale.md): shard K of N evaluates a
// contiguous range of the (depth, length, trial) prompts and writes a partial report (format
// akv-passkey-part) with each prompt's outcome per method; `akv merge` checks that the parts are
// shards 1..N of one run and rebuilds the report the unsharded run writes, byte for byte.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/passkey.h"
#include "akv/eval/ppl_shard.h"

namespace akv {

// The partial report of the shard that made `r` (its prompts start at r.first_prompt).
nlohmann::json passkey_part_json(const PasskeyReport& r, const Shard& s, const PplRun& run);

// InvalidInput (exit 2) naming the file and field: another format, parts of different runs, a
// shard missing or given twice, prompts that do not line up.
PasskeyReport merge_passkey_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
