#include "akv/alloc/engine_settings.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/tensor/fp8.h"

namespace akv {
namespace {

struct Layer {
  std::vector<std::string> key, value;  // per KV head
  double key_amax = 0, value_amax = 0;  // max over its KV heads
};

std::vector<Layer> read_layers(const nlohmann::json& c) {
  std::vector<Layer> out;
  for (const nlohmann::json& l : c.at("layers")) {
    Layer layer;
    for (const nlohmann::json& h : l.at("heads")) {
      if (!h.contains("ggml_types")) {
        throw InvalidInput("no per-head cache types to emit: calibrate with --types", {"", "--emit", "ggml_types"});
      }
      layer.key.push_back(h.at("ggml_types").at(0).get<std::string>());
      layer.value.push_back(h.at("ggml_types").at(1).get<std::string>());
      for (const std::string* t : {&layer.key.back(), &layer.value.back()}) {
        if (t->find('+') != std::string::npos) {
          throw InvalidInput("a head's own rotation is akv's: engines rotate every quantized layer alike (calibrate "
                             "with --rotate instead)", {"", "--types", *t});
        }
      }
      layer.key_amax = std::max(layer.key_amax, h.at("key_amax").get<double>());
      layer.value_amax = std::max(layer.value_amax, h.at("value_amax").get<double>());
    }
    out.push_back(std::move(layer));
  }
  return out;
}

// At least half of the layer's K and V tensors assigned f16.
bool f16_layer(const Layer& l) {
  const auto n = std::count(l.key.begin(), l.key.end(), "f16") + std::count(l.value.begin(), l.value.end(), "f16");
  return 2 * static_cast<std::size_t>(n) >= l.key.size() + l.value.size();
}

// The types assigned outside f16, keys and values.
std::pair<std::set<std::string>, std::set<std::string>> used_types(const std::vector<Layer>& layers) {
  std::set<std::string> k, v;
  for (const Layer& l : layers) {
    for (const auto& t : l.key) {
      if (t != "f16") k.insert(t);
    }
    for (const auto& t : l.value) {
      if (t != "f16") v.insert(t);
    }
  }
  return {k, v};
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

nlohmann::json vllm(const nlohmann::json& c, const std::vector<Layer>& layers) {
  const auto [k, v] = used_types(layers);
  const std::string kt = k.size() == 1 ? *k.begin() : k.empty() ? "f16" : "", vt = v.size() == 1 ? *v.begin() : v.empty() ? "f16" : "";
  static const std::map<std::pair<std::string, std::string>, std::string> dtypes = {
      {{"fp8_e4m3", "fp8_e4m3"}, "fp8_e4m3"},          {{"fp8_e5m2", "fp8_e5m2"}, "fp8_e5m2"},
      {{"tq4nc", "tqv4"}, "turboquant_4bit_nc"},       {{"tq3nc", "tqv4"}, "turboquant_k3v4_nc"},
      {{"tq3nc", "tqv3"}, "turboquant_3bit_nc"},       {{"fp8_e4m3", "tqv4"}, "turboquant_k8v4"}};
  // One side all f16: the other's fp8 type for both (vLLM quantizes K and V alike).
  std::pair<std::string, std::string> pair{kt, vt};
  if (kt == "f16" && vt.rfind("fp8_", 0) == 0) pair.first = vt;
  if (vt == "f16" && kt.rfind("fp8_", 0) == 0) pair.second = kt;
  const auto it = dtypes.find(pair);
  if (it == dtypes.end()) {
    throw InvalidInput("vLLM takes one cache dtype for every quantized layer: the types besides f16 must be fp8_e4m3, "
                       "fp8_e5m2 or a TurboQuant preset's key and value pair (tq4nc/tqv4, tq3nc/tqv4, tq3nc/tqv3, "
                       "fp8_e4m3/tqv4)",
                       {"", "--types", "keys " + join(k) + " values " + join(v)});
  }
  nlohmann::json skip = nlohmann::json::array();
  std::string flags = "--kv-cache-dtype " + it->second;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (f16_layer(layers[l])) skip.push_back(std::to_string(l));
  }
  if (!skip.empty()) {
    flags += " --kv-cache-dtype-skip-layers";
    for (const auto& s : skip) flags += " " + s.get<std::string>();
  }
  nlohmann::json j = {{"engine", "vllm"}, {"kv_cache_dtype", it->second}, {"kv_cache_dtype_skip_layers", skip},
                      {"flags", flags}};
  if (it->second.rfind("fp8_", 0) == 0) {
    const Fp8Format f = it->second == "fp8_e4m3" ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const double max = fp8_max(f);
    nlohmann::json scales = nlohmann::json::object();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (f16_layer(layers[l])) continue;
      const std::string at = "model.layers." + std::to_string(l) + ".self_attn.";
      scales[at + "k_scale"] = layers[l].key_amax > 0 ? layers[l].key_amax / max : 1.0;
      scales[at + "v_scale"] = layers[l].value_amax > 0 ? layers[l].value_amax / max : 1.0;
    }
    j["scales"] = scales;
    j["scales_note"] = "max |x| / fp8 max per layer (keys, values), as x / scale is stored; vLLM loads them as a "
                       "checkpoint's f32 tensors of these names when its quantization config declares an fp8 KV "
                       "cache, otherwise it uses 1 or --calculate-kv-scales";
  } else {
    j["note"] = "vLLM also keeps its boundary layers (the first and last 2) unquantized with TurboQuant";
  }
  if (c.at("params").value("rotate", "none") != "none") {
    j["rotate_note"] = "measured with rotate=" + c.at("params").value("rotate", "none") +
                       "; vLLM's fp8 cache does not rotate, its TurboQuant keys are Hadamard-rotated";
  }
  return j;
}

nlohmann::json llama_cpp(const nlohmann::json& c, const std::vector<Layer>& layers) {
  static const std::map<std::string, double> bits = {{"q8_0", 8.5}, {"q5_1", 6},   {"q5_0", 5.5},
                                                     {"q4_1", 5},   {"q4_0", 4.5}, {"iq4_nl", 4.5}};
  std::map<std::string, std::size_t> kc, vc;
  nlohmann::json f16 = nlohmann::json::array();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (const bool key : {true, false}) {
      for (const std::string& t : key ? layers[l].key : layers[l].value) {
        if (t != "f16" && !bits.count(t)) {
          throw InvalidInput("llama.cpp's cache types are f16, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl", {"", "--types", t});
        }
        if (!f16_layer(layers[l]) && t != "f16") ++(key ? kc : vc)[t];
      }
    }
    if (f16_layer(layers[l])) f16.push_back(l);
  }
  auto most = [&](const std::map<std::string, std::size_t>& count) -> std::string {
    std::string best = "f16";
    std::size_t n = 0;
    for (const auto& [t, m] : count) {
      if (m > n || (m == n && bits.at(t) > bits.at(best))) {  // m >= 1: best is a counted type on a tie
        best = t;
        n = m;
      }
    }
    return best;
  };
  const std::string ctk = most(kc), ctv = most(vc);
  const bool rotated = c.at("params").value("rotate", "none") == "hadamard";
  nlohmann::json j = {{"engine", "llama.cpp"}, {"ctk", ctk}, {"ctv", ctv},
                      {"flags", "-ctk " + ctk + " -ctv " + ctv + " -fa on"}, {"layers_f16", f16},
                      {"rotation", rotated ? "on: llama.cpp's default for quantized caches (head_dim a multiple of 64)"
                                           : "measured unrotated: set LLAMA_ATTN_ROT_DISABLE=1 to match"}};
  j["note"] = "llama.cpp stores one cache type in every layer: layers_f16 are the layers the assignment keeps in f16, "
              "which llama.cpp cannot do per layer";
  return j;
}

}  // namespace

nlohmann::json engine_settings(const nlohmann::json& calibration, const std::string& engine) {
  if (engine != "vllm" && engine != "llama.cpp") throw InvalidInput("engines: vllm, llama.cpp", {"", "--emit", engine});
  return json_errors_as<InvalidInput>("calibration without what --emit needs", {"", "--emit", engine}, [&] {
    const std::vector<Layer> layers = read_layers(calibration);
    return engine == "vllm" ? vllm(calibration, layers) : llama_cpp(calibration, layers);
  });
}

}  // namespace akv
