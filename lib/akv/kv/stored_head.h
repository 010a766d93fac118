#pragma once
// One compressed KV head: how a [n_tokens, head_dim] key and value tensor become quantized
// codes, f16 residual tokens and f16 outlier channels, and how they are rebuilt.
//
// Of the n kept tokens (all tokens, or the positions in `kept` after eviction), the first
// n_quant are quantized and the remaining n_residual = n - n_quant stay in f16 (KIVI's residual
// window); quantized_rows() (quant/quant_params.h) says how many.
// Outlier key channels (largest variance over the quantized tokens) are cut out of the quantized
// block and stored in f16. Pre-RoPE keys are quantized before RoPE and rotated back after
// dequantization; the residual always holds the post-RoPE keys.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/kv/stored_tensor.h"
#include "akv/kv/tensor_builder.h"
#include "akv/quant/outliers.h"
#include "akv/quant/quant_params.h"
#include "akv/tensor/rope.h"

namespace akv {

// One head as akv compress writes it: the key and value tensors in their stored form (packed
// rows = the n_quant quantized tokens, dense f16 rows = the n_residual window; or ggml rows).
struct HeadCache {
  std::size_t n_tokens = 0;     // tokens of the source sequence
  std::size_t head_dim = 0;
  std::vector<std::int32_t> kept;  // kept positions, ascending; empty = all tokens
  PackedTensor key, value;
  // Tiered heads: every token sits in exactly one segment (warm, cold, hot), each a head of its
  // own (kept positions, quantizer); key/value above are then empty and kept is all tokens.
  std::vector<HeadCache> segments;

  std::size_t n_kept() const { return kept.empty() ? n_tokens : kept.size(); }
  std::size_t position(std::size_t i) const { return kept.empty() ? i : static_cast<std::size_t>(kept[i]); }
  CacheBytes bytes() const;  // key + value + 4 bytes per kept index
};

// What compress_head reads: rows are the kept tokens in order.
struct HeadInput {
  const float* key = nullptr;           // [n, head_dim] after RoPE
  const float* key_pre_rope = nullptr;  // [n, head_dim], needed when params.pre_rope
  const float* value = nullptr;         // [n, head_dim]
  std::size_t n = 0, head_dim = 0, n_tokens = 0;
  std::vector<std::int32_t> kept;       // empty = rows are positions 0..n-1 (n == n_tokens)
};

// Fast path: each tensor through kv/tensor_builder.h (the runtime caches' builder, the whole
// sequence appended at once). compress_head_ref is its plain reference (scalar quantizer and f16
// conversion); both give identical caches.
HeadCache compress_head(const HeadInput& in, const QuantParams& p);
HeadCache compress_head_ref(const HeadInput& in, const QuantParams& p);

// Rebuilds the kept rows: key (after RoPE) and value, each [n_kept, head_dim] f32, rotated rows
// rotated back (segmented heads: every segment's rows land at their positions).
// `rope` must cover the kept positions when the key was quantized before RoPE.
void reconstruct_head(const HeadCache& h, const RopeContext& rope, float* key, float* value);

}  // namespace akv
