#pragma once
// Merging the parts of a sharded `akv bench` suite (docs/scale.md). Timings of different shards
// come from different processes (maybe different machines), so the merged report is not the
// unsharded run's bytes: its rows are, in the unsharded order, with the same parameters; each
// row keeps its shard ("shard") and every ratio in it was taken against a baseline measured in
// that shard's run.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/bench/report.h"

namespace akv {

// Parts (format akv-bench-part, each with the file it came from) -> the suite's report (format
// akv-bench): rows of shards 1..N in order; "shards" lists each shard's commit, CPU, threads and
// its own extras (stream-read and FMA baselines); the table notes are each shard's, prefixed. The
// attention suite's scaling fit is made again over all rows. InvalidInput (exit 2) naming the
// file and field: another format, suites or parameters that differ, a shard missing or twice.
BenchReport merge_bench_parts(const std::vector<std::pair<std::string, nlohmann::ordered_json>>& parts);

// The table columns of a suite (attention, quant, policy); InvalidInput for another.
std::vector<BenchColumn> bench_columns(const std::string& suite);

}  // namespace akv
