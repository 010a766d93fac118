#include <cstdio>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include <fmt/format.h>

#include "akv/bench/bench_shard.h"
#include "akv/bench/decode_bench.h"
#include "akv/eval/calibrate_shard.h"
#include "akv/eval/fidelity.h"
#include "akv/eval/model_parts.h"
#include "akv/io/inspect.h"
#include "akv/io/json_file.h"
#include "akv/kv/compress.h"
#include "commands.h"

namespace akv::cli {

void register_merge(CLI::App& app, const GlobalOptions&) {
  struct Options {
    std::vector<std::string> parts;
    std::string output = "-";
    bool json = false, csv = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "merge",
      "Combine the parts of a sharded run into the unsharded run's output\n"
      "Combines the partial outputs of a sharded run into what the unsharded run writes: "
      "`akv evaluate --model ... --shard K/N` parts (akv-perplexity-part; with --task passkey: "
      "akv-passkey-part, with --task ruler: akv-ruler-part) into its report, "
      "`akv evaluate --dump D --cache C --shard K/N` parts (akv-fidelity-part) into the fidelity report, "
      "`akv bench attention|quant|policy|decode ... --shard K/N` parts (akv-bench-part, "
      "akv-bench-decode-part) into the suite's "
      "report (rows in the unsharded order, each with its shard; ratios are against each shard's own "
      "baselines), `akv calibrate ... --shard K/N` parts (akv-calibration-part) into calib.json (the allocation "
      "runs here, over every head; the dumps must be readable), `akv compress ... --shard K/N` partial "
      "caches (akv-cache-part) into the cache (-o needed; the memory report as compress prints it, "
      "--json as compress --json). Checks that the parts are shards "
      "1..N of one run, each once, with the same inputs and parameters (exit 2 naming the missing, "
      "duplicate or mismatched part), then adds the per-sequence sums in sequence order "
      "(docs/scale.md)");
  sub->add_option("parts", opt->parts, "Partial reports, in any order")->required();
  sub->add_option("-o,--output", opt->output, "Write the report here ('-' = stdout)")->capture_default_str();
  auto* json = sub->add_flag("--json", opt->json, "Print JSON (format akv-perplexity), as evaluate --json");
  sub->add_flag("--csv", opt->csv, "Print CSV, one row per sequence and method")->excludes(json);
  sub->callback([opt] {
    check_output_distinct(opt->output, opt->parts);
    if (is_hdf5(opt->parts.front())) {  // partial caches
      if (opt->output == "-") throw UsageError("merging partial caches needs -o CACHE", {"", "-o"});
      const MemoryReport r = merge_cache_parts(opt->parts, opt->output);
      std::string text = fmt::format("wrote {} ({}): {} bytes stored, {:.3f} bits/element\n", opt->output,
                                     describe(r.header.params), r.total.total(), r.bits_per_element());
      if (opt->json) {
        nlohmann::json j = r.to_json();
        j["format"] = "akv-compress";
        j["version"] = 1;
        j["file"] = opt->output;
        text = json_text(j);
      }
      std::fputs(text.c_str(), stdout);
      return;
    }
    const std::string format = read_json_format(opt->parts.front());
    if (format == "akv-bench-part") {
      std::vector<std::pair<std::string, nlohmann::ordered_json>> bench;
      for (const std::string& p : opt->parts) bench.emplace_back(p, read_ordered_json_file(p, "partial output", format, 1));
      const BenchReport r = merge_bench_parts(bench);
      write_text_file(opt->output, opt->json  ? json_text(r.to_json())
                                   : opt->csv ? r.to_csv()
                                              : r.to_table(bench_columns(r.suite())));
      return;
    }
    std::vector<std::pair<std::string, nlohmann::json>> parts;
    if (format != "akv-perplexity-part" && format != "akv-calibration-part" && format != "akv-fidelity-part" &&
        format != "akv-passkey-part" && format != "akv-ruler-part" && format != "akv-bench-decode-part") {
      throw InvalidInput("not a partial output (expected format akv-perplexity-part, akv-passkey-part, akv-ruler-part, "
                         "akv-fidelity-part, akv-calibration-part, akv-bench-part or akv-bench-decode-part)",
                         {opt->parts.front(), "format", format});
    }
    for (const std::string& p : opt->parts) parts.emplace_back(p, read_json_file(p, "partial output", format, 1));
    if (format == "akv-calibration-part") {
      const nlohmann::json j = merge_calibration_parts(parts);
      write_text_file(opt->output, opt->json || opt->output != "-" ? json_text(j) : render_calibration(j));
      return;
    }
    if (format == "akv-fidelity-part") {
      const FidelityReport r = merge_fidelity_parts(parts);
      write_text_file(opt->output, opt->json ? json_text(r.to_json()) : opt->csv ? r.to_csv() : r.to_table(false));
      return;
    }
    if (format == "akv-bench-decode-part") {
      const DecodeBenchResult r = merge_decode_parts(parts);
      write_text_file(opt->output, opt->json ? json_text(r.to_json()) : r.to_table());
      return;
    }
    // A model run's report carries the run's "context" (positions against the trained context),
    // which its parts carry.
    const auto with_context = [&](nlohmann::json j) {
      if (parts[0].second.contains("context")) j["context"] = parts[0].second.at("context");
      return json_text(j);
    };
    if (format == "akv-passkey-part") {
      const PasskeyReport r = merge_passkey_parts(parts);
      write_text_file(opt->output, opt->json ? with_context(r.to_json()) : r.to_table());
      return;
    }
    if (format == "akv-ruler-part") {
      const RulerReport r = merge_ruler_parts(parts);
      write_text_file(opt->output, opt->json ? with_context(r.to_json()) : opt->csv ? r.to_csv() : r.to_table());
      return;
    }
    const PplReport r = merge_ppl_parts(parts);
    write_text_file(opt->output, opt->json ? with_context(r.to_json()) : opt->csv ? r.to_csv() : r.to_table());
  });
}

}  // namespace akv::cli
