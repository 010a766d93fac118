#include "akv/quant/outliers.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace akv {
namespace {

std::vector<bool> channel_mask(std::size_t d, const std::vector<std::uint16_t>& channels) {
  std::vector<bool> is_outlier(d, false);
  for (std::uint16_t c : channels) is_outlier[c] = true;
  return is_outlier;
}

}  // namespace

std::vector<std::uint16_t> select_outlier_channels(const float* x, std::size_t rows, std::size_t d,
                                                   std::size_t k) {
  std::vector<double> mean(d, 0.0), var(d, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < d; ++c) mean[c] += x[r * d + c];
  }
  for (double& m : mean) m /= static_cast<double>(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < d; ++c) {
      const double e = x[r * d + c] - mean[c];
      var[c] += e * e;
    }
  }
  std::vector<std::uint16_t> order(d);
  std::iota(order.begin(), order.end(), std::uint16_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint16_t a, std::uint16_t b) { return var[a] > var[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::size_t outlier_count(double fraction, std::size_t head_dim) {
  if (fraction <= 0.0) return 0;
  return static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(head_dim) - 1e-9));
}

void split_outliers(const float* x, std::size_t rows, std::size_t d,
                    const std::vector<std::uint16_t>& channels, float* inliers, float* outliers) {
  const std::vector<bool> is_outlier = channel_mask(d, channels);
  const std::size_t k = channels.size(), cols = d - k;
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t a = 0, b = 0;
    for (std::size_t c = 0; c < d; ++c) {
      const float v = x[r * d + c];
      if (is_outlier[c]) {
        outliers[r * k + b++] = v;
      } else {
        inliers[r * cols + a++] = v;
      }
    }
  }
}

void merge_outliers(const float* inliers, const float* outliers, std::size_t rows, std::size_t d,
                    const std::vector<std::uint16_t>& channels, float* x) {
  const std::vector<bool> is_outlier = channel_mask(d, channels);
  const std::size_t k = channels.size(), cols = d - k;
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t a = 0, b = 0;
    for (std::size_t c = 0; c < d; ++c) {
      x[r * d + c] = is_outlier[c] ? outliers[r * k + b++] : inliers[r * cols + a++];
    }
  }
}

}  // namespace akv
