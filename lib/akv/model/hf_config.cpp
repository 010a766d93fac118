#include "akv/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/model/architecture.h"

namespace akv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Whether j has `key` and it is not null (transformers reads null as None: the default).
bool given(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

std::size_t positive(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<long long>() <= 0) {
    throw InvalidInput("config needs a positive integer", {file, key, j.contains(key) ? j[key].dump() : "missing"});
  }
  return j[key].get<std::size_t>();
}

std::optional<std::size_t> optional_positive(const json& j, const char* key, const std::string& file) {
  if (!given(j, key)) return std::nullopt;
  return positive(j, key, file);
}

template <class T>
T typed(const json& j, const char* key, T fallback, const std::string& file) {
  if (!given(j, key)) return fallback;
  const json& v = j[key];
  const bool ok = std::is_same_v<T, bool> ? v.is_boolean()
                  : std::is_same_v<T, std::string> ? v.is_string()
                                                     : v.is_number();
  if (!ok) throw InvalidInput("config field has the wrong type", {file, key, v.dump()});
  return v.get<T>();
}

std::optional<double> optional_positive_real(const json& j, const char* key, const std::string& file) {
  if (!given(j, key)) return std::nullopt;
  const double v = typed<double>(j, key, 0.0, file);
  if (!(v > 0 && std::isfinite(v))) throw InvalidInput("config field must be a positive number", {file, key, j[key].dump()});
  return v;
}

// A soft-capping field: absent (the model's default applies), null (0: none, as transformers reads
// None) or a positive number.
std::optional<double> optional_cap(const json& j, const char* key, const std::string& file) {
  if (j.contains(key) && j[key].is_null()) return 0.0;
  return optional_positive_real(j, key, file);
}

// rope_scaling: {"rope_type" (or "type"): default | linear | dynamic | llama3 | yarn, "factor", ...}.
// longrope's factor lists: rotary_dim / 2 positive finite numbers.
std::vector<float> factor_list(const json& r, const char* key, std::size_t n, const std::string& file) {
  const std::string field = std::string("rope_scaling.") + key;
  if (!r.contains(key) || !r[key].is_array()) {
    throw InvalidInput("longrope needs a list of factors", {file, field, r.contains(key) ? r[key].dump() : "missing"});
  }
  const json& a = r[key];
  if (a.size() != n) {
    throw InvalidInput("longrope factors must number rotary_dim / 2 = " + std::to_string(n), {file, field, std::to_string(a.size())});
  }
  std::vector<float> out;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = a[i].is_number() ? a[i].get<double>() : NAN;
    if (!(v > 0.0) || !std::isfinite(v)) {
      throw InvalidInput("longrope factors must be positive numbers", {file, field + "[" + std::to_string(i) + "]", a[i].dump()});
    }
    out.push_back(static_cast<float>(v));  // torch.tensor(..., dtype=torch.float32)
  }
  return out;
}

// rope_scaling.<key> as a number >= lo (> lo when lo_open).
double rope_number(const json& r, const std::string& file, const char* key, double lo, bool lo_open) {
  const std::string field = std::string("rope_scaling.") + key;
  if (!r.contains(key) || !r[key].is_number()) {
    throw InvalidInput("rope_scaling needs a number", {file, field, r.contains(key) ? r[key].dump() : "missing"});
  }
  const double v = r[key].get<double>();
  if (!std::isfinite(v) || v < lo || (lo_open && v == lo)) {
    throw InvalidInput(std::string("rope_scaling value must be ") + (lo_open ? "> " : ">= ") + format_number(lo),
                       {file, field, r[key].dump()});
  }
  return v;
}

// The type named by "rope_type" (or the older "type") is linear, dynamic or llama3: s's fields.
void simple_rope_scaling(const json& r, const HfConfig& c, const std::string& type, RopeScaling& s) {
  const std::string& file = c.file;
  if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
    s.factor = rope_number(r, file, "factor", 0.0, true);
  } else if (type == "dynamic") {
    s.kind = RopeScaling::Kind::dynamic;
    s.factor = rope_number(r, file, "factor", 1.0, false);
    if (!c.max_position_embeddings) {
      throw InvalidInput("dynamic rope_scaling needs max_position_embeddings", {file, "max_position_embeddings", "missing"});
    }
    s.original_max_positions = *c.max_position_embeddings;
  } else {
    s.kind = RopeScaling::Kind::llama3;
    s.factor = rope_number(r, file, "factor", 0.0, true);
    s.low_freq_factor = rope_number(r, file, "low_freq_factor", 0.0, true);
    s.high_freq_factor = rope_number(r, file, "high_freq_factor", 0.0, true);
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      throw InvalidInput("llama3 rope_scaling needs high_freq_factor > low_freq_factor",
                         {file, "rope_scaling.high_freq_factor", r["high_freq_factor"].dump()});
    }
    s.original_max_positions = positive(r, "original_max_position_embeddings", file + ": rope_scaling");
  }
}

