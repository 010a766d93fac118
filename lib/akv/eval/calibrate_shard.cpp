#include "akv/eval/calibrate_shard.h"

#include <string>
#include <type_traits>
#include <utility>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/eval/calibrate_steps.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"

namespace akv {
namespace {

constexpr const char* kCalibrationPart = "akv-calibration-part";

// f(name, member) for the options a part records by value: all of them but the rule and the
// rotation (by name), then KVzap's (when its surrogate is fitted) and the types' (with --types).
template <typename F>
void plain_options(F&& f) {
  using O = CalibrateOptions;
  f("candidates", &O::candidates), f("group", &O::group), f("residual", &O::residual), f("target_bits", &O::target_bits);
  f("aggregate", &O::aggregate), f("allocator", &O::allocator), f("lo_bit", &O::lo), f("mid_bit", &O::mid);
  f("hi_bit", &O::hi), f("update_interval", &O::update_interval), f("duo_sinks", &O::duo_sinks);
  f("duo_window", &O::duo_window), f("nuq_bits", &O::nuq_bits), f("nuq_sparsity", &O::nuq_sparsity);
  f("nuq_sink", &O::nuq_sink);
}
template <typename F>
void kvzap_options(F&& f) {
  f("kvzap_alpha", &CalibrateOptions::kvzap_alpha), f("kvzap_sinks", &CalibrateOptions::kvzap_sinks);
}
template <typename F>
void types_options(F&& f) {
  f("types", &CalibrateOptions::types), f("types_target_bits", &CalibrateOptions::types_target_bits);
}

nlohmann::json options_json(const CalibrateOptions& o, bool kvzap) {
  nlohmann::json j = {{"quant_rule", quant_rule_name(o.rule)}};
  const auto put = [&](const char* name, auto m) { j[name] = o.*m; };
  plain_options(put);
  if (kvzap) kvzap_options(put);  // absent: no surrogate fitted
  if (o.rotate != RotationKind::none) j["rotate"] = rotation_name(o.rotate);  // absent: none
  if (!o.types.empty()) types_options(put);  // absent: none
  return j;
}

CalibrateOptions options_from_json(const nlohmann::json& op, const std::string& file) {
  CalibrateOptions o;
  const auto get = [&](const char* name, auto m) { o.*m = json_as<std::decay_t<decltype(o.*m)>>(op.at(name)); };
  plain_options(get);
  o.rule = parse_quant_rule(op.at("quant_rule").get<std::string>());
  if (op.contains("rotate")) o.rotate = parse_rotation(op.at("rotate").get<std::string>(), file, "options.rotate");
  if (op.contains("kvzap_alpha")) kvzap_options(get);
  if (op.contains("types")) types_options(get);
  return o;
}

// A head's raw measurements in a part: the token norms only when the streaming proxy reads them
// (adakv-proxy with an update interval), the types' errors with --types, KVzap's surrogate when
// fitted.
nlohmann::json head_json(const calib::HeadMeasure& a, const calib::Setup& st) {
  const bool norms = st.opt.allocator == "adakv-proxy" && st.opt.update_interval > 0;
  nlohmann::json h = {{"key_err", a.key_error}, {"value_err", a.value_error},
                      {"duo_error", a.duo_error ? nlohmann::json(*a.duo_error) : nlohmann::json(nullptr)},
                      {"norms", norms ? nlohmann::json(a.norms) : nlohmann::json::array()}};
  HeadStats::measures([&](const char* name, auto m) { h[name] = a.*m; });
  if (!st.types.key.empty()) {
    h["type_key_err"] = a.type_key_error;
    h["type_value_err"] = a.type_value_error;
  }
  if (st.kvzap) h["kvzap"] = {{"weight", a.kvzap_weight}, {"bias", a.kvzap_bias}, {"r2", a.kvzap_r2}};
  return h;
}

calib::HeadMeasure head_from_json(const nlohmann::json& h) {
  calib::HeadMeasure a;
  h.at("key_err").get_to(a.key_error);
  h.at("value_err").get_to(a.value_error);
  HeadStats::measures([&](const char* name, auto m) { h.at(name).get_to(a.*m); });
  if (!h.at("duo_error").is_null()) a.duo_error = h.at("duo_error").get<double>();
  h.at("norms").get_to(a.norms);
  if (h.contains("type_key_err")) {
    h.at("type_key_err").get_to(a.type_key_error);
    h.at("type_value_err").get_to(a.type_value_error);
  }
  if (h.contains("kvzap")) {
    h.at("kvzap").at("weight").get_to(a.kvzap_weight);
    a.kvzap_bias = h.at("kvzap").at("bias").get<double>();
    a.kvzap_r2 = h.at("kvzap").at("r2").get<double>();
  }
  return a;
}

// A layer's nuq codebooks in a part: every bit width's levels, the key thresholds once; or why
// they could not be fitted.
nlohmann::json nuq_json(const calib::LayerNuq& ln) {
  if (!ln.failed.empty()) return {{"failed", ln.failed}};
  nlohmann::json kl = nlohmann::json::array(), vl = nlohmann::json::array();
  for (std::size_t b = 0; b < ln.key.size(); ++b) {
    kl.push_back(ln.key[b].levels);
    vl.push_back(ln.value[b].levels);
  }
  return {{"key_upper", ln.key.front().upper}, {"key_lower", ln.key.front().lower}, {"key_levels", kl}, {"value_levels", vl}};
}

// The bit widths are the options' (merge_calibration_parts sets them once it has those).
calib::LayerNuq nuq_from_json(const nlohmann::json& e) {
  calib::LayerNuq ln;
  if (e.contains("failed")) {
    ln.failed = e.at("failed").get<std::string>();
    return ln;
  }
  const std::vector<double> up = e.at("key_upper").get<std::vector<double>>(),
                            lo = e.at("key_lower").get<std::vector<double>>();
  const nlohmann::json& kl = e.at("key_levels");
  const nlohmann::json& vl = e.at("value_levels");
  for (std::size_t b = 0; b < kl.size(); ++b) {
    NuqCalibration k, v;
    k.per_channel = true;
    k.upper = up;
    k.lower = lo;
    kl[b].get_to(k.levels);
    vl.at(b).get_to(v.levels);
    ln.key.push_back(std::move(k));
    ln.value.push_back(std::move(v));
  }
  return ln;
}

}  // namespace

nlohmann::json calibrate_part(const std::vector<std::string>& dumps, const CalibrateOptions& o, const Shard& shard,
                              const ProgressFn& progress) {
  using namespace calib;
  const Setup st = setup(dumps, o);
  const auto [lo, hi] = shard.range(st.metas[0].n_layers);
  auto agg = measure_layers(dumps, st, lo, hi, progress);
  fit_layer_qfilters(dumps, st, lo, hi, agg);
  fit_layer_kvzap(dumps, st, lo, hi, agg);
  const std::vector<LayerNuq> nuq = fit_layer_nuq(dumps, st, lo, hi);
  const nlohmann::json layers = json_map(agg, [&](const auto& layer) {
    return json_map(layer, [&](const HeadMeasure& a) { return head_json(a, st); });
  });
  const nlohmann::json nuq_layers = json_map(nuq, [](const LayerNuq& ln) { return nuq_json(ln); });
  const nlohmann::json ds =
      json_map(dumps, [](const std::string& d) { return nlohmann::json{{"path", d}, {"hash", file_hash(d)}}; });
  return {{"format", kCalibrationPart}, {"version", 1}, {"shard", shard.k}, {"shards", shard.n},
          {"first_layer", lo}, {"n_layers", st.metas[0].n_layers}, {"dumps", ds}, {"options", options_json(st.opt, st.kvzap)},
          {"kernels", kernel_arithmetic()}, {"layers", layers}, {"nuq", nuq_layers}};
}

nlohmann::json merge_calibration_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order = shard_order(parts, kCalibrationPart, {"dumps", "options", "n_layers", "kernels"});
  using namespace calib;
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  std::vector<std::vector<HeadMeasure>> agg;
  std::vector<LayerNuq> nuq;
  std::vector<std::string> dumps;
  CalibrateOptions o;
  json_errors_as<InvalidInput>("partial calibration field missing or of the wrong type", {file0}, [&] {
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_layer", "layers", agg.size());
      for (const nlohmann::json& e : j.at("nuq")) nuq.push_back(nuq_from_json(e));
      for (const nlohmann::json& layer : j.at("layers")) {
        std::vector<HeadMeasure> heads;
        for (const nlohmann::json& h : layer) heads.push_back(head_from_json(h));
        agg.push_back(std::move(heads));
      }
    }
    for (const nlohmann::json& d : first.at("dumps")) dumps.push_back(d.at("path").get<std::string>());
    o = options_from_json(first.at("options"), file0);
  });
  const Setup st = setup(dumps, o);
  for (std::size_t i = 0; i < dumps.size(); ++i) {
    const std::string hash = file_hash(dumps[i]);
    if (hash != first["dumps"][i]["hash"].get<std::string>()) {
      throw InvalidInput("dump changed since the shards read it", {dumps[i], "hash", hash});
    }
  }
  if (agg.size() != st.metas[0].n_layers) {
    throw InvalidInput("parts hold " + std::to_string(agg.size()) + " layers, the dumps " + std::to_string(st.metas[0].n_layers),
                       {file0, "n_layers", std::to_string(st.metas[0].n_layers)});
  }
  const std::size_t C = st.metas[0].n_kv_heads * st.metas[0].head_dim;
  if (nuq.size() != (st.nuq ? agg.size() : 0)) {
    throw InvalidInput(st.nuq ? "parts without every layer's nuq codebooks" : "nuq codebooks the dumps cannot give",
                       {file0, "nuq", std::to_string(nuq.size())});
  }
  for (LayerNuq& ln : nuq) {
    if (!ln.failed.empty()) continue;
    if (ln.key.size() != st.opt.nuq_bits.size() || ln.key.front().upper.size() != C || ln.key.front().lower.size() != C) {
      throw InvalidInput("a layer's nuq codebooks do not match the options and shape", {file0, "nuq"});
    }
    for (std::size_t b = 0; b < ln.key.size(); ++b) {
      ln.key[b].bits = ln.value[b].bits = st.opt.nuq_bits[b];
      if (ln.key[b].levels.size() != (std::size_t{1} << ln.key[b].bits) ||
          ln.value[b].levels.size() != (std::size_t{1} << ln.value[b].bits)) {
        throw InvalidInput("nuq levels must be 2^bits values", {file0, "nuq.key_levels", std::to_string(ln.key[b].levels.size())});
      }
    }
  }
  for (const auto& layer : agg) {
    if (layer.size() != st.metas[0].n_kv_heads) throw InvalidInput("a layer without every KV head", {file0, "layers", std::to_string(layer.size())});
    for (const HeadMeasure& a : layer) {
      if (a.type_key_error.size() != st.types.key.size() || a.type_value_error.size() != st.types.value.size()) {
        throw InvalidInput("a head without every type's error", {file0, "type_key_err", std::to_string(a.type_key_error.size())});
      }
      if (a.key_error.size() != st.opt.candidates.size() || a.value_error.size() != st.opt.candidates.size()) {
        throw InvalidInput("a head without every candidate's error", {file0, "key_err", std::to_string(a.key_error.size())});
      }
      if (a.duo_error.has_value() != st.duo) {
        throw InvalidInput(st.duo ? "a head without its DuoAttention score" : "a DuoAttention score the dumps are too short for",
                           {file0, "duo_error"});
      }
      if (a.kvzap_weight.empty() == st.kvzap) {
        throw InvalidInput(st.kvzap ? "a head without its KVzap surrogate" : "a KVzap surrogate the dumps cannot give",
                           {file0, "kvzap"});
      }
      if (a.qfilter.size() != st.metas[0].head_dim) {
        throw InvalidInput("a head's Q-Filter is not head_dim long", {file0, "qfilter", std::to_string(a.qfilter.size())});
      }
    }
  }
  return assemble(dumps, st, agg, nuq);
}

}  // namespace akv
