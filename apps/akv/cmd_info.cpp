// akv info FILE [--json] [--stats]: what an akv file (dump or cache) holds.
#include <cstdio>
#include <filesystem>

#include "akv/core/errors.h"
#include "akv/io/inspect.h"
#include "akv/io/json_file.h"
#include "akv/kv/inspect_cache.h"
#include "akv/model/gguf.h"
#include "akv/model/llama2c.h"
#include "akv/plan/model_info.h"
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
      "info", "Describe a dump, a cache or a model (GGUF file, Hugging Face directory or llama2.c .bin)\n"
              "Model: whether akv runs its architecture (else the feature akv lacks), shape, attention per layer, "
              "RoPE, trained context, weight bytes, KV bytes per token of a few methods (as akv plan counts them); "
              "a GGUF file adds version, tokenizer kind, "
              "tensors by type (count, bytes), scalar metadata (arrays as their length). Dump: format version, model meta, per-layer shapes and "
              "dtypes, bytes on disk, optional datasets. Cache: method and parameters, source "
              "dump and its hash, bytes stored per component (codes, scales, zeros, residual, "
              "outliers, indices) per layer and in total, bits per element, ratio to f16");
  sub->add_option("file", opt->file, "akv file (HDF5), GGUF model, model directory or llama2.c .bin")->required();
  sub->add_flag("--json", opt->json, "Print JSON (schema in docs/formats.md)");
  sub->add_flag("--stats", opt->stats,
                "Dumps only: read every tensor (a head at a time; NaN/Inf are errors) and add "
                "per-layer min/max/mean/std/absmax and the key outlier-channel ratio");
  sub->callback([opt] {
    nlohmann::json info;
    std::string text;
    if (is_gguf(opt->file) || std::filesystem::is_directory(opt->file) || is_llama2c_path(opt->file)) {
      if (opt->stats) throw UsageError("--stats applies to dumps", {opt->file, "--stats"});
      // A model: the GGUF file's own description, then what akv will do with the model.
      const nlohmann::json model = model_info(opt->file);
      if (is_gguf(opt->file)) {
        info = gguf_info(GgufFile(opt->file));
        info["akv"] = model;
        text = opt->json ? json_text(info) : render_gguf_info(info) + "\n" + render_model_info(model);
      } else {
        info = model;
        text = opt->json ? json_text(info) : render_model_info(model);
      }
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
