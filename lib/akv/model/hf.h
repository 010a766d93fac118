#pragma once
// Hugging Face checkpoints: a directory with config.json (read by model/hf_config.h: the
// architectures and fields it lists) and model.safetensors (or a sharded
// model.safetensors.index.json). model_type llama, mistral, qwen2 (q/k/v biases), qwen3 (q_norm /
// k_norm: RMSNorm of each query and key head before RoPE), phi3 (fused qkv_proj and gate_up_proj,
// split on load), gemma2 and gemma3_text (or Gemma 3's multimodal checkpoint's language model);
// GQA; tied or untied embeddings; tensors in F32, F16 or BF16 (kept 16-bit in a memory map, or
// converted to f32 on load: WeightMode); RoPE in the rotate-half layout.
//
// Every safetensors header is validated against the file size (offsets inside the data
// section, sizes equal to shape x dtype) before any tensor is read, and every tensor's shape
// against the config; what the config asks and akv does not run is an error naming the field.
#include <string>

#include "akv/model/model.h"

namespace akv {

// mode stored: F16/BF16 matrices stay 16-bit in a memory map of their shard (weight.h).
Model load_hf(const std::string& dir, WeightMode mode = WeightMode::stored);

}  // namespace akv
