// akv allocate DUMP --method M --budget B [-o budgets.json]: per-head token budgets.
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
      "joint: the byte budget as a fraction of the f16 size of K and V (all stored bytes counted); with joint "
      "--budget F means the same, as in compress -m joint");
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
  sub->add_option("-o,--output", opt->output,
                  "Write the budgets file (JSON) here (- or /dev/stdout = stdout: the JSON alone, without the table, for a pipe "
                  "into `akv compress --budgets -`)");
  sub->add_flag("--json", opt->json, "Print the budgets JSON on stdout instead of the table");
  sub->callback([opt, &global] {
    check_output_distinct(opt->output, {opt->dump, opt->req.eviction.qfilters.value_or(""),
                                        opt->req.eviction.surrogate.value_or(""),
                                        opt->req.eviction.duo_heads.value_or("")});
    if (opt->method == "joint") {
      const std::optional<double>& budget = opt->req.eviction.budget;
      if (opt->bytes_given == budget.has_value()) {
        throw UsageError("joint takes its byte budget as --budget F (a fraction of the f16 size of K and V, all "
                         "stored bytes counted) or --bytes F, one of them",
                         opt->bytes_given ? Where{"", "given", "--budget and --bytes"} : Where{"", "--budget"});
      }
      if (const auto& tokens = opt->req.eviction.budget_tokens) {
        throw UsageError("joint takes a byte budget, not a token count", {"", "--budget-tokens", std::to_string(*tokens)});
      }
      JointOptions jo = opt->joint;
      if (budget) jo.bytes_fraction = *budget;
      jo.f16_option = !opt->no_f16;
      jo.rule = parse_quant_rule(opt->rule);
      jo.threads = global.threads;
      if (!opt->rotate.empty()) jo.rotate = parse_rotation(opt->rotate);
      jo.rotate_choice = opt->req.eviction.rotate_choice.value_or("off") == "on";
      if (opt->req.eviction.cache_types) jo.types = parse_cache_types(*opt->req.eviction.cache_types, '/', "--cache-types");
      if (opt->req.eviction.window) jo.window = static_cast<std::size_t>(*opt->req.eviction.window);
      ProgressBar bar("allocate", !global.quiet);
      const nlohmann::json j = allocate_joint(opt->dump, jo, bar.callback());
      const bool json_alone = names_stdout(opt->output);  // before the write replaces a redirected file
      if (!opt->output.empty()) write_text_file(opt->output, json_text(j));
      if (json_alone) return;
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
    const bool json_alone = names_stdout(opt->output);  // before the write replaces a redirected file
    if (!opt->output.empty()) write_text_file(opt->output, json_text(j));
    if (json_alone) return;
    const std::string text = opt->json ? json_text(j) : render_budgets(j);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace akv::cli
