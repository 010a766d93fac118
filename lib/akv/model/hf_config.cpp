#include "akv/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "akv/core/errors.h"

namespace akv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::size_t positive(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<long long>() <= 0) {
    throw InvalidInput("config needs a positive integer", {file, key, j.contains(key) ? j[key].dump() : "missing"});
  }
  return j[key].get<std::size_t>();
}

std::optional<std::size_t> optional_positive(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return positive(j, key, file);
}

template <class T>
T typed(const json& j, const char* key, T fallback, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  const bool ok = std::is_same_v<T, bool> ? v.is_boolean()
                  : std::is_same_v<T, std::string> ? v.is_string()
                                                     : v.is_number();
  if (!ok) throw InvalidInput("config field has the wrong type", {file, key, v.dump()});
  return v.get<T>();
}

}  // namespace

HfConfig read_hf_config(const std::string& path, const std::vector<std::string>& model_types) {
  std::error_code ec;
  HfConfig c;
  c.file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  const std::string& file = c.file;
  std::ifstream in(file);
  if (!in) throw IoError("cannot open model config", {file});
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData("config is not a JSON object", {file});
  c.name = typed<std::string>(j, "_name_or_path", "", file);
  c.model_type = typed<std::string>(j, "model_type", "", file);
  if (!model_types.empty() &&
      std::find(model_types.begin(), model_types.end(), c.model_type) == model_types.end()) {
    std::string names;
    for (const auto& t : model_types) names += (names.empty() ? "" : ", ") + t;
    throw InvalidInput("unsupported model_type (akv runs " + names + ")", {file, "model_type", c.model_type});
  }
  c.num_hidden_layers = positive(j, "num_hidden_layers", file);
  c.num_attention_heads = positive(j, "num_attention_heads", file);
  c.num_key_value_heads = optional_positive(j, "num_key_value_heads", file).value_or(c.num_attention_heads);
  c.hidden_size = positive(j, "hidden_size", file);
  c.head_dim = optional_positive(j, "head_dim", file).value_or(c.hidden_size / c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    throw InvalidInput("num_attention_heads must be a multiple of num_key_value_heads",
                       {file, "num_key_value_heads", std::to_string(c.num_key_value_heads)});
  }
  c.intermediate_size = positive(j, "intermediate_size", file);
  c.vocab_size = positive(j, "vocab_size", file);
  c.max_position_embeddings = optional_positive(j, "max_position_embeddings", file);
  c.sliding_window = optional_positive(j, "sliding_window", file);
  c.use_sliding_window = typed<bool>(j, "use_sliding_window", false, file);
  c.tie_word_embeddings = typed<bool>(j, "tie_word_embeddings", false, file);
  c.attention_bias = typed<bool>(j, "attention_bias", false, file);
  c.rope_theta = typed<double>(j, "rope_theta", 10000.0, file);
  c.rms_norm_eps = typed<double>(j, "rms_norm_eps", 1e-6, file);
  // A zero or negative eps or theta gives NaN activations, not an error, further on.
  if (!(c.rope_theta > 0 && std::isfinite(c.rope_theta))) {
    throw InvalidInput("rope_theta must be a positive number", {file, "rope_theta", j["rope_theta"].dump()});
  }
  if (!(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps))) {
    throw InvalidInput("rms_norm_eps must be a positive number", {file, "rms_norm_eps", j["rms_norm_eps"].dump()});
  }
  c.hidden_act = typed<std::string>(j, "hidden_act", "silu", file);
  c.torch_dtype = typed<std::string>(j, "torch_dtype", "", file);
  c.akv_tokenizer = typed<std::string>(j, "akv_tokenizer", "", file);
  if (j.contains("rope_scaling")) c.rope_scaling = j["rope_scaling"];
  return c;
}

}  // namespace akv
