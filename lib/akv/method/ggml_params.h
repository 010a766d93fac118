#pragma once
// llama.cpp's KV cache types as an akv method (`ggml:k=T:v=T`, kv/ggml_cache.h): every
// token's K and V rows of every head stored as ggml blocks of the type (-ctk / -ctv), as
// llama.cpp's cache stores them; no residual window, no eviction. Beside llama.cpp's types, the
// 8-bit floats of vLLM's fp8 KV cache (fp8_e4m3, fp8_e5m2; method `fp8:k=e4m3:v=e5m2` is ggml with
// these), each tensor with one f32 scale (`scale`, below).
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/quant/rotation.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv {

struct GgmlCacheParams {
  std::string key = "f16", value = "f16";  // ggml_cache_type_names() (llama.cpp's names)
  // fp8 tensors' scales: head (each KV head's K and V from the first rows it stores: the prompt),
  // tensor (one per layer's K and V, over its KV heads), one (1: vLLM's default without scales).
  std::string scale = "head";
  // fp8 scales from an `akv calibrate` file's per-head maxima (scale head or tensor) instead of
  // the prompt's rows; empty: from the rows.
  std::string calibration;
  // Boundary protection (vLLM's TurboQuant: kv_cache_dtype_skip_layers from
  // get_boundary_skip_layers): the first and last `boundary` layers (at most half of them each
  // side) keep f16 K and V rows; 0 = every layer stores k / v.
  std::size_t boundary = 0;
  // Per-head types (`ggml:types=calib.json`, an `akv calibrate --types` assignment; key and value
  // are then empty): `types` the file, head_types [layer * n_kv_heads + head] {key type, value
  // type} once read against a model's shape (kv/prompt_plan.h read_calibration_inputs). A head's
  // type may carry its own rotation (parse_head_type: "q4_0+hadamard").
  std::string types;
  std::vector<std::pair<std::string, std::string>> head_types;

  // Whether layer l of n_layers is a boundary layer, and the cache types head h of n_heads of a
  // layer stores.
  bool boundary_layer(std::size_t layer, std::size_t n_layers) const {
    const std::size_t n = std::min(boundary, n_layers / 2);
    return layer < n || layer >= n_layers - n;
  }
  const std::string& key_type(std::size_t layer, std::size_t head, std::size_t n_layers, std::size_t n_heads) const {
    if (boundary_layer(layer, n_layers)) return f16_name();
    return head_types.empty() ? key : head_types.at(layer * n_heads + head).first;
  }
  const std::string& value_type(std::size_t layer, std::size_t head, std::size_t n_layers, std::size_t n_heads) const {
    if (boundary_layer(layer, n_layers)) return f16_name();
    return head_types.empty() ? value : head_types.at(layer * n_heads + head).second;
  }
  static const std::string& f16_name() {
    static const std::string f16 = "f16";
    return f16;
  }

  // Whether some per-head type carries its own rotation (parse_head_type).
  bool rotates_heads() const {
    auto has = [](const std::string& t) { return t.find('+') != std::string::npos; };
    return std::any_of(head_types.begin(), head_types.end(), [&](const auto& t) { return has(t.first) || has(t.second); });
  }

  bool fp8() const {
    auto is = [](const std::string& t) { return t.rfind("fp8_", 0) == 0; };
    return is(key) || is(value) ||
           std::any_of(head_types.begin(), head_types.end(), [&](const auto& t) { return is(t.first) || is(t.second); });
  }
  // The scale field only when a type is fp8 (other caches' parameters are as before); per-head
  // types: the file and the types, no k / v.
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    if (types.empty()) {
      j["k"] = key;
      j["v"] = value;
    } else {
      j["types"] = types;
      if (!head_types.empty()) j["head_types"] = head_types;
    }
    if (fp8()) j["scale"] = scale;
    if (!calibration.empty()) j["calibration"] = calibration;
    if (boundary > 0) j["boundary"] = boundary;
    return j;
  }
  static GgmlCacheParams from_json(const nlohmann::json& j, const std::string& file);
};

// The cache type names akv stores: llama.cpp's f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl,
// vLLM's fp8_e4m3, fp8_e5m2, and vLLM's TurboQuant rows (tensor/turboquant.h): keys tq2, tq3, tq4
// (Lloyd-Max indices + norm), with norm correction tq2nc, tq3nc, tq4nc, values tqv2, tqv3, tqv4
// (uniform per row). A TurboQuant row is one block of head_dim values, so its layout depends on
// head_dim.
const std::vector<std::string>& ggml_cache_type_names();
// The names k= / v= accept: those, and e4m3 / e5m2 for the fp8 types (method fp8's spelling).
const std::vector<std::string>& ggml_cache_type_words();
// A k= / v= word as a cache type name: e4m3 -> fp8_e4m3, e5m2 -> fp8_e5m2, others unchanged.
std::string ggml_cache_type_alias(const std::string& word);
// The fp8 scale rules: head, tensor, one.
const std::vector<std::string>& fp8_scale_names();

// A per-head type of an `akv calibrate --types` assignment: a cache type name alone, rotated as
// the cache's rotate= says, or followed by "+hadamard" or "+random" (seed 0): that tensor
// rotated so whatever rotate= says, so that heads may differ (docs/calibrate.md).
struct HeadType {
  std::string name;                    // the cache type
  std::optional<RotationKind> rotate;  // the suffix's rotation; nullopt: the cache's
};
// InvalidInput naming `file` and `field` unless `text` is a cache type name with at most that
// suffix.
HeadType parse_head_type(const std::string& text, const std::string& file, const std::string& field);
// A list of such types separated by `sep` (joint's cache-types=, allocate --cache-types), each
// checked; InvalidInput naming `field` for an empty list, an empty entry or a repeated one.
std::vector<std::string> parse_cache_types(const std::string& text, char sep, const std::string& field);
// The block layout of a cache type name for rows of head_dim values ("q4_0" -> Q4_0, "tq3nc" at
// head_dim 128 -> TQ3NC_128); InvalidInput naming `field` otherwise (a TurboQuant type needs
// head_dim a power of two from 8 to 512).
const GgmlTypeInfo& ggml_cache_type(const std::string& name, std::size_t head_dim, const std::string& file,
                                    const std::string& field);

// InvalidInput naming `file` and `field` unless head_dim holds whole blocks of `type`.
void check_ggml_head_dim(const GgmlTypeInfo& type, std::size_t head_dim, const std::string& file,
                         const std::string& field);

}  // namespace akv
