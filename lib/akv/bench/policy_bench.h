#pragma once
// `akv bench policy`: per-token decode cost of each cache policy (kv/runtime.h and the
// tiered cache): the policy's own work (append, quantizing groups as they leave the residual,
// scoring, eviction, tier migration) and the fused attention over what it stores, after a
// synthetic prompt of each context length; ratios against a baseline policy in the same run.
// nuq without calibration= is timed under KVQuant's codebooks (sparsity 0.99, the first row in
// f16) fitted on a 512-token synthetic prompt of the same shape, as `bench attention`'s nuq<b>
// variants fit theirs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "akv/bench/report.h"
#include "akv/eval/perplexity.h"

namespace akv {

struct PolicyBenchOptions {
  // h2o is not in the default list: its prompt scoring reads every prompt query (quadratic in
  // the context; minutes at 32K on 2 cores).
  std::vector<std::string> methods = {"none",     "full",     "kivi-4", "kivi-2", "snapkv:budget=0.25",
                                      "streamingllm:budget=0.25", "balanced", "balanced:warm=1024"};
  std::vector<std::size_t> contexts = {4096, 32768};
  std::size_t layers = 1, heads = 32, kv_heads = 8, head_dim = 128;
  int warmup = 4, repeat = 32, threads = 0;  // untimed / timed decode steps
  std::uint64_t seed = 1;
  // Shard K of N (docs/scale.md): cases are the contexts in the order given; a shard times a
  // contiguous range of them, every method of each (the baseline included). Unset: the whole run.
  std::optional<Shard> shard;
};

// The methods as bench_policy runs them ('full' = f32, params nullopt): nuq without calibration=
// comes without codebooks, which bench_policy fits on a synthetic prompt of its shape.
std::vector<PplMethod> policy_methods(const std::vector<std::string>& specs);

// Rows per (context, method): policy_us / attention_us / total_us per decode step (all layers)
// and total vs the first method's (the baseline). Samples: total seconds per step.
BenchReport bench_policy(const PolicyBenchOptions& o);
std::vector<BenchColumn> policy_columns();

}  // namespace akv
