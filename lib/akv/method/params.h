#pragma once
// Compression methods and their parameters (what `akv compress` is told, and what a cache file
// records). See docs/compress.md.
//
//   none, uniform, kivi, nuq: the quantizers (quant/quant_params.h).
// Presets: kivi-2, kivi-4 (kivi with 2/2 or 4/4 bits), k4v2, k4v3 (kivi, 4-bit keys, 2/3-bit values).
//   tiered   hot f16 / warm quantized / cold int2 tiers with importance-scored migration, in the
//            model's decode loop (kv/tiered.h); presets quality, balanced, compact
//            (tiered:preset=k4v2 etc.: a kivi preset's widths in the warm tier, 128 hot tokens).
//   ggml     llama.cpp's KV cache types (k=, v=: f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), in the
//            model's decode loop (kv/ggml_cache.h).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/method/eviction_params.h"
#include "akv/method/registry.h"
#include "akv/method/ggml_params.h"
#include "akv/method/request.h"
#include "akv/method/tiered_params.h"
#include "akv/quant/quant_params.h"

namespace akv {

// What a method does besides quantizing: nothing, evict first (then quantize what is kept), or
// run the tiered cache (whose warm tier's quantizer is the QuantParams). One at a time.
struct QuantizeOnly {};
using MethodMode = std::variant<QuantizeOnly, EvictionParams, TieredParams, GgmlCacheParams>;

// The quantizer's parameters (QuantParams) and what else a cache method is told.
struct CompressParams : QuantParams {
  std::string preset;  // preset name when one was used, else empty
  MethodMode mode;
  // Per-head bits from a calibration or a joint plan ([layer * n_kv_heads + head] = {key bits,
  // value bits}, 16 = the head stays f16, as the files store it); empty = key.bits / value.bits
  // for every head.
  std::vector<std::pair<int, int>> head_bits;
  // Per-head rotation of a joint plan that chose it (rotate-choice=on; [layer * n_kv_heads +
  // head], beside head_bits); empty = `rotate` for every head.
  std::vector<RotationKind> head_rotate;
  // Per-head cache types of a joint plan that offered them (joint types=; [layer * n_kv_heads +
  // head] {key type, value type}, beside head_bits): a tensor with a type (parse_head_type) is
  // stored as its blocks and has bits 0 in head_bits; "" = the kivi codes of its bits. Empty =
  // no head has a type.
  std::vector<std::pair<std::string, std::string>> head_tensor_types;
  std::string calibration_file;
  // nuq: the calibration file holding its codebooks (calibration=), and the codebooks read from
  // it for the shape at hand (the runtime cache reads them; for_head gives each head its tables).
  std::string codebook_file;
  std::shared_ptr<const NuqCodebooks> codebooks;

  const EvictionParams* eviction() const { return std::get_if<EvictionParams>(&mode); }
  const TieredParams* tiered() const { return std::get_if<TieredParams>(&mode); }
  const GgmlCacheParams* ggml() const { return std::get_if<GgmlCacheParams>(&mode); }

  // The files the method reads when it runs (calibration=, budgets=), for the check that no
  // output replaces one.
  std::vector<std::string> input_files() const;

  // The parameters of one head (its calibrated bits when there are any).
  CompressParams for_head(std::size_t layer, std::size_t head, std::size_t n_kv_heads) const;

  nlohmann::json to_json() const;
  static CompressParams from_json(const nlohmann::json& j, const std::string& file);
};

// Short description for tables, e.g. "adakv/snapkv 0.2 + kivi K4/V2 R128".
std::string describe(const CompressParams& p);

// Resolves a request into parameters: method defaults (kivi: 2/2 bits, K channel / V token,
// G 32, R 128; uniform: 4 bits, token/token, G 32, R 0), then presets, then explicit flags.
// Throws UsageError for a flag the method cannot use (e.g. --residual with uniform, bits with
// none, --bits-key with a preset that fixes it) and InvalidInput (exit 2) for out-of-range
// values: bits not in {2,3,4,8}, G = 0, R not a multiple of G, outlier fraction outside [0, 1).
CompressParams resolve_params(const CompressRequest& r);

// A method spec (method/registry.h) resolved; nullopt for the reference (kFullMethod, the
// registry's row of kind reference).
std::optional<CompressParams> resolve_method_spec(const std::string& spec);
// The same where nuq may come without calibration= (codebook_file empty: no codebooks to read):
// for byte counts (akv plan, akv info: KVQuant's defaults, sparsity 0.99 and one f16 sink) and
// for callers that fit the codebooks themselves (bench policy).
std::optional<CompressParams> resolve_method_spec_for_bytes(const std::string& spec);

// Eviction parameters for `akv allocate`: allocator and score method by name, then flags.
EvictionParams resolve_allocation(const std::string& alloc, const std::string& score,
                                  const EvictionRequest& r);

// Checks parameters read from a file or built by a library caller (same rules as above).
void validate_params(const CompressParams& p, const std::string& file);

}  // namespace akv
