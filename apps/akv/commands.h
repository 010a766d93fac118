#pragma once
// Subcommand registration. Each cmd_*.cpp parses its flags into an options struct, calls one
// library function and prints; no algorithms live in apps/.
#include <CLI/CLI.hpp>

#include <sstream>
#include <string>

namespace akv::cli {

// Options shared by every subcommand (accepted before or after the subcommand name).
struct GlobalOptions {
  bool quiet = false;  // no progress bar
  int threads = 1;     // resolved by main: -t 0 (the default) = all hardware threads
};

// The value of --shard: the library's parse_shard checks "K/N"; an empty value, which the
// commands would take as "no shard" and answer with a full report, is refused here (exit 2).
inline const CLI::Validator kShardText(
    [](std::string& s) { return s.empty() ? std::string("an empty shard (expected K/N)") : std::string(); }, "K/N");

// Help lists name each subcommand with the first line of its description (a one-line summary);
// `akv CMD --help` prints the whole description.
class SummaryFormatter : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string& d = sub->get_description();
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), d.substr(0, d.find('\n')), column_width_);
    return out.str();
  }
};

void register_info(CLI::App& app, const GlobalOptions& global);
void register_synth(CLI::App& app, const GlobalOptions& global);
void register_compress(CLI::App& app, const GlobalOptions& global);
void register_decompress(CLI::App& app, const GlobalOptions& global);
void register_evaluate(CLI::App& app, const GlobalOptions& global);
void register_bench(CLI::App& app, const GlobalOptions& global);
void register_bench_policy(CLI::App* bench, const GlobalOptions& global);  // under `akv bench`
void register_bench_decode(CLI::App* bench, const GlobalOptions& global);  // under `akv bench`
void register_allocate(CLI::App& app, const GlobalOptions& global);
void register_dump(CLI::App& app, const GlobalOptions& global);
void register_calibrate(CLI::App& app, const GlobalOptions& global);
void register_plan(CLI::App& app, const GlobalOptions& global);
void register_merge(CLI::App& app, const GlobalOptions& global);

}  // namespace akv::cli
