#include "akv/alloc/calibration_file.h"

#include <algorithm>
#include <cmath>

#include "akv/alloc/file_heads.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/ggml_params.h"
#include "akv/method/registry.h"
#include "akv/quant/pack.h"

namespace akv {

nlohmann::json calibration_to_json(const CalibrationFile& f) {
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < f.heads.size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < f.heads[l].size(); ++h) {
      const CalibrationHead& a = f.heads[l][h];
      nlohmann::json ke = nlohmann::json::object(), ve = nlohmann::json::object();
      for (std::size_t c = 0; c < f.candidates.size(); ++c) {
        ke[std::to_string(f.candidates[c])] = a.key_error[c];
        ve[std::to_string(f.candidates[c])] = a.value_error[c];
      }
      heads.push_back({{"head", h}, {"key_error", ke}, {"value_error", ve}, {"bits_key", a.bits_key}, {"bits_value", a.bits_value},
                       {"predicted_error", a.predicted_error ? nlohmann::json(*a.predicted_error) : nlohmann::json(nullptr)}});
      HeadStats::measures([&](const char* name, auto m) { heads.back()[name] = a.*m; });
      if (a.duo_error) heads.back()["duo_error"] = *a.duo_error;
      if (!a.kvzap_weight.empty()) heads.back()["kvzap"] = {{"weight", a.kvzap_weight}, {"bias", a.kvzap_bias}, {"r2", a.kvzap_r2}};
      if (!a.type_key.empty()) {
        nlohmann::json tk = nlohmann::json::object(), tv = nlohmann::json::object();
        for (std::size_t t = 0; t < f.key_types.size(); ++t) tk[f.key_types[t]] = a.type_key_error[t];
        for (std::size_t t = 0; t < f.value_types.size(); ++t) tv[f.value_types[t]] = a.type_value_error[t];
        heads.back()["type_key_error"] = tk;
        heads.back()["type_value_error"] = tv;
        heads.back()["ggml_types"] = {a.type_key, a.type_value};
      }
    }
    layers.push_back({{"layer", l}, {"heads", heads}});
  }
  const nlohmann::json src =
      json_map(f.dumps, [](const auto& d) { return nlohmann::json{{"path", d.first}, {"hash", d.second}}; });
  const KvWindow& m = f.shape;
  nlohmann::json j;
  j["format"] = kCalibrationFormat;
  j["version"] = kCalibrationVersion;
  j["dumps"] = src;
  j["shape"] = {{"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim}};
  j["params"] = f.params;
  j["layers"] = layers;
  j["summary"] = f.summary;
  if (f.nuq) {
    const CalibrationNuq& q = *f.nuq;
    nlohmann::json ls = nlohmann::json::array();
    for (std::size_t l = 0; l < q.key.size(); ++l) {
      nlohmann::json kl = nlohmann::json::object(), vl = nlohmann::json::object();
      for (std::size_t b = 0; b < q.bits.size(); ++b) {
        kl[std::to_string(q.bits[b])] = q.key[l][b].levels;
        vl[std::to_string(q.bits[b])] = q.value[l][b].levels;
      }
      ls.push_back({{"layer", l}, {"key_upper", q.key[l].front().upper}, {"key_lower", q.key[l].front().lower},
                    {"key_levels", kl}, {"value_levels", vl}});
    }
    j["nuq"] = {{"sparsity", q.sparsity}, {"sink", q.sink}, {"bits", q.bits},
                {"weights", q.fisher ? "fisher: the dumps' key_fisher and value_fisher" : "none"},
                {"keys", "key_pre_rope, thresholds per channel"}, {"values", "thresholds per token and KV head"},
                {"layers", ls}};
  }
  return j;
}

namespace {

// The file's shape.n_layers, n_kv_heads and head_dim against the input's (InvalidInput naming the
// field otherwise).
void check_shape(const nlohmann::json& j, const std::string& path, const KvShape& shape) {
  const std::pair<const char*, std::size_t> want[] = {
      {"n_layers", shape.file_layers()}, {"n_kv_heads", shape.n_kv_heads}, {"head_dim", shape.head_dim}};
  for (const auto& [name, v] : want) {
    const std::size_t got = file_count(j.at("shape"), name, path, std::string("shape.") + name);
    if (got != v) {
      throw InvalidInput("calibration made for another model shape (this input has " + std::to_string(v) + ")",
                         {path, std::string("shape.") + name, std::to_string(got)});
    }
  }
}

// each_file_head over a calibration file; JSON type errors become CorruptData naming the file.
template <class Fn>
void each_head(const nlohmann::json& j, const std::string& path, const KvShape& shape, Fn fn) {
  json_errors_as<CorruptData>("bad calibration file", {path}, [&] { each_file_head(j, path, "calibration", shape, fn); });
}

// The rotation the calibration was measured with (params.rotate, "none" when absent).
std::string calibration_rotate(const nlohmann::json& j, const std::string& path) {
  return json_errors_as<CorruptData>("bad calibration file", {path},
                                     [&] { return j.at("params").value("rotate", std::string("none")); });
}

}  // namespace

std::vector<std::pair<int, int>> read_calibration(const std::string& path, const KvWindow& m) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  json_errors_as<CorruptData>("bad calibration file", {path}, [&] { check_shape(j, path, m); });
  std::vector<std::pair<int, int>> bits;
  each_head(j, path, m, [&](const nlohmann::json& head, const std::string& hat) {
    const auto k = static_cast<int>(file_count(head, "bits_key", path, hat + ".bits_key"));
    const auto v = static_cast<int>(file_count(head, "bits_value", path, hat + ".bits_value"));
    check_bits(k, (hat + ".bits_key").c_str());
    check_bits(v, (hat + ".bits_value").c_str());
    bits.emplace_back(k, v);
  });
  return bits;
}

