// akv compress DUMP -o CACHE --method M [...]; akv decompress CACHE -o DUMP.
#include <fmt/format.h>

#include <cstdio>

#include "akv/cache/compress.h"
#include "commands.h"
#include "eviction_flags.h"

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
    std::string dump, output;
    CompressRequest req;
    int bits = 0, bits_key = 0, bits_value = 0;
    std::string key_axis, value_axis;
    long long group = 0, residual = 0;
    double outlier_fraction = 0;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "compress",
      "Compress the K/V of a dump into a cache (format akv-cache v1), a layer at a time. "
      "Methods: none (f16 copy, the baseline), uniform (one bit width for K and V, per-token "
      "groups, no residual), kivi (keys per channel, values per token, the last R tokens in "
      "f16). Presets: kivi-2, kivi-4 (2/2, 4/4 bits), k4v2, k4v3 (4-bit keys, 2/3-bit values). "
      "Scales and zeros are f16. Eviction methods (snapkv, h2o, streamingllm, adakv, waterfill, "
      "pyramid, adakv-pyramid, adakv-global) keep per KV head its best tokens under --budget, "
      "then quantize what is kept with --quant. See docs/compress.md and docs/eviction.md.");
  sub->add_option("dump", opt->dump, "Input dump (akv-dump)")->required();
  sub->add_option("-o,--output", opt->output, "Output cache (HDF5)")->required();
  sub->add_option("-m,--method", opt->req.method,
                  "none | uniform | kivi | kivi-2 | kivi-4 | k4v2 | k4v3, or an eviction method: "
                  "snapkv | h2o | streamingllm | adakv | waterfill | pyramid | adakv-pyramid | "
                  "adakv-global | joint (tokens and bits per head under --budget as a byte "
                  "fraction of f16; needs --quant kivi), or the tiered cache: tiered | quality | "
                  "balanced | compact (docs/tiered.md; simulated over the dump's tokens, the "
                  "dump's window queries driving the importance scores; format version 2)")
      ->capture_default_str();
  add_optional(sub, "--quant", opt->req.quant,
               "With an eviction method: quantize the kept tokens with this method or preset "
               "(default none = f16); the bits/axis/group/residual flags apply to it");
  add_eviction_flags(sub, opt->req.eviction, true);
  TieredRequest& tr = opt->req.tiered;
  add_optional(sub, "--preset", tr.preset, "tiered: quality | balanced | compact | k4v2 | k4v3 (with -m tiered)");
  add_optional(sub, "--hot", tr.hot, "tiered: hot (f16) budget in tokens");
  add_optional(sub, "--warm", tr.warm, "tiered: warm budget in tokens (multiple of 32; default unlimited)");
  add_optional(sub, "--warm-bits-key", tr.warm_bits_key, "tiered: warm key bits (2, 3, 4, 8)");
  add_optional(sub, "--warm-bits-value", tr.warm_bits_value, "tiered: warm value bits (2, 3, 4, 8)");
  add_optional(sub, "--cold-bits", tr.cold_bits, "tiered: cold bits (2, 3, 4, 8; 16 = exact f16 copies on the host)");
  add_optional(sub, "--protect-first", tr.protect_first, "tiered: first positions kept hot (default 4)");
  add_optional(sub, "--protect-last", tr.protect_last, "tiered: last positions kept hot (default 32; compact 0)");
  add_optional(sub, "--anchors", tr.anchors, "tiered: most important older tokens kept hot (whole blocks)");
  add_optional(sub, "--decay", tr.decay, "tiered: importance decay per step in [0, 1] (default 0.95)");
  add_optional(sub, "--w-attn", tr.w_attn, "tiered: weight of the attention received (default 1)");
  add_optional(sub, "--w-recency", tr.w_recency, "tiered: weight of the recency bonus 1/(1+age) (default 0)");
  add_optional(sub, "--margin", tr.margin, "tiered: relative score margin a promotion needs (default 0.25)");
  add_optional(sub, "--demotion", tr.demotion, "tiered: importance (default) or fifo");
  auto* bits = sub->add_option("--bits", opt->bits,
                               "Bits for keys and values: 2, 3, 4 or 8 (uniform default 4, "
                               "kivi default 2)");
  auto* bk = sub->add_option("--bits-key", opt->bits_key, "Key bits (kivi)");
  auto* bv = sub->add_option("--bits-value", opt->bits_value, "Value bits (kivi)");
  auto* ka = sub->add_option("--key-axis", opt->key_axis,
                             "Key groups run along: channel (per-channel, G tokens of one channel; "
                             "kivi default) or token (G channels of one token; uniform default)");
  auto* va = sub->add_option("--value-axis", opt->value_axis,
                             "Value groups run along: token (default) or channel");
  auto* g = sub->add_option("--group", opt->group, "Group size G (default 32)");
  auto* r = sub->add_option("--residual", opt->residual,
                            "Residual window R: most recent tokens kept in f16 (kivi, default "
                            "128, a multiple of G)");
  auto* of = sub->add_option("--outlier-fraction", opt->outlier_fraction,
                             "Keep ceil(f * head_dim) key channels per head (largest variance) in "
                             "f16, in [0, 1) (default 0)");
  add_optional(sub, "--calibration", opt->req.calibration,
               "Per-head key/value bits from `akv calibrate -o calib.json` (kivi layout; "
               "replaces --bits)");
  sub->add_flag("--pre-rope", opt->req.pre_rope,
                "Quantize keys before RoPE (KVQuant; needs key_pre_rope in the dump); RoPE is "
                "applied after dequantization");
  sub->add_flag("--json", opt->json, "Print the memory report as JSON (schema in docs/compress.md)");
  sub->callback([opt, &global, bits, bk, bv, ka, va, g, r, of] {
    CompressRequest req = opt->req;
    if (bits->count()) req.bits = opt->bits;
    if (bk->count()) req.bits_key = opt->bits_key;
    if (bv->count()) req.bits_value = opt->bits_value;
    if (ka->count()) req.key_axis = opt->key_axis;
    if (va->count()) req.value_axis = opt->value_axis;
    if (g->count()) req.group = opt->group;
    if (r->count()) req.residual = opt->residual;
    if (of->count()) req.outlier_fraction = opt->outlier_fraction;
    const CompressParams params = resolve_params(req);
    ProgressBar bar("compress", !global.quiet);
    const MemoryReport report =
        compress_dump(opt->dump, opt->output, params, global.threads, bar.callback());
    if (opt->json) {
      nlohmann::json j = report.to_json();
      j["file"] = opt->output;
      std::fputs((j.dump(2) + "\n").c_str(), stdout);
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
    ProgressBar bar("decompress", !global.quiet);
    decompress_cache(opt->cache, opt->output, opt->source, parse_dtype(opt->dtype), global.threads,
                     bar.callback());
    std::printf("wrote %s\n", opt->output.c_str());
  });
}

}  // namespace akv::cli
