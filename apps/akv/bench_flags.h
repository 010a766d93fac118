#pragma once
// Flags and output every synthetic benchmark suite (akv bench quant|attention|policy) shares.
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "akv/bench/report.h"
#include "akv/core/atomic_file.h"
#include "akv/core/shard.h"
#include "akv/io/json_file.h"
#include "commands.h"

namespace akv::cli {

// Timing and output format.
struct BenchCommon {
  int warmup = 1, repeat = 5;
  bool json = false, csv = false;
  std::string output = "-", shard;
};

inline void add_bench_common(CLI::App* sub, BenchCommon& c) {
  sub->add_option("--warmup", c.warmup, "Untimed runs before timing")->capture_default_str()
      ->check(CLI::Range(0, 1000));
  sub->add_option("--repeat,--repeats", c.repeat, "Timed runs (mean, stdev, min and raw samples reported)")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  auto* j = sub->add_flag("--json", c.json, "Print JSON (every row: parameters, commit, CPU, threads, samples)");
  sub->add_flag("--csv", c.csv, "Print CSV (every field of every row)")->excludes(j);
  sub->add_option("-o,--output", c.output, "Write to this file (atomically) instead of stdout")
      ->capture_default_str();
  sub->add_option("--shard", c.shard,
                  "Run shard K of N (K/N, 1-based) of the suite's cases (see docs/scale.md for what a "
                  "case is per suite); writes a partial report (JSON, format akv-bench-part) that "
                  "`akv merge` combines; every shard measures its own baselines")->check(kShardText);
}

inline std::optional<Shard> bench_shard(const BenchCommon& c) {
  return c.shard.empty() ? std::nullopt : std::optional<Shard>(parse_shard(c.shard));
}

// The report as the flags ask (a shard's part is always JSON).
inline void emit_bench(const BenchReport& r, const std::vector<BenchColumn>& cols, const BenchCommon& c) {
  write_text_file(c.output, c.json || !c.shard.empty() ? json_text(r.to_json()) : c.csv ? r.to_csv() : r.to_table(cols));
}

}  // namespace akv::cli
