#pragma once
// A Hugging Face config.json as akv reads it: the shape and RoPE/norm fields of Llama-family
// models, each checked for its type (positive integers where sizes are meant). Used by the model
// loader (hf.h) and by `akv plan` (plan/plan.h); which fields and values a caller supports is
// its own decision.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/tensor/rope.h"

namespace akv {

struct HfConfig {
  std::string file;        // the config.json read (named in errors)
  std::string name;        // _name_or_path when given, else ""
  std::string model_type;  // "" when absent
  std::size_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, vocab_size = 0;
  std::size_t num_attention_heads = 0;
  std::size_t num_key_value_heads = 0;  // num_attention_heads when absent
  std::size_t head_dim = 0;             // hidden_size / num_attention_heads when absent or null
  std::optional<std::size_t> max_position_embeddings;
  std::optional<std::size_t> original_max_position_embeddings;  // Phi-3's top-level field (longrope)
  std::optional<std::size_t> sliding_window;  // absent or null: none
  std::size_t max_window_layers = 28;         // Qwen2/3: layers from this one on use the window
  bool use_sliding_window = false, tie_word_embeddings = false, attention_bias = false;
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
  std::string hidden_act = "silu", torch_dtype, akv_tokenizer;
  nlohmann::json rope_scaling;  // null when absent (hf_rope_scaling() reads it)
  std::size_t rotary_dim = 0;   // int(head_dim * partial_rotary_factor); head_dim by default
  // Gemma 3 (gemma3_text): layer_types ("sliding_attention" / "full_attention" per layer; when
  // absent, from sliding_window_pattern P as transformers does: layer i is local unless (i + 1) % P
  // == 0), the local layers' rope_local_base_freq, query_pre_attn_scalar, hidden_activation and
  // the soft-capping fields (nullopt when absent: the model's default; 0 for an explicit null:
  // none, as transformers reads None).
  std::vector<std::string> layer_types;
  std::optional<std::size_t> sliding_window_pattern;
  std::optional<double> rope_local_base_freq, query_pre_attn_scalar, final_logit_softcapping, attn_logit_softcapping;
  std::string hidden_activation;
  // Gemma 3's multimodal checkpoint (model_type gemma3 with a text_config): the fields above are
  // text_config's, model_type reads gemma3_text, and the language model's tensors carry a prefix
  // (language_model.model. or model.language_model.; the vision tower is not read).
  bool multimodal = false;
};

// Reads `path` (a config.json, or the directory holding one). Throws IoError when it cannot be
// opened, CorruptData when it is not a JSON object, InvalidInput naming the field for a
// model_type outside `model_types` (when given; checked first), a missing size, a wrong type,
// num_attention_heads not a multiple of num_key_value_heads, a rope_theta or rms_norm_eps that
// is not positive, or a partial_rotary_factor outside (0, 1] (or one that leaves an odd or empty
// rotary dimension).
HfConfig read_hf_config(const std::string& path, const std::vector<std::string>& model_types = {});

// The sliding window of each layer (0: global; empty: every layer global), as transformers reads
// the config: Gemma 2 and 3 from layer_types, else sliding_window_pattern P (Gemma 3, default 6:
// layer i global when (i + 1) % P == 0; Gemma 2, default 2: every other layer from layer 0
// local), window sliding_window (default 4096); qwen2 and qwen3 with use_sliding_window: the
// layers from max_window_layers on; other types (mistral, phi3): every layer when sliding_window
// is set.
std::vector<std::size_t> hf_layer_windows(const HfConfig& c);

// The config's rope_scaling as the model computes it (kind none when absent or "default").
// InvalidInput naming the field for another type than linear, dynamic, llama3, yarn or longrope
// ("su", its older name) or a missing or out-of-range value (longrope: factor lists of
// rotary_dim / 2 positive numbers). Only the model loader needs it: `akv plan`
// reads configs of any RoPE type.
RopeScaling hf_rope_scaling(const HfConfig& c);

}  // namespace akv
