#pragma once
// Expected Attention (kvpress's ExpectedAttentionPress, arXiv 2510.00636): how much attention the
// queries still to come are expected to pay each key, without seeing them.
//
// Per query head, the queries at positions >= sinks are taken back before RoPE (plain RoPE of the
// shape's theta and layout) and fitted by a Gaussian: mean mu, covariance S (divided by their
// count N). R is the mean over the next `future` positions n_tokens .. n_tokens + future - 1 of
// the RoPE rotation (per pair: mean cos, mean sin). With mu' = R mu and S' = R S R^T, key t >= sinks
// gets the logit  mu'.k_t / sqrt(d) + k_t^T S' k_t / (2 d)  (the second term only with
// covariance); the logits of the tokens after the sinks go through a softmax, the group's query
// heads are reduced (gqa_reduce; kvpress: mean) and, with vnorm, multiplied by |v_t|. Positions
// below `sinks` score 0 (the caller keeps them). All in f64.
#include <cstddef>
#include <vector>

#include "akv/score/score.h"

namespace akv {

// InvalidInput when the shape's RoPE is not plain RoPE (rope_variant) or `future` is 0.
void validate_expected_attention(const ScoreOptions& o, const KvWindow& m);

// The mean RoPE rotation over positions [first, first + n), a row-major [d, d] matrix: pair
// (a, b) of frequency f gets [[c, -s], [s, c]] with c, s the means of cos(p f), sin(p f).
std::vector<double> mean_rope_rotation(std::size_t head_dim, double theta, RopeLayout layout, std::size_t first,
                                       std::size_t n);

// Scores [n_tokens] of KV head h (score.h's layout of query, key, value). Fast path (Eigen, f64)
// and plain loops.
std::vector<double> expected_attention(const Tensor3& query, const Tensor3& key, const Tensor3* value,
                                       std::size_t h, const KvWindow& m, const ScoreOptions& o, std::size_t sinks);
std::vector<double> expected_attention_ref(const Tensor3& query, const Tensor3& key, const Tensor3* value,
                                           std::size_t h, const KvWindow& m, const ScoreOptions& o,
                                           std::size_t sinks);

}  // namespace akv
