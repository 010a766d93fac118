#pragma once
// llama.cpp's KV cache types as an akv method (`ggml:k=T:v=T`, kv/ggml_cache.h): every
// token's K and V rows of every head stored as ggml blocks of the type (-ctk / -ctv), as
// llama.cpp's cache stores them; no residual window, no eviction.
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/tensor/ggml_blocks.h"

namespace akv {

struct GgmlCacheParams {
  std::string key = "f16", value = "f16";  // ggml_cache_type_names() (llama.cpp's names)

  nlohmann::json to_json() const { return {{"k", key}, {"v", value}}; }
  static GgmlCacheParams from_json(const nlohmann::json& j, const std::string& file);
};

// llama.cpp's cache type names akv stores: f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl.
const std::vector<std::string>& ggml_cache_type_names();

// The block layout of a cache type name ("q4_0" -> Q4_0); InvalidInput naming `field` otherwise.
const GgmlTypeInfo& ggml_cache_type(const std::string& name, const std::string& file, const std::string& field);

// InvalidInput naming `file` and `field` unless head_dim holds whole blocks of `type`.
void check_ggml_head_dim(const GgmlTypeInfo& type, std::size_t head_dim, const std::string& file,
                         const std::string& field);

}  // namespace akv
