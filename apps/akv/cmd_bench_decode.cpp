// akv bench decode: model prefill and decode throughput of each cache method next to the full
// cache, in the same run.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "akv/bench/decode_bench.h"
#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"
#include "akv/io/token_file.h"
#include "akv/model/load.h"
#include "commands.h"
#include "model_flags.h"

namespace akv::cli {

void register_bench_decode(CLI::App* bench, const GlobalOptions& global) {
  struct DecodeOptions {
    std::string model, tokens, weights = "stored";
    std::vector<std::string> methods = {"none", "kivi-4", "kivi-2", "adakv:budget=0.5:window=16"};
    std::size_t prefill = 256, sequences = 4, batch = 1, max_context = 0;
    int repeats = 3;
    bool json = false, no_full = false;
    std::string output = "-", shard;
  };
  auto dopt = std::make_shared<DecodeOptions>();
  CLI::App* dec = bench->add_subcommand(
      "decode",
      "Model prefill and decode throughput of each cache method next to the full cache\n"
      "Model prefill and decode throughput with each cache method, next to the full f32 cache "
      "in the same run (time per decoded token as a ratio), methods interleaved, best of "
      "--repeats");
  dec->add_option("--model", dopt->model, kModelHelp)->required();
  add_weights_flag(dec, dopt->weights);
  dec->add_option("--tokens", dopt->tokens, "Token sequences (one per line; - = standard input)")->required();
  dec->add_option("--methods", dopt->methods, "Methods (as in evaluate --methods)")
      ->delimiter(',')->capture_default_str();
  dec->add_option("--prefill", dopt->prefill, "Prompt tokens")->capture_default_str();
  dec->add_option("--sequences", dopt->sequences, "Sequences to decode")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  dec->add_option("--repeats", dopt->repeats, "Repetitions (best is reported)")->capture_default_str()
      ->check(CLI::Range(1, 100));
  dec->add_option("--batch", dopt->batch,
                  "Sequences decoded together (one batched step over all of them, as evaluate --batch; "
                  "1 = one at a time)")->capture_default_str()->check(CLI::Range(1, 4096));
  dec->add_flag("--no-full", dopt->no_full,
                "Time no full-cache lane: its f32 K/V (the largest cache) then take no memory, so the process's "
                "peak RSS is the methods' own; the x full time column is left empty (null in JSON)");
  dec->add_option("--max-context", dopt->max_context,
                  "Refuse sequences longer than this many positions (0 = no limit: past the model's trained "
                  "context the run goes on with a warning on stderr, as evaluate --model and llama.cpp do)")
      ->capture_default_str();
  dec->add_flag("--json", dopt->json, "Print JSON");
  dec->add_option("-o,--output", dopt->output, "Write to this file (atomically) instead of stdout")
      ->capture_default_str();
  dec->add_option("--shard", dopt->shard,
                  "Run shard K of N (K/N, 1-based) of the methods (full is timed in every shard as its "
                  "baseline); writes a partial report (JSON, format akv-bench-decode-part) that `akv merge` "
                  "combines (docs/scale.md)")->check(kShardText);
  dec->callback([dopt, &global] {
    const std::vector<PplMethod> methods = resolve_methods(dopt->methods);
    std::vector<std::string> inputs = model_run_inputs(dopt->model, methods);
    inputs.push_back(dopt->tokens);
    check_output_distinct(dopt->output, inputs);
    Model m = load_model(dopt->model, parse_weight_mode(dopt->weights));
    m.set_position_limit(dopt->max_context ? dopt->max_context : std::numeric_limits<std::size_t>::max());
    auto seqs = read_token_file(dopt->tokens);
    m.check_tokens(seqs, dopt->tokens);
    if (dopt->sequences && seqs.size() > dopt->sequences) seqs.resize(dopt->sequences);
    std::size_t longest = 0;
    for (const auto& s : seqs) longest = std::max(longest, s.size());
    if (longest > m.position_limit()) {
      throw InvalidInput("a sequence longer than " + m.limit_text(), {dopt->tokens, "length", std::to_string(longest)});
    }
    if (longest > m.config().seq_len) {
      std::fprintf(stderr, "akv: warning: the run reaches position %zu, past the model's trained context (seq_len %zu): "
                           "positions beyond it get RoPE angles the model never saw (--max-context %zu refuses such runs)\n",
                   longest, m.config().seq_len, m.config().seq_len);
    }
    const std::optional<Shard> shard = dopt->shard.empty() ? std::nullopt : std::optional<Shard>(parse_shard(dopt->shard));
    DecodeBenchResult r = bench_decode(m, seqs, methods, dopt->prefill, dopt->repeats, shard, dopt->batch, global.threads,
                                      !dopt->no_full);
    if (shard) {
      r.inputs = {{"model", {{"path", dopt->model}, {"hash", path_hash(dopt->model)}}},
                  {"tokens", {{"path", dopt->tokens}, {"hash", file_hash(dopt->tokens)}}}};
      r.params = {{"methods", dopt->methods}, {"weights", dopt->weights}, {"batch", dopt->batch},
                  {"kernels", kernel_arithmetic()}};
      if (dopt->no_full) r.params["full"] = false;  // absent: the full lane ran
    }
    write_text_file(dopt->output, dopt->json || shard ? json_text(r.to_json()) : r.to_table());
  });
}

}  // namespace akv::cli
