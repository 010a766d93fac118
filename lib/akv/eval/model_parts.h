#pragma once
// Sharded `akv evaluate --model` (docs/scale.md): shard K of N evaluates a contiguous range of
// the run's items - perplexity's sequences, passkey's (depth, length, trial) prompts, RULER's
// (task, length, [depth,] sample) grid - and writes a partial report (formats
// akv-perplexity-part, akv-passkey-part, akv-ruler-part) holding each item's raw sums, outcomes
// or scores per method; `akv merge` checks that the parts are shards 1..N of one run (same
// inputs and parameters, each once) and rebuilds the report the unsharded run writes, byte for
// byte (the totals are the same per-item sums added in the same order).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/parts.h"
#include "akv/eval/passkey.h"
#include "akv/eval/perplexity.h"
#include "akv/eval/ruler.h"

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

// The partial report of the passkey shard that made `r` (its prompts start at r.first_prompt),
// and the merge: InvalidInput (exit 2) naming the file and field as above, or prompts that do
// not line up.
nlohmann::json passkey_part_json(const PasskeyReport& r, const Shard& s, const PplRun& run);
PasskeyReport merge_passkey_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

// The partial report of the RULER shard that made `r` (its samples start at r.first_sample),
// and the merge: InvalidInput (exit 2) naming the file and field as above, samples that do not
// line up, or scores outside [0, 1].
nlohmann::json ruler_part_json(const RulerReport& r, const Shard& s, const PplRun& run);
RulerReport merge_ruler_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
