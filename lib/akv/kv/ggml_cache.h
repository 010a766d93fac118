#pragma once
// llama.cpp's KV cache types inside akv's decode loop (method `ggml:k=T:v=T`): every token's key
// row (after RoPE, as llama.cpp caches it) and value row of every KV head is quantized at once to
// ggml blocks of its type with ggml's reference quantizer (tensor/ggml_quant.h), no residual
// window; bytes() counts the blocks (Q4_0: 18 bytes per 32 values), and they are all it keeps.
// Attention reads the blocks (a tile dequantized at a time, then the f32 loops; F16 rows
// directly, as method none's), in f32: llama.cpp's CPU attention
// also rounds the query to the key type's dot-product type (Q8_0 for these types) and sums V
// in f16 when V is f16; akv does neither (docs/model.md, "llama.cpp cache types"). With
// rotate=hadamard the block types' rows are rotated first, as llama.cpp does by default since
// April 2026 (quant/rotation.h).
#include <memory>

#include "akv/kv/runtime.h"
#include "akv/method/params.h"

namespace akv {

// p.ggml() set. InvalidInput when head_dim is not a multiple of the block (32) for a block type.
std::unique_ptr<KvPolicy> make_ggml_policy(const CompressParams& p, const KvGeometry& g, int threads);

// The rotation of a key or value tensor of `type` (as llama.cpp: only block types rotate, F16
// rows never; TurboQuant's value rows never, as vLLM stores them).
Rotation ggml_rotation(RotationKind kind, std::uint64_t seed, const GgmlTypeInfo& type, std::size_t head_dim,
                       bool key);
// The rotation of a tensor of a per-head type `t` (method/ggml_params.h parse_head_type): its
// own suffix's (random: seed 0, as calibrate measures it), else the cache's `kind` and `seed`.
Rotation head_type_rotation(const HeadType& t, RotationKind kind, std::uint64_t seed, const GgmlTypeInfo& type,
                            std::size_t head_dim, bool key);

}  // namespace akv
