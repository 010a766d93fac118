// akv info FILE [--json] [--stats]: what an akv file (dump or cache) holds.
#include <cstdio>

#include "akv/core/errors.h"
#include "akv/io/inspect.h"
#include "akv/io/json_file.h"
#include "akv/kv/inspect_cache.h"
#include "akv/model/gguf.h"
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
      "info", "Describe a dump, a cache or a GGUF model\n"
              "GGUF: version, architecture, tokenizer kind, "
              "tensors by type (count, bytes), scalar metadata (arrays as their length). Dump: format version, model meta, per-layer shapes and "
              "dtypes, bytes on disk, optional datasets. Cache: method and parameters, source "
              "dump and its hash, bytes stored per component (codes, scales, zeros, residual, "
              "outliers, indices) per layer and in total, bits per element, ratio to f16");
  sub->add_option("file", opt->file, "akv file (HDF5) or GGUF model")->required();
  sub->add_flag("--json", opt->json, "Print JSON (schema in docs/formats.md)");
  sub->add_flag("--stats", opt->stats,
                "Dumps only: read every tensor (a head at a time; NaN/Inf are errors) and add "
                "per-layer min/max/mean/std/absmax and the key outlier-channel ratio");
  sub->callback([opt] {
    nlohmann::json info;
    std::string text;
    if (is_gguf(opt->file)) {
      if (opt->stats) throw UsageError("--stats applies to dumps", {opt->file, "--stats"});
      info = gguf_info(GgufFile(opt->file));
      text = opt->json ? json_text(info) : render_gguf_info(info);
    } else if (read_file_format(opt->file) == "akv-cache") {
      if (opt->stats) throw UsageError("--stats applies to dumps", {opt->file, "--stats"});
      info = inspect_cache(opt->file);
      text = opt->json ? json_text(info) : render_cache_info(info);
    } else {
      info = inspect_file(opt->file, opt->stats);
      text = opt->json ? json_text(info) : render_info(info);
    }
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace akv::cli
