#pragma once
// What akv runs, by architecture name (Hugging Face model_type or GGUF general.architecture),
// and for the architectures it does not run, the feature it lacks: loaders name it in their
// refusal, `akv info` prints it (docs/model.md, "Architectures").
#include <string>
#include <vector>

namespace akv {

// Hugging Face model_type values akv runs, and GGUF architectures.
const std::vector<std::string>& supported_hf_model_types();    // llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text
const std::vector<std::string>& supported_gguf_architectures();  // llama, qwen2, qwen3, phi3, gemma2, gemma3

// "unsupported model_type X: akv does not implement <feature> (akv runs llama, mistral,
// qwen2)": the refusal text for an architecture outside `runs`, naming the missing feature of a
// known architecture (Qwen3-MoE's experts, Gemma 1's layers,
// DeepSeek's multi-head latent attention, Mamba hybrids, mixtures of experts, ...), or "not a
// Llama-family architecture akv knows" otherwise.
std::string unsupported_architecture(const std::string& kind, const std::string& name,
                                     const std::vector<std::string>& runs);
// The missing feature alone ("" for a name akv has no entry for).
std::string missing_feature(const std::string& name);

}  // namespace akv
