#pragma once
// Q-Filters (Godey et al. 2025, "Q-Filters: Leveraging QK Geometry for Efficient KV Cache
// Compression"; kvpress QFilterPress): a key's score is its projection on the principal direction
// of the model's queries, a direction fitted once on calibration queries (`akv calibrate`) and
// applied to any prompt without reading its queries (docs/eviction.md, "Q-Filters").
//
// Fitting, as the authors' make_filters.py: for each query head, the first right singular vector
// v of its calibration query rows (after RoPE, not centred), oriented so that more than half of
// the rows project positively on it (the sign of the left singular vector's majority); the filter
// of a KV head is minus the mean of its query heads' oriented vectors (so that a key's score,
// -(filter . k), grows with its projection on the queries' direction). Orientation when neither
// sign has a strict majority (left open by the original, which then takes -v for whichever sign
// its SVD returned): the sign with the larger sum of projections, then the first nonzero component
// positive. Rows that are all zero give a zero direction (every key scores 0).
#include <cstddef>
#include <vector>

#include "akv/tensor/tensor.h"

namespace akv {

// The oriented unit principal direction of n rows of d values (row-major). Fast path: the Gram
// matrix X^T X in f64 and its top eigenvector (Eigen's SelfAdjointEigenSolver); the reference:
// Eigen's JacobiSVD of X itself in f64 (no squared condition number). They agree within a few
// 1e-12 / (relative gap of the top two singular values squared).
std::vector<double> query_direction(const float* rows, std::size_t n, std::size_t d);
std::vector<double> query_direction_ref(const float* rows, std::size_t n, std::size_t d);

// A layer's filters [n_kv_heads][d] from its calibration queries [n_heads, n, d] (every row a
// sample; the rows of several prompts stacked). Query heads on `threads` threads (the same bits for
// any count).
std::vector<std::vector<double>> fit_qfilters(const Tensor3& queries, std::size_t n_kv_heads, int threads = 1);
std::vector<std::vector<double>> fit_qfilters_ref(const Tensor3& queries, std::size_t n_kv_heads);

// KV head h's scores over its T keys: -(filter . k_t) in f64 (key [n_kv_heads, T, d]).
std::vector<double> qfilter_scores(const Tensor3& key, std::size_t h, const std::vector<double>& filter);

}  // namespace akv
