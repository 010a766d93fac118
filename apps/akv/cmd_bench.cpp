// akv bench quant|attention|policy: benchmarks on synthetic tensors, with a baseline measured in
// the same run (figures are ratios; the machine may be shared and noisy). bench decode (a model):
// cmd_bench_decode.cpp.
#include <cstdio>

#include "akv/bench/attention_bench.h"
#include "akv/bench/quant_bench.h"
#include "akv/core/atomic_file.h"
#include "akv/core/shard.h"
#include "akv/io/json_file.h"
#include "akv/method/registry.h"
#include "bench_flags.h"
#include "commands.h"

namespace akv::cli {

void register_bench(CLI::App& app, const GlobalOptions& global) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks, every figure next to a baseline measured in the same run\n"
               "Synthetic tensors (quant, attention, policy) or a model (decode). See docs/benchmarks.md.");
  bench->require_subcommand(1);

  struct QuantOptions {
    QuantBenchOptions bench;
    BenchCommon common;
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
  add_bench_common(sub, opt->common);
  sub->callback([opt, &global] {
    QuantBenchOptions o = opt->bench;
    o.rule = parse_quant_rule(opt->rule);
    o.bits = opt->bits;
    o.axes.clear();
    for (const auto& a : opt->axes) o.axes.push_back(parse_quant_axis(a));
    o.threads = global.threads;
    o.warmup = opt->common.warmup;
    o.repeat = opt->common.repeat;
    o.shard = bench_shard(opt->common);
    emit_bench(bench_quant(o), quant_columns(), opt->common);
  });

  struct AttentionOptions {
    AttentionBenchOptions bench;
    BenchCommon common;
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
  att->add_option("--variants", ab.variants, "Caches: f32, f16, q<b> (K and V at b bits), k<b>v<b> (KIVI at --group and "
                  "--residual), nuq<b> (KVQuant's codes, codebooks fitted on each context's own rows, so at least 3 of them, read through their levels "
                  "by the decode loops); b in 2,3,4,8; ggml-<type> (llama.cpp's cache types q8_0, q4_0, q4_1, q5_0, "
                  "q5_1, iq4_nl: every K and V row as ggml blocks, read block by block by the attention loops); "
                  "or a method spec as evaluate --methods takes it (full, a quantizer or preset with its flags, "
                  "ggml:k=T:v=T; e.g. kivi:bits-key=4:bits-value=2:group=64, turboquant_3bit_nc), stored as that "
                  "method stores it")
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
  add_bench_common(att, aopt->common);
  att->callback([aopt, &global] {
    AttentionBenchOptions o = aopt->bench;
    o.threads = global.threads;
    o.warmup = aopt->common.warmup;
    o.repeat = aopt->common.repeat;
    o.stream_bytes = aopt->stream_mb << 20;
    o.shard = bench_shard(aopt->common);
    emit_bench(bench_attention(o), attention_columns(), aopt->common);
  });

  register_bench_policy(bench, global);
  register_bench_decode(bench, global);
}

}  // namespace akv::cli
