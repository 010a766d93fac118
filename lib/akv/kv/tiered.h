#pragma once
// The three-tier KV cache of the AKV seed, inside the model's decode loop (a KvPolicy).
//
// Every KV head keeps all of its tokens, in blocks of B tokens (B = the key quantization group):
//   hot   f16 rows (budget `hot` tokens, protected tokens included),
//   warm  quantized: keys per channel over the block, values per token (groups of 32 channels),
//         at warm_bits_key / warm_bits_value (budget `warm` tokens, unlimited when unset),
//   cold  int2 by default (cold_bits), or cold_bits 16: the host keeps an exact f16 copy of
//         every block that left the hot tier.
// Device bytes = hot + warm, host bytes = cold (and the f16 copies). Nothing is evicted.
//
// Importance per token: score = decay * score + w_attn * a + w_recency / (1 + age) after every
// decode step, a = the attention the token received (mean over the KV group's query heads),
// age = decode position - token position; the prompt's tokens start from the mean attention of
// the last 32 prompt queries. A block's score is the sum of its tokens'.
//
// Protected blocks stay hot: those holding one of the first `protect_first` positions (sinks),
// those holding one of the last `protect_last` positions, and the still-open last block. With
// `anchors` N, the ceil(N / B) highest-scoring unprotected hot blocks are never demoted.
// After the prompt and after every step: while hot holds more than `hot` tokens, the
// lowest-scoring (importance) or oldest (fifo) demotable hot block moves to warm; likewise warm
// to cold. Then (importance only) at most one promotion per tier boundary: a colder block whose
// score exceeds the weakest block above it by more than `margin` (relative, default 0.25: near
// ties would otherwise trade places every step) trades places with it. Each tier boundary
// promotes at most once every `block` decode steps (per head). Promotion from warm or int cold
// keeps the dequantized (lossy) values; with cold_bits 16 it restores the exact f16 rows.
// Rows stay in chronological order inside each tier; attention reads warm, cold, hot as three
// segments of the fused kernel.
#include <memory>

#include "akv/kv/runtime.h"
#include "akv/kv/stored_head.h"

namespace akv {

// The prompt queries whose mean attention starts the prompt tokens' importance (the last 32).
inline constexpr std::size_t kTieredPromptWindow = 32;

// One KV head's tiered cache driven token by token (the dump simulation of `akv compress
// --method tiered`): append a token, optionally observe its query heads' attention over view(),
// then end_step(); to_head_cache() gives the cache-file segments.
class TieredStream {
 public:
  TieredStream(const TieredParams& t, std::size_t head_dim);
  ~TieredStream();
  void append(const float* key, const float* value);  // post-RoPE rows [head_dim]
  KvView view() const;
  void observe(const float* probs, double weight);  // probabilities over view() rows
  void end_step();
  HeadCache to_head_cache() const;
  TierBytes bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<KvPolicy> make_tiered_policy(const CompressParams& params, const KvGeometry& g);

}  // namespace akv
