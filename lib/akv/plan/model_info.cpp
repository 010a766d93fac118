#include "akv/plan/model_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "akv/core/errors.h"
#include "akv/method/params.h"
#include "akv/model/architecture.h"
#include "akv/model/gguf.h"
#include "akv/model/load.h"
#include "akv/model/hf_config.h"
#include "akv/model/llama2c.h"
#include "akv/plan/plan.h"

namespace akv {
namespace {

// The methods whose bytes `akv info` lists (those the model's head_dim allows); nuq at KVQuant's
// defaults (sparsity 0.99, one f16 sink), as `akv plan` counts it without a calibration.
const char* const kInfoMethods[] = {"f32",  "none",         "kivi-4", "kivi-2", "ggml:k=q8_0:v=q8_0", "ggml:k=q4_0:v=q4_0",
                                    "fp8", "turboquant_4bit_nc", "turboquant_k3v4_nc", "nuq:bits=3"};

// The file's format and architecture into j; whether akv runs that architecture.
bool model_architecture(const std::string& path, nlohmann::json& j) {
  std::string arch;
  bool runs = false;
  if (std::filesystem::is_directory(path)) {
    if (!std::filesystem::exists(std::filesystem::path(path) / "config.json")) {
      throw IoError("is a directory without a config.json: not an akv file or a model directory", {path});
    }
    const HfConfig c = read_hf_config(path);
    arch = c.model_type;
    j["model_format"] = "huggingface";
    const auto& ok = supported_hf_model_types();
    runs = std::find(ok.begin(), ok.end(), arch) != ok.end();
  } else if (is_gguf(path)) {
    const nlohmann::json g = gguf_info(GgufFile(path));
    arch = g.value("architecture", "");
    j["model_format"] = "gguf";
    const auto& ok = supported_gguf_architectures();
    runs = std::find(ok.begin(), ok.end(), arch) != ok.end();
  } else if (is_llama2c_path(path)) {
    arch = "llama";  // llama2.c's one architecture; the header is checked when the model loads
    j["model_format"] = "llama2.c";
    runs = true;
  } else {
    throw InvalidInput(
        "not a model: akv info reads a directory with a config.json, a GGUF file or a llama2.c .bin (and akv files)",
        {path});
  }
  j["architecture"] = arch;
  j["runs"] = runs;
  if (!runs) {
    const std::string f = missing_feature(arch);
    j["missing"] = f.empty() ? "this architecture (not a Llama-family model akv knows)" : f;
  }
  return runs;
}

// Which layers attend globally and which through a sliding window, in words.
std::string attention_layout(const ModelConfig& c) {
  std::string globals_list;
  std::size_t n_local = 0, widest = 0;
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    widest = std::max(widest, c.window_of(l));
    if (c.window_of(l)) ++n_local;
    else globals_list += (globals_list.empty() ? "" : ", ") + std::to_string(l);
  }
  if (n_local == c.n_layers) {
    return fmt::format("sliding window of {} tokens in every layer (within it the methods compress every layer; "
                       "past it only none and f32 run, holding the window's rows)", widest);
  }
  if (n_local) {
    const bool one = c.n_layers - n_local == 1;
    return fmt::format("global in layer{} {}; sliding window of {} tokens in the other {} (methods compress the "
                       "global layers; each local layer keeps its window's rows in f16)",
                       one ? "" : "s", globals_list.empty() ? std::string("none") : globals_list, widest, n_local);
  }
  return "global (causal over every position) in every layer";
}

// KV bytes per token of each of kInfoMethods at a context of n (as akv plan counts them).
nlohmann::json kv_bytes_rows(const ModelConfig& c, std::size_t n) {
  PlanShape shape;
  static_cast<KvShape&>(shape) = static_cast<const KvShape&>(c);
  shape.name = c.name;
  shape.layer_window = c.layer_window;
  nlohmann::json rows = nlohmann::json::array();
  for (const char* spec : kInfoMethods) {
    PlanMethod pm{spec, std::string(spec) == "f32" ? std::nullopt : resolve_method_spec_for_bytes(spec)};
    try {
      const PlanBytes b = plan_bytes(shape, pm, n);
      rows.push_back({{"method", spec},
                      {"description", pm.params ? describe(*pm.params) : std::string("f32 K/V")},
                      {"bytes_per_token", b.device / static_cast<double>(n)}});
    } catch (const InvalidInput& e) {
      rows.push_back({{"method", spec}, {"unavailable", e.what()}});
    }
  }
  return rows;
}

}  // namespace

