#pragma once
// CriticalKV (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output
// Perturbation Perspective"), as kvpress's CriticalKVPress / CriticalAdaKVPress compute it: a
// token's score is weighed by how far its value moves the attention output, the L1 norm of the
// value through the layer's output projection W_o, and each head keeps its tokens in two stages
// (docs/eviction.md, "CriticalKV").
#include <cstddef>
#include <functional>
#include <vector>

#include "akv/tensor/tensor.h"

namespace akv {

// A layer's attention output projection [hidden, n_heads * head_dim] (y = W_o o, Hugging Face's
// o_proj.weight): query head h's slice is columns [h * head_dim, (h + 1) * head_dim).
using OutProjSource = std::function<void(std::size_t layer, RowMatrix& wo)>;

// Per query head h: [n_heads][T] of the p-norm (p = 1 or 2) of W_o[h] v_t, v_t the row of h's KV
// head (KVzip+ reads p = 2). Fast path as below; the reference in f64.
std::vector<std::vector<double>> head_value_out_norms(const Tensor3& value, const RowMatrix& wo, std::size_t n_heads,
                                                      int p, int threads = 1);
std::vector<std::vector<double>> head_value_out_norms_ref(const Tensor3& value, const RowMatrix& wo,
                                                          std::size_t n_heads, int p);

// kvpress's vwl1norm: for KV head g and token t, the mean over the query heads h of g's group
// (h = g * group + j) of sum_j' |sum_i v_t[i] W_o[j', h * d + i]|. value [n_kv_heads, T, d];
// returns [n_kv_heads][T]. The fast path multiplies blocks of tokens by each head's slice in f32
// (Eigen) and sums each row's absolute values in f64, heads on `threads` threads (the same bits
// for any count).
std::vector<std::vector<double>> projected_value_norms(const Tensor3& value, const RowMatrix& wo,
                                                       std::size_t n_heads, int threads = 1);
// The plain reference: every product and sum in f64.
std::vector<std::vector<double>> projected_value_norms_ref(const Tensor3& value, const RowMatrix& wo,
                                                           std::size_t n_heads);

// kvpress's epsilon of the second stage, (score + epsilon) * norm.
inline constexpr double kCriticalEpsilon = 1e-4;

// The two stages of one head. `order`: the head's selectable positions sorted by score, best first
// (ties by position); the head keeps `keep` of them. Stage 1 keeps the first `first` (<= keep);
// stage 2 the best keep - first of the others by (score[t] + kCriticalEpsilon) * norm[t] (ties: the
// earlier position). Rearranges `order` so that its first `keep` entries are the kept positions,
// stage 1's first.
void critical_select(std::vector<std::size_t>& order, std::size_t keep, std::size_t first,
                     const std::vector<double>& score, const std::vector<double>& norm);

}  // namespace akv
