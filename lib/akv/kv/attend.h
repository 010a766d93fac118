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
// (decode_attention_ref), without observe(). mode: the fast path's exact or int8 loops. softcap:
// Gemma 2's logit soft-capping (DecodeAttentionArgs::softcap; 0: none).
void attend_layer(KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_heads, std::size_t n_kv_heads,
                  std::size_t head_dim, float* out, int threads, bool reference = false,
                  AttentionMode mode = AttentionMode::exact, float softcap = 0.0f);

// The attention of n_tokens consecutive tokens of one sequence whose rows the cache already
// holds, in order, as the last n_tokens rows of every KV head's view (KvPolicy::appends_in_place):
// q [n_tokens][n_heads * head_dim] (after RoPE) -> out, the same layout; token j attends to every
// row but the n_tokens - 1 - j after its own. One decode_attention call reads each row once for
// every token (DecodeAttentionArgs::visible), instead of once per token; each token's output
// equals attend_layer's after its own append up to the order of its sums. window (a sliding-window
// layer's, 0: none): token j at position p attends only to rows at positions p - window + 1 ..
// (DecodeAttentionArgs::first; rows in position order, as a windowed cache under the chunked
// protocol holds them).
void attend_layer_block(const KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_tokens,
                        std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim, float* out, int threads,
                        AttentionMode mode = AttentionMode::exact, float softcap = 0.0f, std::size_t window = 0);

}  // namespace akv
