#pragma once
// What today's inference engines accept of a per-head type assignment (`akv calibrate --types
// ... --emit vllm|llama.cpp`, docs/calibrate.md "Engine settings"). Engines store one cache type
// for every quantized layer and decide per layer at most, so the assignment is read per layer: a
// layer stays unquantized when at least half of its K and V tensors (2 n_kv_heads) were assigned
// f16.
//   vllm: the assignment's types besides f16 must be one vLLM cache dtype: fp8_e4m3 or fp8_e5m2
//     for keys and values, or a TurboQuant preset's pair (tq4nc/tqv4 turboquant_4bit_nc,
//     tq3nc/tqv4 turboquant_k3v4_nc, tq3nc/tqv3 turboquant_3bit_nc, fp8_e4m3/tqv4
//     turboquant_k8v4). Emits kv_cache_dtype, kv_cache_dtype_skip_layers (layer indices as
//     strings, vLLM's list[str]), the command-line flags, and for fp8 the per-layer scales
//     k_scale = max over the layer's KV heads of key_amax / fp8 max (v_scale likewise) under the
//     checkpoint tensor names vLLM loads (model.layers.L.self_attn.k_scale / v_scale).
//   llama.cpp: the types must be llama.cpp's (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl). Emits -ctk
//     and -ctv (the key / value type most heads outside the f16 layers were assigned, more bits
//     first on a tie), the flags, and the layers the assignment would keep in f16 (llama.cpp has
//     one type for every layer: advisory), with the rotation setting the calibration measured
//     (llama.cpp rotates quantized caches unless LLAMA_ATTN_ROT_DISABLE=1).
// InvalidInput naming the field when the calibration has no assignment (no --types), types the
// engine does not take, or a type with its own rotation ("q4_0+hadamard": engines rotate every
// quantized layer alike).
#include <string>

#include <nlohmann/json.hpp>

namespace akv {

nlohmann::json engine_settings(const nlohmann::json& calibration, const std::string& engine);

}  // namespace akv
