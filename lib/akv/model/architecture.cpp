#include "akv/model/architecture.h"

#include <utility>

namespace akv {

const std::vector<std::string>& supported_hf_model_types() {
  static const std::vector<std::string> t = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"};
  return t;
}

const std::vector<std::string>& supported_gguf_architectures() {
  static const std::vector<std::string> t = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"};
  return t;
}

std::string missing_feature(const std::string& name) {
  // Hugging Face model_type and GGUF general.architecture spellings.
  static const std::vector<std::pair<std::vector<std::string>, std::string>> table = {
      {{"qwen3_moe", "qwen3moe"}, "per-head q/k RMSNorm and a mixture-of-experts MLP"},
      {{"gemma"}, "Gemma 1's layers (two norms per layer; akv runs Gemma 2 and Gemma 3)"},
      {{"gemma3"}, "a multimodal Gemma 3 config without its text_config (akv runs the language model of "
                   "Gemma3ForConditionalGeneration from its text_config, and gemma3_text)"},
      {{"phi3small"}, "Phi-3-small's block-sparse attention and GeGELU MLP"},
      {{"deepseek_v2", "deepseek_v3", "deepseek2", "deepseek3"},
       "multi-head latent attention (MLA: compressed KV with decoupled RoPE keys)"},
      {{"mamba", "mamba2", "jamba", "zamba2", "falcon_h1", "nemotron_h", "qwen3_next", "granitemoehybrid", "lfm2"},
       "state-space / linear-attention layers (a hybrid model has no KV cache in those layers)"},
      {{"mixtral", "qwen2_moe", "qwen2moe", "olmoe", "dbrx", "gpt_oss", "gpt-oss"}, "mixture-of-experts MLP"},
      {{"gpt2", "gpt_neox", "gptneox", "gptj", "falcon", "bloom", "opt", "mpt", "starcoder", "phi", "phi2"},
       "its non-Llama block (LayerNorm, GELU MLP, other attention layout)"},
  };
  for (const auto& [names, feature] : table) {
    for (const std::string& n : names) {
      if (n == name) return feature;
    }
  }
  return "";
}

std::string unsupported_architecture(const std::string& kind, const std::string& name,
                                     const std::vector<std::string>& runs) {
  std::string list;
  for (const std::string& r : runs) list += (list.empty() ? "" : ", ") + r;
  const std::string feature = missing_feature(name);
  return "unsupported " + kind + ": akv does not implement " +
         (feature.empty() ? "this architecture (not a Llama-family model akv knows)" : feature) + " (akv runs " + list + ")";
}

}  // namespace akv
