// akv compress DUMP -o CACHE --method M [...]; akv decompress CACHE -o DUMP.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "akv/alloc/budgets_file.h"
#include "akv/core/atomic_file.h"
#include "akv/io/json_file.h"
#include "akv/kv/compress.h"
#include "commands.h"
#include "method_flags.h"

namespace akv::cli {
namespace {

std::string memory_line(const MemoryReport& r, const std::string& out) {
  const auto& p = r.header.params;
  std::string evict;
  if (!r.eviction.is_null()) {
    evict = fmt::format("kept {:.4f} of the tokens ({} of {} head-token slots), retained window "
                        "attention mass mean {:.4f} / min {:.4f}; ",
                        r.eviction["fraction"].get<double>(), r.eviction["total_tokens"].get<std::size_t>(),
                        r.elements / 2 / r.header.meta.head_dim,
                        r.eviction["retained_mass_mean"].get<double>(),
                        r.eviction["retained_mass_min"].get<double>());
  }
  return evict + fmt::format(
      "wrote {} ({}): {} bytes stored (codes {}, scales {}, zeros {}, residual {}, outliers {}, "
      "indices {}) = {:.3f} bits/element, {:.2f}x smaller than f16 ({} bytes)\n",
      out, describe(p), r.total.total(), r.total.codes,
      r.total.scales, r.total.zeros, r.total.residual, r.total.outliers, r.total.indices,
      r.bits_per_element(), r.ratio(), r.f16_bytes());
}

}  // namespace

void register_compress(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string dump, output, shard;
    CompressRequest req;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "compress",
      "Compress a dump's K/V into a cache: quantization, eviction, tiers, llama.cpp and fp8 types\n"
      "Compress the K/V of a dump into a cache (format akv-cache v1; v2 for tiered caches, v3 for "
      "llama.cpp's cache types, v4 for rotated rows, v5 for fp8, v6 for KVQuant nuq), a layer at a time. Quantizers: " + method_list({MethodKind::quantizer}) +
          "; presets: " + method_list({MethodKind::preset}) + " (scales and zeros are f16). Eviction methods (" +
          method_list({MethodKind::eviction, MethodKind::joint}) +
          ") keep per KV head its best tokens under --budget, then quantize what is kept with --quant. "
          "ggml --k T --v T stores every key and value row as llama.cpp's cache blocks of type T. "
          "See docs/compress.md, docs/eviction.md, docs/tiered.md and docs/model.md.");
  sub->add_option("dump", opt->dump, "Input dump (akv-dump)")->required();
  sub->add_option("-o,--output", opt->output, "Output cache (HDF5)")->required();
  std::string methods_help;
  for (const MethodInfo& m : method_registry()) {
    if (m.kind != MethodKind::reference) methods_help += (methods_help.empty() ? "" : "; ") + std::string(m.name) + ": " + m.help;
  }
  auto* method = sub->add_option("-m,--method", opt->req.method,
                                 "Method (default kivi; with --budgets alone, the budgets file's method), or a method "
                                 "spec as evaluate --methods takes it (name:flag=value..., e.g. "
                                 "ggml:k=q4_0:v=q4_0:rotate=hadamard): its flags join the command line's, and a flag "
                                 "given both ways is an error. " +
                                     methods_help + ". Tiered caches are simulated over the dump's tokens, "
                                     "its window queries driving the importance scores");
  add_method_flags(sub, opt->req, {ParamScope::quant, ParamScope::eviction, ParamScope::tiered, ParamScope::ggml});
  sub->add_flag("--json", opt->json, "Print the memory report as JSON (schema in docs/compress.md)");
  sub->add_option("--shard", opt->shard,
                  "Compress shard K of N (K/N, 1-based): a contiguous 1/N of the layers into a partial "
                  "cache (format akv-cache-part; eviction plans still span all layers); `akv merge` "
                  "writes the whole cache, byte for byte the unsharded one (docs/scale.md)")->check(kShardText);
  sub->callback([opt, &global, method] {
    CompressRequest req = opt->req;
    if (method->count() == 0 && req.eviction.budgets_file) req.method = budgets_method(*req.eviction.budgets_file);
    join_method_spec(req);
    const CompressParams params = resolve_params(req);
    std::vector<std::string> inputs = params.input_files();  // every file the method reads
    inputs.push_back(opt->dump);
    check_output_distinct(opt->output, inputs);
    ProgressBar bar("compress", !global.quiet);
    const MemoryReport report =
        compress_dump(opt->dump, opt->output, params, global.threads, bar.callback(),
                      opt->shard.empty() ? Shard{} : parse_shard(opt->shard));
    if (opt->json) {
      nlohmann::json j = report.to_json();
      j["format"] = "akv-compress";
      j["version"] = 1;
      j["file"] = opt->output;
      std::fputs(json_text(j).c_str(), stdout);
    } else {
      std::fputs(memory_line(report, opt->output).c_str(), stdout);
    }
  });
}

void register_decompress(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string cache, output, source, dtype = "f16";
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "decompress",
      "Rebuild a dense dump from a cache\n"
      "Rebuild a dense dump (akv-dump v1) from a cache: dequantized keys (after RoPE) and values; "
      "queries, tokens, needles and head kinds are copied from the source dump, which must match "
      "the cache's content hash. Evicted positions are written as zeros.");
  sub->add_option("cache", opt->cache, "Input cache (akv-cache)")->required();
  sub->add_option("-o,--output", opt->output, "Output dump (HDF5)")->required();
  sub->add_option("--dump", opt->source,
                  "Source dump (default: the path recorded in the cache)");
  sub->add_option("--dtype", opt->dtype, "Storage type: f16 or f32")->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}));
  sub->callback([opt, &global] {
    check_output_distinct(opt->output, {opt->cache, opt->source});
    ProgressBar bar("decompress", !global.quiet);
    decompress_cache(opt->cache, opt->output, opt->source, parse_dtype(opt->dtype), global.threads,
                     bar.callback());
    std::printf("wrote %s\n", opt->output.c_str());
  });
}

}  // namespace akv::cli
