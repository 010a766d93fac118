// akv allocate DUMP --method M --budget B [-o budgets.json]: per-head token budgets.
#include <fmt/format.h>

#include <cstdio>

#include "akv/cache/params.h"
#include "akv/core/atomic_file.h"
#include "akv/io/file_hash.h"
#include "akv/policy/eviction.h"
#include "commands.h"
#include "eviction_flags.h"

namespace akv::cli {
namespace {

std::string render(const nlohmann::json& j) {
  const auto& s = j["summary"];
  std::string out = fmt::format(
      "{} allocation ({} scores), {} tokens per KV head on average ({} always kept): {} tokens "
      "= {:.4f} of the cache; retained window attention mass mean {:.4f}, min {:.4f}\n",
      s["params"]["alloc"].get<std::string>(), s["params"]["score"].get<std::string>(),
      s["budget_tokens_per_head"].get<std::size_t>(), s["forced_tokens_per_head"].get<std::size_t>(),
      s["total_tokens"].get<std::size_t>(), s["fraction"].get<double>(),
      s["retained_mass_mean"].get<double>(), s["retained_mass_min"].get<double>());
  out += fmt::format("{:>5} {:>9} {:>9} {:>9}  {}\n", "layer", "tokens", "mass_min", "mass_mean",
                     "tokens per head (kind)");
  for (const auto& l : j["layers"]) {
    std::string heads;
    for (const auto& h : l["heads"]) {
      heads += fmt::format("{}{}", heads.empty() ? "" : " ", h["tokens"].get<std::size_t>());
      if (h.contains("kind")) heads += "(" + h["kind"].get<std::string>().substr(0, 1) + ")";
    }
    out += fmt::format("{:>5} {:>9} {:>9.4f} {:>9.4f}  {}\n", l["layer"].get<std::size_t>(),
                       l["tokens"].get<std::size_t>(), l["retained_mass_min"].get<double>(),
                       l["retained_mass_mean"].get<double>(), heads);
  }
  return out;
}

}  // namespace

void register_allocate(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string dump, output, method = "adakv", score = "snapkv";
    EvictionRequest req;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "allocate",
      "Per-KV-head token budgets from importance scores (the dump's window queries): uniform, "
      "adakv (Ada-KV, per layer), waterfill (greedy marginal utility), pyramid (PyramidKV), "
      "adakv-pyramid, adakv-global (Ada-KV across all heads of all layers). Prints a per-layer "
      "table; -o writes the budgets file (format akv-budgets v1) for `akv compress --budgets`. "
      "See docs/eviction.md.");
  sub->add_option("dump", opt->dump, "Input dump (akv-dump)")->required();
  sub->add_option("-m,--method", opt->method,
                  "uniform | adakv | waterfill | pyramid | adakv-pyramid | adakv-global")
      ->capture_default_str();
  sub->add_option("--score", opt->score, "Token scores: snapkv | h2o | streamingllm")
      ->capture_default_str();
  add_eviction_flags(sub, opt->req, false);
  sub->add_option("-o,--output", opt->output, "Write the budgets file (JSON) here");
  sub->add_flag("--json", opt->json, "Print the budgets JSON on stdout instead of the table");
  sub->callback([opt, &global] {
    const EvictionParams p = resolve_allocation(opt->method, opt->score, opt->req);
    DumpReader dump(opt->dump);
    ProgressBar bar("allocate", !global.quiet);
    const EvictionPlan plan = plan_eviction(dump, p, global.threads, bar.callback());
    const nlohmann::json j = budgets_json(plan, dump, file_hash(opt->dump));
    if (!opt->output.empty()) write_text_file(opt->output, j.dump(2) + "\n");
    const std::string text = opt->json ? j.dump(2) + "\n" : render(j);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace akv::cli
