// akv allocate DUMP --method M --budget B [-o budgets.json]: per-head token budgets.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "akv/alloc/budgets_file.h"
#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"
#include "akv/kv/joint.h"
#include "akv/method/params.h"
#include "commands.h"
#include "method_flags.h"

namespace akv::cli {
namespace {

std::string render(const nlohmann::json& j) {
  const auto& s = j["summary"];
  std::string out = fmt::format(
      "{} allocation ({} scores{}), {} tokens per KV head on average ({} always kept): {} tokens "
      "= {:.4f} of the cache; retained window attention mass mean {:.4f}, min {:.4f}\n",
      s["params"]["alloc"].get<std::string>(), s["params"]["score"].get<std::string>(),
      s["params"].value("critical", false) ? ", CriticalKV" : "",
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

std::string render_joint(const nlohmann::json& j) {
  const auto& jt = j["joint"];
  std::string out = fmt::format(
      "joint allocation: budget {:.0f} bytes ({:.3f} of f16), predicted {} bytes, predicted "
      "attention output error {:.4g}; {} tokens kept ({:.3f} of the cache)\n",
      jt["bytes_budget"].get<double>(), jt["bytes_fraction"].get<double>(), jt["predicted_bytes"].get<std::uint64_t>(),
      jt["predicted_error"].get<double>(), j["summary"]["total_tokens"].get<std::size_t>(),
      j["summary"]["fraction"].get<double>());
  const bool rotated = jt.contains("rotate");  // each head's rotation, a column
  // A tensor's storage: its bits (f16 for 16) or, at bits 0, its cache type.
  auto storage = [](const nlohmann::json& h, const char* bits, const char* type) {
    const int b = h[bits].get<int>();
    return b == 0 ? h[type].get<std::string>() : b == 16 ? std::string("f16") : std::to_string(b);
  };
  std::size_t w = 5;
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) {
      w = std::max({w, storage(h, "key_bits", "key_type").size(), storage(h, "value_bits", "value_type").size()});
    }
  }
  out += fmt::format("{:>5} {:>4} {:>7} {:>{}} {:>{}} {}{:>10} {:>10}  {}\n", "layer", "head", "tokens", "K", w, "V", w,
                     rotated ? fmt::format("{:>8} ", "rotate") : "", "bytes", "error", "kind");
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) {
      out += fmt::format("{:>5} {:>4} {:>7} {:>{}} {:>{}} {}{:>10} {:>10.4g}  {}\n", l["layer"].get<int>(),
                         h["head"].get<int>(), h["tokens"].get<std::size_t>(), storage(h, "key_bits", "key_type"), w,
                         storage(h, "value_bits", "value_type"), w,
                         rotated ? fmt::format("{:>8} ", h.value("rotate", "none")) : "", h["bytes"].get<std::uint64_t>(),
                         h["predicted_error"].get<double>(), h.value("kind", "-"));
    }
  }
  return out;
}

}  // namespace