// transformers 4.45: the correction range is computed over max_position_embeddings; later
// versions use original_max_position_embeddings and rescale the factor, and DeepSeek's
// mscale / mscale_all_dim change the attention factor. Configs where those differ are refused.
void yarn_scaling(const json& r, const HfConfig& c, RopeScaling& s) {
  const std::string& file = c.file;
  s.kind = RopeScaling::Kind::yarn;
  s.factor = rope_number(r, file, "factor", 1.0, false);
  if (!c.max_position_embeddings) {
    throw InvalidInput("yarn rope_scaling needs max_position_embeddings", {file, "max_position_embeddings", "missing"});
  }
  s.original_max_positions = *c.max_position_embeddings;
  if (given(r, "original_max_position_embeddings") &&
      positive(r, "original_max_position_embeddings", file + ": rope_scaling") != *c.max_position_embeddings) {
    throw InvalidInput("yarn with original_max_position_embeddings other than max_position_embeddings is not "
                       "implemented (transformers versions disagree on it; akv follows 4.45)",
                       {file, "rope_scaling.original_max_position_embeddings", r["original_max_position_embeddings"].dump()});
  }
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    if (given(r, key)) {
      throw InvalidInput("yarn mscale (DeepSeek) is not implemented", {file, std::string("rope_scaling.") + key, r[key].dump()});
    }
  }
  s.attention_factor = given(r, "attention_factor") ? rope_number(r, file, "attention_factor", 0.0, true)
                                                       : 0.1 * std::log(s.factor) + 1.0;
  if (given(r, "beta_fast")) s.beta_fast = rope_number(r, file, "beta_fast", 0.0, true);
  if (given(r, "beta_slow")) s.beta_slow = rope_number(r, file, "beta_slow", 0.0, true);
}

// Phi-3's LongRoPE as transformers' Phi3 rotary embedding computes it (4.45): with a top-level
// original_max_position_embeddings the factor is max_position_embeddings / it, otherwise
// rope_scaling.factor over max_position_embeddings; attention factor
// sqrt(1 + ln(factor) / ln(original)) unless given (1 when factor <= 1).
void longrope_scaling(const json& r, const HfConfig& c, RopeScaling& s) {
  const std::string& file = c.file;
  s.kind = RopeScaling::Kind::longrope;
  if (!c.max_position_embeddings) {
    throw InvalidInput("longrope rope_scaling needs max_position_embeddings", {file, "max_position_embeddings", "missing"});
  }
  if (c.original_max_position_embeddings) {
    s.original_max_positions = *c.original_max_position_embeddings;
    s.factor = static_cast<double>(*c.max_position_embeddings) / static_cast<double>(s.original_max_positions);
  } else {
    s.original_max_positions = *c.max_position_embeddings;
    s.factor = rope_number(r, file, "factor", 1.0, false);
  }
  s.attention_factor = given(r, "attention_factor") ? rope_number(r, file, "attention_factor", 0.0, true)
                       : s.factor <= 1.0               ? 1.0
                                                       : std::sqrt(1.0 + std::log(s.factor) /
                                                                             std::log(static_cast<double>(s.original_max_positions)));
  s.short_factors = factor_list(r, "short_factor", c.rotary_dim / 2, file);
  s.long_factors = factor_list(r, "long_factor", c.rotary_dim / 2, file);
}

RopeScaling parse_rope_scaling(const json& r, const HfConfig& c) {
  const std::string& file = c.file;
  RopeScaling s;
  if (r.is_null()) return s;
  if (!r.is_object()) throw InvalidInput("rope_scaling must be an object", {file, "rope_scaling", r.dump()});
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_key) || !r[type_key].is_string()) {
    throw InvalidInput("rope_scaling needs a rope_type", {file, "rope_scaling.rope_type", r.dump()});
  }
  const std::string type = r[type_key].get<std::string>();
  if (type == "default") return s;
  if (type == "linear" || type == "dynamic" || type == "llama3") {
    simple_rope_scaling(r, c, type, s);
  } else if (type == "yarn") {
    yarn_scaling(r, c, s);
  } else if (type == "longrope" || type == "su") {
    longrope_scaling(r, c, s);
  } else {
    throw InvalidInput("rope_scaling type not implemented (akv implements default, linear, dynamic, llama3, yarn, longrope)",
                       {file, std::string("rope_scaling.") + type_key, type});
  }
  return s;
}

}  // namespace

std::vector<std::size_t> hf_layer_windows(const HfConfig& c) {
  const bool gemma2 = c.model_type == "gemma2";
  if (!gemma2 && c.model_type != "gemma3_text") {
    const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";
    if (!c.sliding_window || (qwen && !c.use_sliding_window)) return {};
    std::vector<std::size_t> w;
    for (std::size_t l = 0; l < c.num_hidden_layers; ++l) w.push_back(!qwen || l >= c.max_window_layers ? *c.sliding_window : 0);
    if (std::count(w.begin(), w.end(), std::size_t{0}) == static_cast<std::ptrdiff_t>(w.size())) return {};
    return w;
  }
  const std::size_t window = c.sliding_window.value_or(4096), pattern = c.sliding_window_pattern.value_or(gemma2 ? 2 : 6);
  std::vector<std::size_t> w;
  for (std::size_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool local = c.layer_types.empty() ? (l + 1) % pattern != 0 : c.layer_types[l] == "sliding_attention";
    w.push_back(local ? window : 0);
  }
  return w;
}

