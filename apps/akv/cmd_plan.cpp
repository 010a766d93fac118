// akv plan: KV bytes per token of each method for a model shape, and the longest context /
// largest batch that fit a memory budget.
#include <memory>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/kv/prompt_plan.h"
#include "akv/method/registry.h"
#include "akv/plan/plan.h"
#include "commands.h"

namespace akv::cli {

void register_plan(CLI::App& app, const GlobalOptions&) {
  struct Options {
    std::string config, memory = "16GiB", host_memory, output = "-", calibration, weights;
    std::size_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
    std::uint64_t context = 4096;
    int weight_dtype_bytes = 0;
    std::vector<std::string> methods = {"f32",   "none",     "kivi-4",  "kivi-2", "k4v2",
                                        "quality", "balanced", "compact", "snapkv:budget=0.2",
                                        "snapkv:budget=0.2:quant=kivi-2"};
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "KV-cache bytes per token of each method and what fits in memory\n"
      "KV-cache bytes per token of each method for a model shape, and the longest context "
      "(batch 1) and largest batch (at --context) that fit --memory after the weights. See "
      "docs/plan.md");
  auto* cfg = sub->add_option("--config", opt->config,
                              "Hugging Face config.json (or its directory), or a model file: GGUF or llama2.c .bin "
                              "(its weights counted as stored)");
  auto* layers = sub->add_option("--layers", opt->layers, "Layers (without --config)")->check(CLI::Range(1, 100000));
  sub->add_option("--heads", opt->heads, "Query heads (without --config; default = --kv-heads)")->check(CLI::Range(1, 100000));
  auto* kv = sub->add_option("--kv-heads", opt->kv_heads, "KV heads (without --config)")->check(CLI::Range(1, 100000));
  auto* hd = sub->add_option("--head-dim", opt->head_dim, "Head dimension (without --config)")->check(CLI::Range(1, 100000));
  layers->excludes(cfg);
  kv->excludes(cfg);
  hd->excludes(cfg);
  sub->add_option("--memory", opt->memory, "Accelerator memory: 16GiB, 80GB, 512MiB, bytes")->capture_default_str();
  sub->add_option("--host-memory", opt->host_memory, "Host memory for the cold tier (default: unlimited)");
  sub->add_option("--weights", opt->weights, "Weight bytes (default: from --config, else 0)");
  sub->add_option("--weight-bytes-per-param", opt->weight_dtype_bytes, "Bytes per parameter (default: torch_dtype of a config.json; 2)")
      ->check(CLI::IsMember({1, 2, 4}));
  sub->add_option("--context", opt->context, "Context length for bytes per token and the batch column")
      ->capture_default_str()->check(CLI::Range(1ull, 1ull << 40));
  sub->add_option("--methods,--method", opt->methods, "Methods (as in evaluate --methods; f32 = full cache)")
      ->delimiter(',')->capture_default_str();
  sub->add_option("--calibration", opt->calibration, "Also plan kivi with the per-head bits of this calib.json");
  sub->add_flag("--json", opt->json, "Print JSON");
  sub->add_option("-o,--output", opt->output, "Write to this file (atomically) instead of stdout")->capture_default_str();
  sub->callback([opt] {
    check_output_distinct(opt->output, {opt->config, opt->calibration});
    PlanShape s;
    if (!opt->config.empty()) {
      s = read_plan_config(opt->config, opt->weight_dtype_bytes);
    } else {
      if (!opt->layers || !opt->kv_heads || !opt->head_dim) {
        throw UsageError("give --config, or --layers, --kv-heads and --head-dim", {"", "--config"});
      }
      s.n_layers = opt->layers;
      s.n_kv_heads = opt->kv_heads;
      s.n_heads = opt->heads ? opt->heads : opt->kv_heads;
      s.head_dim = opt->head_dim;
    }
    if (!opt->weights.empty()) s.weight_bytes = opt->weights == "0" ? 0 : parse_bytes(opt->weights, "--weights");
    std::vector<PlanMethod> methods;
    // Per-head inputs are read for the layers a method's cache holds: a model with global and
    // local layers compresses its global layers only.
    DumpMeta m;
    m.kv_shape() = s.windowed() && !s.all_local() ? s.global_shape() : s.kv_shape();
    for (const auto& spec : opt->methods) {
      methods.push_back({spec, spec == "f32" ? std::nullopt : resolve_method_spec_for_bytes(spec)});
      if (auto& p = methods.back().params) {
        check_output_distinct(opt->output, p->input_files());
        read_calibration_inputs(*p, m);  // per-head bits, nuq's sparsity and sinks (without a file: KVQuant's defaults)
      }
    }
    if (!opt->calibration.empty()) {
      CompressParams p = resolve_params(parse_method_spec("kivi"));
      p.calibration_file = opt->calibration;
      read_calibration_inputs(p, m);
      methods.push_back({"kivi:calibration", p});
    }
    const std::uint64_t memory = parse_bytes(opt->memory, "--memory");
    std::optional<std::uint64_t> host;
    if (!opt->host_memory.empty()) host = parse_bytes(opt->host_memory, "--host-memory");
    const PlanReport r = plan(s, methods, memory, opt->context, host);
    write_text_file(opt->output, opt->json ? json_text(r.to_json()) : r.to_table());
  });
}

}  // namespace akv::cli
