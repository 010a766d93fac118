// akv evaluate --dump DUMP --cache CACHE [--json | --csv]: fidelity of a compressed cache.
#include <cstdio>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/eval/fidelity.h"
#include "commands.h"

namespace akv::cli {

void register_evaluate(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string dump, cache, output = "-";
    bool json = false, csv = false, per_head = false, no_verify = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "evaluate",
      "Fidelity of a compressed cache against its source dump, per layer and KV head, using the "
      "dump's window queries (each query head reads its KV head; causal): key and value "
      "relative MSE, attention output relative error ||o - o^|| / ||o||, KL(p || p^) of the "
      "attention distributions, top-k recall (k = 1, 8, 32) of the original attention's top "
      "tokens. Definitions in docs/evaluate.md.");
  sub->add_option("--dump", opt->dump, "Source dump (akv-dump)")->required();
  sub->add_option("--cache", opt->cache, "Compressed cache (akv-cache)")->required();
  auto* json = sub->add_flag("--json", opt->json, "Print JSON: overall, per layer, per head");
  sub->add_flag("--csv", opt->csv, "Print CSV, one row per layer and KV head")->excludes(json);
  sub->add_flag("--per-head", opt->per_head, "Table: also one row per KV head");
  sub->add_option("-o,--output", opt->output, "Write the report to this file ('-' = stdout)")
      ->capture_default_str();
  sub->add_flag("--no-verify-hash", opt->no_verify,
                "Skip the content-hash check that the cache was made from this dump (shapes are "
                "still checked)");
  sub->callback([opt, &global] {
    ProgressBar bar("evaluate", !global.quiet);
    const FidelityReport r =
        evaluate_cache(opt->dump, opt->cache, global.threads, !opt->no_verify, bar.callback());
    std::string text;
    if (opt->json) {
      text = r.to_json().dump(2) + "\n";
    } else if (opt->csv) {
      text = r.to_csv();
    } else {
      text = r.to_table(opt->per_head);
    }
    write_text_file(opt->output, text);
  });
}

}  // namespace akv::cli