CalibrationTypes read_calibration_types(const std::string& path, const KvShape& shape) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  CalibrationTypes out;
  out.rotate = calibration_rotate(j, path);
  each_head(j, path, shape, [&](const nlohmann::json& head, const std::string& hat) {
    if (!head.contains("ggml_types")) {
      throw CorruptData("no per-head cache types: calibrate with --types", {path, hat + ".ggml_types"});
    }
    const nlohmann::json& t = head.at("ggml_types");
    if (!t.is_array() || t.size() != 2 || !t[0].is_string() || !t[1].is_string()) {
      throw CorruptData("ggml_types is [key type, value type]", {path, hat + ".ggml_types", t.dump().substr(0, 40)});
    }
    out.types.emplace_back(t[0].get<std::string>(), t[1].get<std::string>());
    parse_head_type(out.types.back().first, path, hat + ".ggml_types[0]");
    parse_head_type(out.types.back().second, path, hat + ".ggml_types[1]");
  });
  return out;
}

CalibrationAmax read_calibration_amax(const std::string& path, const KvShape& shape) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  CalibrationAmax out;
  out.rotate = calibration_rotate(j, path);
  each_head(j, path, shape, [&](const nlohmann::json& head, const std::string& hat) {
    double a[2];
    for (int i = 0; i < 2; ++i) {
      const char* key = i == 0 ? "key_amax" : "value_amax";
      if (!head.contains(key)) {
        throw CorruptData("no maximum for fp8 scales (calibrate again with this akv)", {path, hat + "." + key});
      }
      a[i] = head.at(key).get<double>();
      if (!(a[i] >= 0.0 && a[i] < 3.4e38)) throw CorruptData("a maximum that is not finite and >= 0", {path, hat + "." + key, format_number(a[i])});
    }
    out.amax.emplace_back(a[0], a[1]);
  });
  return out;
}

