// akv info FILE [--json]: what an akv file is, its version, shapes, dtypes and sizes.
#include <cstdio>

#include "akv/io/inspect.h"
#include "commands.h"

namespace akv::cli {

void register_info(CLI::App& app, const GlobalOptions&) {
  struct Options {
    std::string file;
    bool json = false;
    bool stats = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "info", "Describe an akv file (dump): format version, model meta, per-layer shapes and "
              "dtypes, bytes on disk, optional datasets");
  sub->add_option("file", opt->file, "akv file (HDF5)")->required();
  sub->add_flag("--json", opt->json, "Print JSON (schema in docs/formats.md)");
  sub->add_flag("--stats", opt->stats,
                "Read every tensor (a head at a time; NaN/Inf are errors) and add per-layer "
                "min/max/mean/std/absmax and the key outlier-channel ratio");
  sub->callback([opt] {
    nlohmann::json info = inspect_file(opt->file, opt->stats);
    std::string text = opt->json ? info.dump(2) + "\n" : render_info(info);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace akv::cli