void register_allocate(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string dump, output, method = "adakv", score = "snapkv";
    CompressRequest req;  // its eviction flags
    bool json = false;
    JointOptions joint;
    bool no_f16 = false;
    bool bytes_given = false;
    std::string rule = "kivi";
    std::string rotate;  // joint: the candidates' rotation
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "allocate",
      "Per-KV-head token budgets (or tokens x bits) from a dump's window attention\n"
      "Per-KV-head token budgets from importance scores (the dump's window queries): uniform, "
      "adakv (Ada-KV, per layer), waterfill (greedy marginal utility), pyramid (PyramidKV), "
      "adakv-pyramid, adakv-global (Ada-KV across all heads of all layers), joint (tokens and "
      "key/value bits per head together under one byte budget, from measured errors). Prints a per-layer "
      "table; -o writes the budgets file (format akv-budgets v1) for `akv compress --budgets`. "
      "See docs/eviction.md.");
  sub->add_option("dump", opt->dump, "Input dump (akv-dump)")->required();
  sub->add_option("-m,--method", opt->method, alloc_method_list(" | ") + " | joint")
      ->capture_default_str();
  sub->add_option("--score", opt->score, "Token scores: " + score_method_list(" | "))
      ->capture_default_str();
  add_method_flags(sub, opt->req, {ParamScope::eviction}, {"quant", "budgets", "score"});
  sub->add_option_function<double>(
      "--bytes", [opt](double v) { opt->joint.bytes_fraction = v; opt->bytes_given = true; },
      "joint: byte budget as a fraction of the f16 size of K and V (all stored bytes counted)");
  sub->add_option("--bits", opt->joint.bits, "joint: candidate key/value bit widths")->delimiter(',')
      ->capture_default_str();
  sub->add_option("--keep", opt->joint.keep, "joint: candidate fractions of tokens kept per head")
      ->delimiter(',')->capture_default_str();
  sub->add_flag("--no-f16", opt->no_f16, "joint: do not offer unquantized (f16) kept tokens");
  sub->add_option("--group-size", opt->joint.group, "joint: quantization group size")->capture_default_str();
  sub->add_option("--residual", opt->joint.residual, "joint: f16 residual window of recent tokens")
      ->capture_default_str();
  sub->add_option("--quant-rule", opt->rule,
                  "joint: quantization rule, kivi (as KIVI's code) or bounded (every value within "
                  "scale/2); see docs/compress.md")
      ->capture_default_str()->check(CLI::IsMember({"kivi", "bounded"}));
  sub->add_option("--rotate", opt->rotate,
                  "joint: the candidates' rotation, none, hadamard or random (seed 0; docs/compress.md); with "
                  "--rotate-choice on each head also chooses it or none")
      ->check(CLI::IsMember({"none", "hadamard", "random"}));
  sub->add_option("-o,--output", opt->output, "Write the budgets file (JSON) here");
  sub->add_flag("--json", opt->json, "Print the budgets JSON on stdout instead of the table");
  sub->callback([opt, &global] {
    check_output_distinct(opt->output, {opt->dump, opt->req.eviction.qfilters.value_or(""),
                                        opt->req.eviction.duo_heads.value_or("")});
    if (opt->method == "joint") {
      if (!opt->bytes_given) throw UsageError("joint needs --bytes", {"", "--bytes"});
      JointOptions jo = opt->joint;
      jo.f16_option = !opt->no_f16;
      jo.rule = parse_quant_rule(opt->rule);
      jo.threads = global.threads;
      if (!opt->rotate.empty()) jo.rotate = parse_rotation(opt->rotate);
      jo.rotate_choice = opt->req.eviction.rotate_choice.value_or("off") == "on";
      if (opt->req.eviction.cache_types) jo.types = parse_cache_types(*opt->req.eviction.cache_types, '/', "--cache-types");
      if (opt->req.eviction.window) jo.window = static_cast<std::size_t>(*opt->req.eviction.window);
      ProgressBar bar("allocate", !global.quiet);
      const nlohmann::json j = allocate_joint(opt->dump, jo, bar.callback());
      if (!opt->output.empty()) write_text_file(opt->output, json_text(j));
      std::fputs((opt->json ? json_text(j) : render_joint(j)).c_str(), stdout);
      return;
    }
    if (opt->bytes_given) throw UsageError("--bytes is for --method joint", {"", "--bytes"});
    if (!opt->rotate.empty()) throw UsageError("--rotate is for --method joint", {"", "--rotate", opt->rotate});
    if (opt->req.eviction.rotate_choice) {
      throw UsageError("--rotate-choice is for --method joint", {"", "--rotate-choice", *opt->req.eviction.rotate_choice});
    }
    if (opt->req.eviction.cache_types) {
      throw UsageError("--cache-types is for --method joint", {"", "--cache-types", *opt->req.eviction.cache_types});
    }
    const EvictionParams p = resolve_allocation(opt->method, opt->score, opt->req.eviction);
    DumpReader dump(opt->dump);
    ProgressBar bar("allocate", !global.quiet);
    const EvictionPlan plan = plan_eviction(dump, p, global.threads, bar.callback());
    const nlohmann::json j = budgets_json(plan, dump, file_hash(opt->dump));
    if (!opt->output.empty()) write_text_file(opt->output, json_text(j));
    const std::string text = opt->json ? json_text(j) : render(j);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace akv::cli
