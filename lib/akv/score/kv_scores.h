#pragma once
// The scores that read only a head's keys and values (score.h's knorm, keydiff, lagkv), in f64
// over the stored f32 rows. key, value: [n_kv_heads, n_tokens, head_dim]; each returns [T] for
// KV head h (higher = keep).
#include <cstddef>
#include <vector>

#include "akv/tensor/tensor.h"

namespace akv {

// knorm: -|k_t| (kvpress KnormPress).
std::vector<double> knorm_scores(const Tensor3& key, std::size_t h, std::size_t T, std::size_t d);
// keydiff: -cos(k_t, a), a the mean over the T tokens of k_t / max(|k_t|, 1e-12); the cosine's
// denominator max(|k| |a|, 1e-8) (kvpress KeyDiffPress: F.normalize, F.cosine_similarity).
std::vector<double> keydiff_scores(const Tensor3& key, std::size_t h, std::size_t T, std::size_t d);
// lagkv: LagKV's ranks (score.h); 1 for the first `sinks` tokens and the tail.
std::vector<double> lagkv_scores(const Tensor3& key, const Tensor3& value, std::size_t h, std::size_t T,
                                 std::size_t d, std::size_t sinks, std::size_t lag);

}  // namespace akv
