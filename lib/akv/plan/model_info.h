#pragma once
// `akv info MODEL`: what akv will do with a model directory (config.json + safetensors), a GGUF
// file or a llama2.c checkpoint (.bin): its architecture and shape, the attention of every layer,
// RoPE, the trained context, and the KV bytes per token of a few methods as `akv plan` counts
// them; for an architecture akv does not run, the feature it lacks (model/architecture.h).
// docs/model.md, "akv info on a model".
#include <string>

#include <nlohmann/json.hpp>

namespace akv {

// format "akv-model-info". Throws InvalidInput when path is not a directory, a GGUF file or a .bin
// (and what read_hf_config throws for a directory's config.json); what the model loader refuses
// (bad shapes, tensor types, missing weights) comes back as runs: false with its message in
// "error", an unsupported architecture as runs: false with the feature akv lacks in "missing".
nlohmann::json model_info(const std::string& path);
std::string render_model_info(const nlohmann::json& info);

}  // namespace akv