nlohmann::json model_info(const std::string& path) {
  nlohmann::json j = {{"format", "akv-model-info"}, {"file", path}};
  if (!model_architecture(path, j)) return j;
  std::optional<Model> loaded;
  try {
    loaded.emplace(load_model(path));
  } catch (const Error& e) {  // what the loader refuses (shapes, tensor types, missing files)
    j["runs"] = false;
    j["error"] = e.what();
    return j;
  }
  const Model& m = *loaded;
  const ModelConfig& c = m.config();
  j.update({{"name", c.name}, {"layers", c.n_layers}, {"heads", c.n_heads}, {"kv_heads", c.n_kv_heads},
            {"head_dim", c.head_dim}, {"dim", c.dim}, {"hidden_dim", c.hidden_dim}, {"vocab", c.vocab_size},
            {"trained_context", c.seq_len}, {"weight_bytes", m.weights().bytes()}, {"attention", attention_layout(c)}});
  j["rope"] = {{"theta", c.rope_theta},
               {"layout", rope_layout_name(c.rope_layout)},
               {"scaling", rope_scaling_name(c.rope_scaling.kind)},
               {"factor", c.rope_scaling.factor},
               {"rotary_dims", c.rotary_dim ? c.rotary_dim : c.head_dim}};
  if (c.rope_theta_local > 0) j["rope"]["local_theta"] = c.rope_theta_local;
  const std::size_t n = std::min<std::size_t>(4096, c.seq_len);
  j["context"] = n;
  j["kv_bytes"] = kv_bytes_rows(c, n);
  return j;
}

std::string render_model_info(const nlohmann::json& j) {
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) { out += fmt::format("{:<16} {}\n", k, v); };
  line("file", j["file"].get<std::string>());
  line("format", j["model_format"].get<std::string>() + ", architecture " + j["architecture"].get<std::string>());
  if (!j["runs"].get<bool>()) {
    line("akv runs it", j.contains("missing") ? "no: akv does not implement " + j["missing"].get<std::string>()
                                               : "no: " + j["error"].get<std::string>());
    return out;
  }
  line("akv runs it", "yes");
  line("shape", fmt::format("{} layers, {} query / {} KV heads, head_dim {}, dim {}, hidden {}, vocab {}", j["layers"].get<std::size_t>(),
                            j["heads"].get<std::size_t>(), j["kv_heads"].get<std::size_t>(), j["head_dim"].get<std::size_t>(),
                            j["dim"].get<std::size_t>(), j["hidden_dim"].get<std::size_t>(), j["vocab"].get<std::size_t>()));
  line("attention", j["attention"].get<std::string>());
  const nlohmann::json& r = j["rope"];
  line("rope", fmt::format("theta {}, {}, scaling {} (factor {}), {} rotary dims", r["theta"].get<double>(),
                           r["layout"].get<std::string>(), r["scaling"].get<std::string>(), r["factor"].get<double>(),
                           r["rotary_dims"].get<std::size_t>()) +
                           (r.contains("local_theta") ? fmt::format("; local layers theta {}, unscaled", r["local_theta"].get<double>())
                                                      : std::string()));
  line("trained context", std::to_string(j["trained_context"].get<std::size_t>()));
  line("weights", fmt::format("{:.3f} GB resident", j["weight_bytes"].get<double>() / 1e9));
  out += fmt::format("\nKV bytes per token (as akv plan counts them, at {} tokens)\n", j["context"].get<std::size_t>());
  for (const nlohmann::json& m : j["kv_bytes"]) {
    if (m.contains("unavailable")) {
      out += fmt::format("  {:<22} {}\n", m["method"].get<std::string>(), "n/a: " + m["unavailable"].get<std::string>());
    } else {
      out += fmt::format("  {:<22} {:>12.1f}  {}\n", m["method"].get<std::string>(), m["bytes_per_token"].get<double>(),
                         m["description"].get<std::string>());
    }
  }
  return out;
}

}  // namespace akv
