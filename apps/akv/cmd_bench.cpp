// akv bench quant [...]: throughput benchmarks on synthetic tensors, with a baseline measured in
// the same run (figures are ratios; the machine may be shared and noisy).
#include <cstdio>

#include "akv/bench/attention_bench.h"
#include "akv/bench/decode_bench.h"
#include "akv/bench/policy_bench.h"
#include "akv/bench/quant_bench.h"
#include "akv/core/atomic_file.h"
#include "akv/core/shard.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"
#include "akv/io/token_file.h"
#include "akv/method/registry.h"
#include "akv/model/hf.h"
#include "commands.h"
#include "model_flags.h"

namespace akv::cli {

void register_bench(CLI::App& app, const GlobalOptions& global) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks, every figure next to a baseline measured in the same run\n"
               "Synthetic tensors (quant, attention, policy) or a model (decode). See docs/benchmarks.md.");
  bench->require_subcommand(1);

  // Options every synthetic suite shares: timing and output format.
  struct Common {
    int warmup = 1, repeat = 5;
    bool json = false, csv = false;
    std::string output = "-", shard;
  };
  auto add_common = [](CLI::App* sub, Common& c) {
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
  };
  auto shard_of = [](const Common& c) { return c.shard.empty() ? std::nullopt : std::optional<Shard>(parse_shard(c.shard)); };
  auto emit = [](const BenchReport& r, const std::vector<BenchColumn>& cols, const Common& c) {
    write_text_file(c.output, c.json || !c.shard.empty() ? json_text(r.to_json())
                              : c.csv ? r.to_csv()
                                      : r.to_table(cols));
  };

  struct QuantOptions {
    QuantBenchOptions bench;
    Common common;
    std::vector<int> bits = {2, 3, 4, 8};
    std::vector<std::string> axes = {"channel", "token"};
    std::string rule = "kivi";
  };
  auto opt = std::make_shared<QuantOptions>();
  QuantBenchOptions& b = opt->bench;
  CLI::App* sub = bench->add_subcommand(
      "quant",
      "Quantize and dequantize throughput next to a memcpy\n"
      "Quantize+pack and unpack+dequantize throughput (GB/s of f32 processed) on a [heads, "
      "tokens, head_dim] f32 tensor, threads over heads, next to a memcpy of the same buffer "
      "with the same threads; kernels checked against the reference first");
  sub->add_option("--heads", b.heads, "Heads")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--tokens", b.tokens, "Tokens per head")->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--head-dim", b.head_dim, "Head dimension")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_option("--group", b.group, "Group size G")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--bits", opt->bits, "Bit widths to measure")->capture_default_str()
      ->check(CLI::IsMember({2, 3, 4, 8}));
  sub->add_option("--axis", opt->axes, "Axes to measure: channel, token")->capture_default_str()
      ->check(CLI::IsMember({"channel", "token"}));
  sub->add_option("--rule", opt->rule,
                  "Parameter rule timed: kivi (fp16 arithmetic as KIVI) or bounded (directed f16 "
                  "rounding); the kernel check covers both")
      ->capture_default_str()->check(CLI::IsMember({"kivi", "bounded"}));
  sub->add_option("--seed", b.seed, "Random seed of the tensor")->capture_default_str();
  add_common(sub, opt->common);
  sub->callback([opt, &global, emit, shard_of] {
    QuantBenchOptions o = opt->bench;
    o.rule = parse_quant_rule(opt->rule);
    o.bits = opt->bits;
    o.axes.clear();
    for (const auto& a : opt->axes) o.axes.push_back(parse_quant_axis(a));
    o.threads = global.threads;
    o.warmup = opt->common.warmup;
    o.repeat = opt->common.repeat;
    o.shard = shard_of(opt->common);
    emit(bench_quant(o), quant_columns(), opt->common);
  });

  struct AttentionOptions {
    AttentionBenchOptions bench;
    Common common;
    std::size_t stream_mb = 512;
  };
  auto aopt = std::make_shared<AttentionOptions>();
  AttentionBenchOptions& ab = aopt->bench;
  CLI::App* att = bench->add_subcommand(
      "attention",
      "Decode attention over synthetic caches next to stream-read and FMA peaks\n"
      "Decode attention time per token over synthetic caches (dense f32, dense f16, packed "
      "KIVI layouts with an f16 residual), effective GB/s of cache bytes read, speedup vs dense "
      "f16, next to a stream-read bandwidth and an f32 FMA peak measured in the same run (x "
      "stream, x fma: fractions of each); kernels checked against the reference first. See "
      "docs/attention.md");
  att->add_option("--contexts", ab.contexts, "Context lengths (tokens)")->delimiter(',')
      ->capture_default_str()->check(CLI::Range(1, 1 << 22));
  att->add_option("--head-dims", ab.head_dims, "Head dimensions")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(1, 1024));
  att->add_option("--gqa", ab.gqa, "Query heads per KV head")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(1, 64));
  att->add_option("--kv-heads", ab.kv_heads, "KV heads")->capture_default_str()->check(CLI::Range(1, 256));
  att->add_option("--variants", ab.variants, "Caches: f32, f16, q<b> (K and V at b bits), k<b>v<b>; b in 2,3,4,8; ggml-<type> (llama.cpp's cache "
                  "types q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl: every K and V row as ggml blocks, attention over a "
                  "dequantized tile at a time)")
      ->delimiter(',')->capture_default_str();
  att->add_option("--isa", ab.isas,
                  "Instruction sets to time every variant with: best, avx512, avx2, generic (the plain "
                  "loops); avx512 and avx2 give bitwise-identical results, generic agrees within 1e-6")
      ->delimiter(',')->capture_default_str();
  att->add_option("--attention", ab.attention,
                  "Attention paths to time every variant with: exact (f32 products), int8 (8-bit query and "
                  "probability factors x packed codes, integer sums; only variants with 2- or 4-bit codes); "
                  "columns err (output vs the f32 variant's, when timed) and vs exact (int8 vs the exact path)")
      ->delimiter(',')->capture_default_str();
  att->add_option("--tile", ab.tile, "Tokens per online-softmax step of the kernel")->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  att->add_option("--partition", ab.partition, "Tokens per work item (a multiple of --tile)")->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  att->add_option("--residual", ab.residual, "f16 residual tokens of packed caches")->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  att->add_option("--group", ab.group, "Quantization group G")->capture_default_str()->check(CLI::Range(1, 4096));
  att->add_option("--min-sample", ab.min_sample_s, "Seconds per sample (short calls repeat within a sample)")
      ->capture_default_str()->check(CLI::Range(0.0, 10.0));
  att->add_option("--seed", ab.seed, "Random seed")->capture_default_str();
  att->add_option("--stream-mb", aopt->stream_mb, "Buffer of the stream-read probe (MB; well above the last-level cache)")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  add_common(att, aopt->common);
  att->callback([aopt, &global, emit, shard_of] {
    AttentionBenchOptions o = aopt->bench;
    o.threads = global.threads;
    o.warmup = aopt->common.warmup;
    o.repeat = aopt->common.repeat;
    o.stream_bytes = aopt->stream_mb << 20;
    o.shard = shard_of(aopt->common);
    emit(bench_attention(o), attention_columns(), aopt->common);
  });

  struct PolicyOptions {
    PolicyBenchOptions bench;
    Common common;
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
  pol->add_option("--methods", pb.methods, "Methods (as in evaluate --methods; 'full' = f32)")
      ->delimiter(',')->capture_default_str();
  pol->add_option("--contexts", pb.contexts, "Prompt lengths")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  pol->add_option("--layers", pb.layers, "Layers")->capture_default_str()->check(CLI::Range(1, 256));
  pol->add_option("--heads", pb.heads, "Query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--kv-heads", pb.kv_heads, "KV heads")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--head-dim", pb.head_dim, "Head dimension")->capture_default_str()->check(CLI::Range(1, 1024));
  pol->add_option("--seed", pb.seed, "Random seed")->capture_default_str();
  add_common(pol, popt->common);
  pol->callback([popt, &global, emit, shard_of] {
    PolicyBenchOptions o = popt->bench;
    o.threads = global.threads;
    o.warmup = popt->common.warmup;
    o.repeat = popt->common.repeat;
    o.shard = shard_of(popt->common);
    emit(bench_policy(o), policy_columns(), popt->common);
  });

  struct DecodeOptions {
    std::string model, tokens, weights = "stored";
    std::vector<std::string> methods = {"none", "kivi-4", "kivi-2", "adakv:budget=0.5:window=16"};
    std::size_t prefill = 256, sequences = 4, batch = 1;
    int repeats = 3;
    bool json = false;
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
  dec->add_option("--tokens", dopt->tokens, "Token sequences (one per line)")->required();
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
  dec->add_flag("--json", dopt->json, "Print JSON");
  dec->add_option("-o,--output", dopt->output, "Write to this file (atomically) instead of stdout")
      ->capture_default_str();
  dec->add_option("--shard", dopt->shard,
                  "Run shard K of N (K/N, 1-based) of the methods (full is timed in every shard as its "
                  "baseline); writes a partial report (JSON, format akv-bench-decode-part) that `akv merge` "
                  "combines (docs/scale.md)")->check(kShardText);
  dec->callback([dopt, &global] {
    std::vector<PplMethod> methods;
    for (const auto& spec : dopt->methods) {
      if (spec != "full") methods.push_back({spec, resolve_params(parse_method_spec(spec))});
    }
    std::vector<std::string> inputs = model_run_inputs(dopt->model, methods);
    inputs.push_back(dopt->tokens);
    check_output_distinct(dopt->output, inputs);
    const Model m = load_model(dopt->model, parse_weight_mode(dopt->weights));
    auto seqs = read_token_file(dopt->tokens);
    m.check_tokens(seqs, dopt->tokens);
    if (dopt->sequences && seqs.size() > dopt->sequences) seqs.resize(dopt->sequences);
    const std::optional<Shard> shard = dopt->shard.empty() ? std::nullopt : std::optional<Shard>(parse_shard(dopt->shard));
    DecodeBenchResult r = bench_decode(m, seqs, methods, dopt->prefill, dopt->repeats, shard, dopt->batch, global.threads);
    if (shard) {
      r.inputs = {{"model", {{"path", dopt->model}, {"hash", path_hash(dopt->model)}}},
                  {"tokens", {{"path", dopt->tokens}, {"hash", file_hash(dopt->tokens)}}}};
      r.params = {{"methods", dopt->methods}, {"weights", dopt->weights}, {"batch", dopt->batch},
                  {"kernels", kernel_arithmetic()}};
    }
    write_text_file(dopt->output, dopt->json || shard ? json_text(r.to_json()) : r.to_table());
  });
}

}  // namespace akv::cli
