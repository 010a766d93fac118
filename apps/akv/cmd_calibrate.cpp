// akv calibrate DUMP [DUMP ...] -o calib.json [--target-bits 3] [--bits 2,3,4] ...
#include <cstdio>

#include "akv/alloc/engine_settings.h"
#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/eval/calibrate.h"
#include "akv/eval/calibrate_shard.h"
#include "akv/io/json_file.h"
#include "commands.h"

namespace akv::cli {

void register_calibrate(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::vector<std::string> dumps;
    std::string output;
    CalibrateOptions calib;
    std::string rule = "kivi", rotate = "none", shard, emit;
    bool no_nuq = false;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CalibrateOptions& c = opt->calib;
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Measure each KV head's quantization error and assign bits per head\n"
      "Measure, for every layer and KV head, the attention-output error when that head's keys "
      "(and separately its values) are quantized at each candidate bit width (kivi layout, "
      "everything else exact), with the dumps' queries; record key-norm variance, attention "
      "entropy and key outlier ratio, and their Spearman correlation with the measured error; "
      "assign bits per head (keys and values) for a target average. Allocators: measured "
      "(exact multiple-choice knapsack minimising the summed measured error), adakv-proxy (the "
      "seed's rule on key-norm variance: normalise, scale to H*target, clamp to [lo, hi], snap "
      "to {lo, mid, hi}, greedy correction; note that a target equal to --lo-bit, e.g. the "
      "default 2.0 with lo 2, necessarily gives every head lo bits), entropy (the same rule on "
      "attention entropy). Also fits each KV head's Q-Filter (the principal direction of its "
      "query heads' stored queries, every dump's rows together; Q-Filters' make_filters.py) for "
      "the eviction method qfilter, when every dump is longer than --duo-sinks + --duo-window, "
      "each KV head's attention-output error as a DuoAttention streaming head (only its first and last "
      "tokens kept) for duo's heads=, and, when every dump has key_pre_rope, KVQuant's non-uniform "
      "codebooks of every layer (--nuq-bits) for method nuq, and, when every dump has attention inputs and "
      "KVzip+ scores (akv dump --kvzap), KVzap's linear surrogate of every layer (ridge regression of the log "
      "KVzip+ scores on the attention inputs, as kvpress's kvzap/train.py) for method kvzap. With --types, also each head's error "
      "with its keys (values) stored as each of those cache types, and each head's key and value "
      "type for --types-target-bits (exact knapsack on the measured errors). Writes calib.json "
      "(format akv-calibration v1) for `akv compress --calibration` (bits, fp8 scales), `--qfilters` "
      "(qfilter), `--heads` (duo), `--codebook` (nuq), `surrogate=` (kvzap) and `-m ggml --types` "
      "(per-head cache types). "
      "See docs/calibrate.md.");
  sub->add_option("dumps", opt->dumps, "Dumps (akv-dump) of the same model")->required();
  sub->add_option("-o,--output", opt->output,
                  "Write calib.json here (- or /dev/stdout = stdout: the JSON alone, without the table, for a pipe into "
                  "`akv compress --calibration -`)");
  sub->add_option("--target-bits", c.target_bits, "Average bits per head (keys and values)")
      ->capture_default_str();
  sub->add_option("--bits", c.candidates, "Candidate bit widths (2, 3, 4, 8)")->delimiter(',')
      ->capture_default_str();
  sub->add_option("--group-size", c.group, "Quantization group size G")->capture_default_str();
  sub->add_option("--residual", c.residual, "Residual window R (f16 recent tokens)")->capture_default_str();
  sub->add_option("--quant-rule", opt->rule,
                  "Quantization rule: kivi (as KIVI's code) or bounded (every value within scale/2); "
                  "see docs/compress.md")
      ->capture_default_str()->check(CLI::IsMember({"kivi", "bounded"}));
  sub->add_option("--rotate", opt->rotate,
                  "Measure with the rows rotated before quantization: none, hadamard or random (seed 0), "
                  "as compress --rotate; calibrate for a rotated cache (docs/compress.md)")
      ->capture_default_str()->check(CLI::IsMember({"none", "hadamard", "random"}));
  sub->add_option("--aggregate", c.aggregate, "Combine several dumps: mean or max (robust)")
      ->capture_default_str();
  sub->add_option("--allocator", c.allocator, "measured | adakv-proxy | entropy")->capture_default_str();
  sub->add_option("--lo-bit", c.lo, "Proxy allocators: lowest level")->capture_default_str();
  sub->add_option("--mid-bit", c.mid, "Proxy allocators: middle level")->capture_default_str();
  sub->add_option("--hi-bit", c.hi, "Proxy allocators: highest level")->capture_default_str();
  sub->add_option("--update-interval", c.update_interval,
                  "adakv-proxy: re-allocate every N tokens of a simulated stream (running norm "
                  "accumulators; 0 = once at the end); the history goes to summary.bits_history")
      ->capture_default_str();
  sub->add_option("--duo-sinks", c.duo_sinks, "DuoAttention head scores: the first tokens a streaming head keeps "
                  "(duo's sinks)")->capture_default_str();
  sub->add_option("--duo-window", c.duo_window, "DuoAttention head scores: the most recent tokens a streaming head "
                  "keeps (duo's window)")->capture_default_str();
  sub->add_option("--nuq-bits", c.nuq_bits,
                  "KVQuant nuq codebooks: the bit widths to fit (2, 3, 4, 8), when every dump has key_pre_rope")
      ->delimiter(',')->capture_default_str();
  sub->add_flag("--no-nuq", opt->no_nuq, "Fit no nuq codebooks");
  sub->add_option("--nuq-sparsity", c.nuq_sparsity,
                  "KVQuant's sparsity threshold: the values outside the (1 - s) / 2 and 1 - (1 - s) / 2 quantiles "
                  "are outliers kept exact (0.99: about 1%)")->capture_default_str();
  sub->add_option("--nuq-sink", c.nuq_sink,
                  "KVQuant's first_few_fp16: the first tokens of each sequence kept in f16 and left out of the "
                  "codebook fit")->capture_default_str();
  sub->add_option("--kvzap-alpha", c.kvzap_alpha,
                  "KVzap: the ridge penalty of the surrogate's fit (scikit-learn's Ridge alpha; kvpress's default)")
      ->capture_default_str();
  sub->add_option("--kvzap-sinks", c.kvzap_sinks,
                  "KVzap: the first tokens of each dump left out of the fit (the method keeps its 4 sinks anyway)")
      ->capture_default_str();
  sub->add_option("--types", c.types,
                  "Cache types to choose among per head (comma-separated; llama.cpp's q8_0, q4_0, ..., "
                  "f16, vLLM's fp8_e4m3, fp8_e5m2, TurboQuant's tq3nc, tqv4, ...; keys take all but tqv*, "
                  "values all but TurboQuant's key types), rotated as --rotate; a name followed by +hadamard or +random (e.g. "
                  "q4_0+hadamard) is that type with its own rotation, so that heads may differ (docs/calibrate.md)")
      ->delimiter(',');
  sub->add_option("--types-target-bits", c.types_target_bits,
                  "--types: mean stored bits per element over every head's keys and values (the types' "
                  "blocks; default --target-bits)");
  CLI::Option* json = sub->add_flag("--json", opt->json, "Print calib.json on stdout instead of the table");
  sub->add_option("--emit", opt->emit,
                  "Print, instead of the table, what an engine takes of the --types assignment (JSON): vllm "
                  "(--kv-cache-dtype, --kv-cache-dtype-skip-layers: the layers at least half of whose K and V "
                  "tensors were assigned f16, fp8 k_scale / v_scale per layer) or llama.cpp (-ctk, -ctv, the "
                  "layers it cannot keep in f16); docs/calibrate.md")
      ->check(CLI::IsMember({"vllm", "llama.cpp"}))->excludes(json);

