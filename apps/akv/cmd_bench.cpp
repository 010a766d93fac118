// akv bench quant [...]: throughput benchmarks on synthetic tensors, with a baseline measured in
// the same run (figures are ratios; the machine may be shared and noisy).
#include <cstdio>

#include "akv/bench/decode_bench.h"
#include "akv/bench/quant_bench.h"
#include "akv/io/token_file.h"
#include "akv/model/hf.h"
#include "commands.h"

namespace akv::cli {

void register_bench(CLI::App& app, const GlobalOptions& global) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks on synthetic tensors; every figure comes with a baseline measured in "
               "the same run. See docs/benchmarks.md.");
  bench->require_subcommand(1);

  struct QuantOptions {
    QuantBenchOptions bench;
    std::vector<int> bits = {2, 3, 4, 8};
    std::vector<std::string> axes = {"channel", "token"};
    bool json = false;
  };
  auto opt = std::make_shared<QuantOptions>();
  QuantBenchOptions& b = opt->bench;
  CLI::App* sub = bench->add_subcommand(
      "quant",
      "Quantize+pack and unpack+dequantize throughput (GB/s of f32 processed, best of --repeats) "
      "on a [heads, tokens, head_dim] f32 tensor, threads over heads, next to a memcpy of the "
      "same buffer with the same threads");
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
  sub->add_option("--repeats", b.repeats, "Repetitions (best is reported)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--seed", b.seed, "Random seed of the tensor")->capture_default_str();
  sub->add_flag("--json", opt->json, "Print JSON");
  sub->callback([opt, &global] {
    QuantBenchOptions o = opt->bench;
    o.bits = opt->bits;
    o.axes.clear();
    for (const auto& a : opt->axes) o.axes.push_back(parse_quant_axis(a));
    o.threads = global.threads;
    const QuantBenchResult r = bench_quant(o);
    const std::string text = opt->json ? r.to_json().dump(2) + "\n" : r.to_table();
    std::fputs(text.c_str(), stdout);
  });

  struct DecodeOptions {
    std::string model, tokens;
    std::vector<std::string> methods = {"none", "kivi-4", "kivi-2", "adakv:budget=0.5:window=16"};
    std::size_t prefill = 256, sequences = 4;
    int repeats = 3;
    bool json = false;
  };
  auto dopt = std::make_shared<DecodeOptions>();
  CLI::App* dec = bench->add_subcommand(
      "decode",
      "Model prefill and decode throughput with each cache method, next to the full f32 cache "
      "in the same run (time per decoded token as a ratio), methods interleaved, best of "
      "--repeats");
  dec->add_option("--model", dopt->model, "Model: a llama2.c checkpoint (.bin) or a Hugging Face directory (config.json + safetensors)")->required();
  dec->add_option("--tokens", dopt->tokens, "Token sequences (one per line)")->required();
  dec->add_option("--methods", dopt->methods, "Methods (as in evaluate --methods)")
      ->delimiter(',')->capture_default_str();
  dec->add_option("--prefill", dopt->prefill, "Prompt tokens")->capture_default_str();
  dec->add_option("--sequences", dopt->sequences, "Sequences to decode")->capture_default_str();
  dec->add_option("--repeats", dopt->repeats, "Repetitions (best is reported)")->capture_default_str()
      ->check(CLI::Range(1, 100));
  dec->add_flag("--json", dopt->json, "Print JSON");
  dec->callback([dopt] {
    std::vector<PplMethod> methods;
    for (const auto& spec : dopt->methods) {
      if (spec != "full") methods.push_back({spec, resolve_params(parse_method_spec(spec))});
    }
    const Model m = load_model(dopt->model);
    auto seqs = read_token_file(dopt->tokens);
    if (dopt->sequences && seqs.size() > dopt->sequences) seqs.resize(dopt->sequences);
    const DecodeBenchResult r = bench_decode(m, seqs, methods, dopt->prefill, dopt->repeats);
    std::fputs((dopt->json ? r.to_json().dump(2) + "\n" : r.to_table()).c_str(), stdout);
  });
}

}  // namespace akv::cli
