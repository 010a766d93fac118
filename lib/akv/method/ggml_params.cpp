#include "akv/method/ggml_params.h"

#include <algorithm>
#include <cctype>

#include "akv/core/errors.h"

namespace akv {

const std::vector<std::string>& ggml_cache_type_names() {
  static const std::vector<std::string> names = {"f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "fp8_e4m3", "fp8_e5m2"};
  return names;
}

const std::vector<std::string>& ggml_cache_type_words() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w = ggml_cache_type_names();
    w.insert(w.end(), {"e4m3", "e5m2"});
    return w;
  }();
  return words;
}

std::string ggml_cache_type_alias(const std::string& word) {
  return word == "e4m3" || word == "e5m2" ? "fp8_" + word : word;
}

const std::vector<std::string>& fp8_scale_names() {
  static const std::vector<std::string> names = {"head", "tensor", "one"};
  return names;
}

const GgmlTypeInfo& ggml_cache_type(const std::string& name, const std::string& file, const std::string& field) {
  // llama.cpp's lower-case names; ggml_blocks.h knows the types by their upper-case names.
  for (const std::string& t : ggml_cache_type_names()) {
    if (name != t) continue;
    std::string upper;
    for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return *ggml_type_info_by_name(upper);
  }
  throw InvalidInput("not a KV cache type akv stores (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, fp8_e4m3, fp8_e5m2)", {file, field, name});
}

void check_ggml_head_dim(const GgmlTypeInfo& type, std::size_t head_dim, const std::string& file,
                         const std::string& field) {
  if (head_dim % type.block != 0) {
    throw InvalidInput("head_dim must be a multiple of the cache type's block (" + std::to_string(type.block) + ")",
                       {file, field, std::to_string(head_dim)});
  }
}

GgmlCacheParams GgmlCacheParams::from_json(const nlohmann::json& j, const std::string& file) {
  GgmlCacheParams p;
  p.key = j.at("k").get<std::string>();
  p.value = j.at("v").get<std::string>();
  ggml_cache_type(p.key, file, "params.ggml.k");
  ggml_cache_type(p.value, file, "params.ggml.v");
  if (p.fp8()) {
    p.scale = j.at("scale").get<std::string>();
    const auto& names = fp8_scale_names();
    if (std::find(names.begin(), names.end(), p.scale) == names.end()) {
      throw InvalidInput("unknown fp8 scale rule (head, tensor, one)", {file, "params.ggml.scale", p.scale});
    }
    p.calibration = j.value("calibration", "");
  }
  return p;
}

}  // namespace akv