  sub->add_option("--shard", opt->shard,
                  "Measure shard K of N (K/N, 1-based): a contiguous 1/N of the layers of every dump; "
                  "writes a partial file (format akv-calibration-part, to -o or stdout) that `akv merge` "
                  "turns into calib.json (docs/scale.md)")->check(kShardText);
  sub->callback([opt, &global] {
    check_output_distinct(opt->output, opt->dumps);
    CalibrateOptions o = opt->calib;
    o.rule = parse_quant_rule(opt->rule);
    o.rotate = parse_rotation(opt->rotate);
    if (opt->no_nuq) o.nuq_bits.clear();
    if (!opt->emit.empty() && o.types.empty()) {
      throw UsageError("--emit reads the per-head types of --types", {"", "--emit", opt->emit});
    }
    if (!opt->emit.empty() && !opt->shard.empty()) throw UsageError("--emit needs every layer: not with --shard", {"", "--emit", opt->emit});
    if (!opt->emit.empty() && names_stdout(opt->output)) {
      throw UsageError("--emit prints the engine settings on stdout: write calib.json to a file", {"", "-o", opt->output});
    }
    if (!opt->shard.empty()) {
      ProgressBar bar("calibrate", !global.quiet);
      o.threads = global.threads;
      const nlohmann::json part = calibrate_part(opt->dumps, o, parse_shard(opt->shard), bar.callback());
      write_text_file(opt->output.empty() ? "-" : opt->output, json_text(part));
      return;
    }
    o.threads = global.threads;
    ProgressBar bar("calibrate", !global.quiet);
    const nlohmann::json j = calibrate(opt->dumps, o, bar.callback());
    const nlohmann::json emitted = opt->emit.empty() ? nlohmann::json() : engine_settings(j, opt->emit);
    const bool json_alone = names_stdout(opt->output);  // before the write replaces a redirected file
    if (!opt->output.empty()) write_text_file(opt->output, json_text(j));
    if (json_alone) return;
    std::fputs((!opt->emit.empty() ? json_text(emitted) : opt->json ? json_text(j) : render_calibration(j)).c_str(), stdout);
  });
}

}  // namespace akv::cli