namespace {

void read_fields(const json& j, const std::string& file, HfConfig& c);

// An error in a multimodal config's language-model fields names them under text_config.
InvalidInput in_text_config(const InvalidInput& e, const HfConfig& c) {
  if (!c.multimodal || e.where().field.empty()) return e;
  return InvalidInput(e.message(), {e.where().file, "text_config." + e.where().field, e.where().value});
}

}  // namespace

RopeScaling hf_rope_scaling(const HfConfig& c) {
  try {
    return parse_rope_scaling(c.rope_scaling, c);
  } catch (const InvalidInput& e) {
    throw in_text_config(e, c);
  }
}

HfConfig read_hf_config(const std::string& path, const std::vector<std::string>& model_types) {
  std::error_code ec;
  HfConfig c;
  c.file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  const std::string& file = c.file;
  std::ifstream in = open_json(file, "model config");
  const json root = parse_json(in, file, "config");
  if (!root.is_object()) throw CorruptData("config is not a JSON object", {file});
  c.name = typed<std::string>(root, "_name_or_path", "", file);
  c.model_type = typed<std::string>(root, "model_type", "", file);
  // Gemma 3's multimodal checkpoint: its language model's fields are text_config's.
  const bool multimodal = c.model_type == "gemma3" && root.contains("text_config") && root["text_config"].is_object();
  const json& j = multimodal ? root["text_config"] : root;
  if (multimodal) {
    c.model_type = "gemma3_text";
    c.multimodal = true;
  }
  if (!model_types.empty() &&
      std::find(model_types.begin(), model_types.end(), c.model_type) == model_types.end()) {
    throw InvalidInput(unsupported_architecture("model_type", c.model_type, model_types), {file, "model_type", c.model_type});
  }
  try {
    read_fields(j, file, c);
  } catch (const InvalidInput& e) {
    throw in_text_config(e, c);
  }
  return c;
}

namespace {

void read_fields(const json& j, const std::string& file, HfConfig& c) {
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
  c.original_max_position_embeddings = optional_positive(j, "original_max_position_embeddings", file);
  c.sliding_window = optional_positive(j, "sliding_window", file);
  c.use_sliding_window = typed<bool>(j, "use_sliding_window", false, file);
  if (const double m = typed<double>(j, "max_window_layers", 28.0, file); m >= 0 && m == std::floor(m)) {
    c.max_window_layers = static_cast<std::size_t>(m);
  } else {
    throw InvalidInput("max_window_layers must be a non-negative integer", {file, "max_window_layers", j["max_window_layers"].dump()});
  }
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
  if (given(j, "layer_types")) {
    const json& t = j["layer_types"];
    if (!t.is_array() || t.size() != c.num_hidden_layers) {
      throw InvalidInput("layer_types must list num_hidden_layers attention kinds", {file, "layer_types", t.dump()});
    }
    for (std::size_t i = 0; i < t.size(); ++i) {
      const std::string kind = t[i].is_string() ? t[i].get<std::string>() : "";
      if (kind != "sliding_attention" && kind != "full_attention") {
        throw InvalidInput("layer_types holds sliding_attention or full_attention",
                           {file, "layer_types[" + std::to_string(i) + "]", t[i].dump()});
      }
      c.layer_types.push_back(kind);
    }
  }
  c.sliding_window_pattern = optional_positive(j, "sliding_window_pattern", file);
  c.rope_local_base_freq = optional_positive_real(j, "rope_local_base_freq", file);
  c.query_pre_attn_scalar = optional_positive_real(j, "query_pre_attn_scalar", file);
  c.final_logit_softcapping = optional_cap(j, "final_logit_softcapping", file);
  c.attn_logit_softcapping = optional_cap(j, "attn_logit_softcapping", file);
  c.hidden_activation = typed<std::string>(j, "hidden_activation", "", file);
  c.rotary_dim = c.head_dim;
  if (given(j, "partial_rotary_factor")) {
    const double f = typed<double>(j, "partial_rotary_factor", 1.0, file);
    const auto rot = static_cast<std::size_t>(static_cast<double>(c.head_dim) * f);  // Python int()
    if (!(f > 0.0 && f <= 1.0) || rot < 2 || rot % 2 != 0) {
      throw InvalidInput("partial_rotary_factor must be in (0, 1] and leave an even rotary dimension",
                         {file, "partial_rotary_factor", j["partial_rotary_factor"].dump()});
    }
    c.rotary_dim = rot;
  }
}

}  // namespace

}  // namespace akv
