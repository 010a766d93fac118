#pragma once
// One decode step's attention for one layer through a cache (what the model's decode loop and
// `akv bench policy` both run): the fused decode attention over the cache's views of every KV
// head, then the probabilities to observe() when the cache wants them.
#include <cstddef>

#include "akv/attention/decode_attention.h"
#include "akv/kv/policy.h"

namespace akv {

// q [n_heads, head_dim] (after RoPE) -> out [n_heads, head_dim], scale 1/sqrt(head_dim), on
// `threads` threads (bitwise identical for any count). reference: the plain loops
// (decode_attention_ref), without observe(). mode: the fast path's exact or int8 loops.
void attend_layer(KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_heads, std::size_t n_kv_heads,
                  std::size_t head_dim, float* out, int threads, bool reference = false,
                  AttentionMode mode = AttentionMode::exact);

}  // namespace akv