QFilters read_calibration_qfilters(const std::string& path, const KvWindow& m) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  QFilters out(m.n_layers);
  std::size_t index = 0;
  each_head(j, path, m, [&](const nlohmann::json& head, const std::string& hat) {
    const std::string field = hat + ".qfilter";
    if (!head.contains("qfilter")) throw CorruptData("no Q-Filter (calibrate again with this akv)", {path, field});
    const auto& f = head.at("qfilter");
    if (!f.is_array() || f.size() != m.head_dim) {
      throw InvalidInput("calibration made for another head_dim (this input has " + std::to_string(m.head_dim) + ")",
                         {path, field, std::to_string(f.is_array() ? f.size() : 0)});
    }
    std::vector<double>& v = out[index++ / m.n_kv_heads].emplace_back();
    for (std::size_t c = 0; c < m.head_dim; ++c) {
      const std::string at = field + "[" + std::to_string(c) + "]";
      if (!f[c].is_number()) throw CorruptData("a filter value that is not a number", {path, at, f[c].dump()});
      v.push_back(f[c].get<double>());
      if (!std::isfinite(v.back())) throw CorruptData("a filter value that is not finite", {path, at});
    }
  });
  return out;
}

KvzapModel read_calibration_kvzap(const std::string& path, const KvShape& shape, std::size_t dim) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  KvzapModel out(shape.n_layers);
  std::size_t index = 0;
  auto number = [&](const nlohmann::json& v, const std::string& at) {
    if (!v.is_number()) throw CorruptData("a KVzap value that is not a number", {path, at, v.dump()});
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw CorruptData("a KVzap value that is not finite", {path, at});
    return x;
  };
  each_head(j, path, shape, [&](const nlohmann::json& head, const std::string& hat) {
    const std::string field = hat + ".kvzap";
    if (!head.contains("kvzap") || !head.at("kvzap").is_object()) {
      throw CorruptData("no KVzap surrogate (calibrate on dumps written with akv dump --kvzap)", {path, field});
    }
    const auto& z = head.at("kvzap");
    if (!z.contains("weight") || !z.at("weight").is_array() || z.at("weight").size() != dim) {
      throw InvalidInput("KVzap surrogate made for another attention input width (this input has " +
                             std::to_string(dim) + ")",
                         {path, field + ".weight",
                          std::to_string(z.contains("weight") && z.at("weight").is_array() ? z.at("weight").size() : 0)});
    }
    if (!z.contains("bias")) throw CorruptData("a KVzap surrogate without its bias", {path, field + ".bias"});
    KvzapLayer& layer = out[index++ / shape.n_kv_heads];
    std::vector<double>& w = layer.weight.emplace_back();
    for (std::size_t c = 0; c < dim; ++c) {
      w.push_back(number(z.at("weight")[c], field + ".weight[" + std::to_string(c) + "]"));
    }
    layer.bias.push_back(number(z.at("bias"), field + ".bias"));
  });
  return out;
}

DuoHeadScores read_calibration_duo(const std::string& path, const KvShape& shape) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  DuoHeadScores out;
  json_errors_as<CorruptData>("bad calibration file", {path}, [&] {
    const auto& s = j.at("summary");
    if (!s.contains("duo")) {
      throw CorruptData("no DuoAttention head scores (calibrate with dumps longer than duo sinks + window, with this akv)",
                        {path, "summary.duo"});
    }
    out.sinks = file_count(s.at("duo"), "sinks", path, "summary.duo.sinks");
    out.window = file_count(s.at("duo"), "window", path, "summary.duo.window");
  });
  out.error.resize(shape.n_layers);
  std::size_t index = 0;
  each_head(j, path, shape, [&](const nlohmann::json& head, const std::string& hat) {
    const std::string field = hat + ".duo_error";
    if (!head.contains("duo_error") || !head.at("duo_error").is_number()) {
      throw CorruptData("a head without its DuoAttention score", {path, field});
    }
    const double e = head.at("duo_error").get<double>();
    if (!(e >= 0.0 && std::isfinite(e))) throw CorruptData("a DuoAttention score that is not finite and >= 0", {path, field, format_number(e)});
    out.error[index++ / shape.n_kv_heads].push_back(e);
  });
  return out;
}

namespace {

// 2^bits ascending finite levels at `at` (f32 values, as calibrate writes them).
std::vector<float> read_levels(const nlohmann::json& v, int bits, const std::string& path, const std::string& at) {
  if (!v.is_array() || v.size() != (std::size_t{1} << bits)) {
    throw CorruptData("nuq levels must be 2^bits values", {path, at, std::to_string(v.is_array() ? v.size() : 0)});
  }
  std::vector<float> levels;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double x = v[i].is_number() ? v[i].get<double>() : NAN;
    if (!std::isfinite(x) || static_cast<double>(static_cast<float>(x)) != x || (i > 0 && x < levels.back())) {
      throw CorruptData("nuq levels must be ascending finite f32 values", {path, at + "[" + std::to_string(i) + "]", v[i].dump()});
    }
    levels.push_back(static_cast<float>(x));
  }
  return levels;
}

}  // namespace

