#pragma once
// Outlier channels (KVQuant-style dense-and-sparse split): the key channels with the largest
// variance are cut out of the quantized block and kept in f16. One place for choosing them,
// splitting rows into inliers and outliers, and merging them back.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace akv {

// Number of outlier key channels for a head dimension: ceil(f * head_dim).
std::size_t outlier_count(double fraction, std::size_t head_dim);

// The k channels of x [rows, d] with the largest variance (ties: lower index), ascending.
std::vector<std::uint16_t> select_outlier_channels(const float* x, std::size_t rows, std::size_t d,
                                                   std::size_t k);

// x [rows, d] -> inliers [rows, d - k] (the other channels, in order) and outliers [rows, k]
// (the `channels`, ascending, k of them).
void split_outliers(const float* x, std::size_t rows, std::size_t d,
                    const std::vector<std::uint16_t>& channels, float* inliers, float* outliers);

// The inverse: x [rows, d] from inliers [rows, d - k] and outliers [rows, k].
void merge_outliers(const float* inliers, const float* outliers, std::size_t rows, std::size_t d,
                    const std::vector<std::uint16_t>& channels, float* x);

}  // namespace akv
