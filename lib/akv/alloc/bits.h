#pragma once
// Bit allocation across heads: the AdaKV-proxy rule of this project's seed (the exact knapsack
// over measured error curves is alloc/knapsack.h).
#include <cstddef>
#include <vector>

namespace akv {

// Running moments of a stream of values (key norms as tokens arrive).
struct RunningMoments {
  double sum = 0, sum_sq = 0;
  std::size_t count = 0;
  void add(double x) {
    sum += x;
    sum_sq += x * x;
    ++count;
  }
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
  double variance() const;  // population variance, >= 0
};

// AdaKV-proxy (seed): importance normalised to sum 1, scaled to H * target, clamped to
// [lo, hi], snapped to the nearest of {lo, mid, hi} (ties to the lower); then, while it brings
// the total closer to H * target, the head closest to the next boundary moves one step (up when
// the total is below, down when above). Equal importances give `target` when it is one of the
// levels. With target == lo every head gets lo.
std::vector<int> adakv_proxy_bits(const std::vector<double>& importance, double target, int lo,
                                  int mid, int hi);

}  // namespace akv