NuqCodebooks read_calibration_nuq(const std::string& path, const KvShape& shape, int bk, int bv) {
  const nlohmann::json j = read_json_file(path, "calibration", kCalibrationFormat, kCalibrationVersion);
  if (!j.contains("nuq")) {
    const nlohmann::json* why = j.contains("summary") ? &j["summary"] : nullptr;
    if (why && why->contains("nuq_not_fitted") && (*why)["nuq_not_fitted"].is_string()) {
      throw InvalidInput("calibration has no nuq codebooks: " + (*why)["nuq_not_fitted"].get<std::string>(),
                         {path, "summary.nuq_not_fitted"});
    }
    throw InvalidInput("calibration has no nuq codebooks (`akv calibrate` fits them on dumps with key_pre_rope)",
                       {path, "nuq"});
  }
  NuqCodebooks out;
  json_errors_as<CorruptData>("bad calibration file", {path, "nuq"}, [&] {
    const nlohmann::json& q = j.at("nuq");
    check_shape(j, path, shape);
    out.sparsity = q.at("sparsity").get<double>();
    if (!(out.sparsity > 0.0 && out.sparsity <= 1.0)) {
      throw CorruptData("nuq sparsity must be in (0, 1]", {path, "nuq.sparsity", format_number(out.sparsity)});
    }
    out.sink = file_count(q, "sink", path, "nuq.sink");
    const std::vector<int> bits = q.at("bits").get<std::vector<int>>();
    for (const int b : {bk, bv}) {
      if (std::find(bits.begin(), bits.end(), b) == bits.end()) {
        throw InvalidInput("calibration has no nuq codebook of " + std::to_string(b) + " bits (akv calibrate --nuq-bits)",
                           {path, "nuq.bits", q.at("bits").dump()});
      }
    }
    const auto& layers = q.at("layers");
    if (!layers.is_array() || layers.size() != shape.file_layers()) {
      throw CorruptData("nuq has the wrong number of layers", {path, "nuq.layers", std::to_string(layers.size())});
    }
    const std::size_t C = shape.n_kv_heads * shape.head_dim;
    for (std::size_t i = 0; i < shape.n_layers; ++i) {
      const std::size_t l = shape.file_layer(i);
      const std::string at = "nuq.layers[" + std::to_string(l) + "]";
      const nlohmann::json& e = layers[l];
      NuqCalibration k, v;
      k.bits = bk;
      k.per_channel = true;
      v.bits = bv;
      v.per_channel = false;
      k.levels = read_levels(e.at("key_levels").at(std::to_string(bk)), bk, path, at + ".key_levels." + std::to_string(bk));
      v.levels = read_levels(e.at("value_levels").at(std::to_string(bv)), bv, path, at + ".value_levels." + std::to_string(bv));
      k.upper = e.at("key_upper").get<std::vector<double>>();
      k.lower = e.at("key_lower").get<std::vector<double>>();
      if (k.upper.size() != C || k.lower.size() != C) {
        throw CorruptData("nuq key thresholds must be n_kv_heads x head_dim " + std::to_string(C) + " values",
                          {path, at + ".key_upper", std::to_string(k.upper.size())});
      }
      for (std::size_t c = 0; c < C; ++c) {
        if (!std::isfinite(k.upper[c]) || !std::isfinite(k.lower[c]) || k.lower[c] > k.upper[c]) {
          throw CorruptData("nuq key thresholds must be finite with lower <= upper",
                            {path, at + ".key_lower[" + std::to_string(c) + "]", format_number(k.lower[c])});
        }
      }
      out.key.push_back(std::move(k));
      out.value.push_back(std::move(v));
    }
  });
  return out;
}

}  // namespace akv
