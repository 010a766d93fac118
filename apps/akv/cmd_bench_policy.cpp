// akv bench policy: per-token decode cost of each cache method after a synthetic prompt.
#include "akv/bench/policy_bench.h"
#include "akv/eval/model_run.h"
#include "bench_flags.h"

namespace akv::cli {

void register_bench_policy(CLI::App* bench, const GlobalOptions& global) {
  struct PolicyOptions {
    PolicyBenchOptions bench;
    BenchCommon common;
  };
  auto popt = std::make_shared<PolicyOptions>();
  popt->common.warmup = popt->bench.warmup;
  popt->common.repeat = popt->bench.repeat;
  PolicyBenchOptions& pb = popt->bench;
  CLI::App* pol = bench->add_subcommand(
      "policy",
      "Per-token decode cost of each cache method after a synthetic prompt\n"
      "Per-token decode cost of each cache policy after a synthetic prompt: the policy's work "
      "(append, quantization, scoring, eviction, migration) and the fused attention over what it "
      "stores, vs the first method in the same run; --warmup/--repeat count decode steps");
  pol->add_option("--methods", pb.methods, "Methods (as in evaluate --methods; 'full' = f32; nuq without calibration= under codebooks fitted on a "
                  "synthetic prompt)")
      ->delimiter(',')->capture_default_str();
  pol->add_option("--contexts", pb.contexts, "Prompt lengths")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  pol->add_option("--layers", pb.layers, "Layers")->capture_default_str()->check(CLI::Range(1, 256));
  pol->add_option("--heads", pb.heads, "Query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--kv-heads", pb.kv_heads, "KV heads")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--head-dim", pb.head_dim, "Head dimension")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--seed", pb.seed, "Random seed")->capture_default_str();
  add_bench_common(pol, popt->common);
  pol->callback([popt, &global] {
    check_output_distinct(popt->common.output, model_run_inputs("", policy_methods(popt->bench.methods)));
    PolicyBenchOptions o = popt->bench;
    o.threads = global.threads;
    o.warmup = popt->common.warmup;
    o.repeat = popt->common.repeat;
    o.shard = bench_shard(popt->common);
    emit_bench(bench_policy(o), policy_columns(), popt->common);
  });

}

}  // namespace akv::cli
