#include "akv/alloc/bits.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "akv/core/errors.h"

namespace akv {

double RunningMoments::variance() const {
  if (count == 0) return 0.0;
  const double m = mean();
  return std::max(0.0, sum_sq / static_cast<double>(count) - m * m);
}

std::vector<int> adakv_proxy_bits(const std::vector<double>& importance, double target, int lo,
                                  int mid, int hi) {
  if (!(lo <= mid && mid <= hi)) {
    throw InvalidInput("need lo <= mid <= hi bits", {"", "--lo-bit/--mid-bit/--hi-bit",
                                                      std::to_string(lo) + "/" + std::to_string(mid) + "/" + std::to_string(hi)});
  }
  if (!(target >= lo && target <= hi)) {
    throw InvalidInput("target bits outside [lo, hi]", {"", "--target-bits", format_number(target)});
  }
  const std::size_t H = importance.size();
  std::vector<int> bits(H, lo);
  if (H == 0) return bits;
  double total = 0;
  for (double v : importance) total += std::max(0.0, v);
  const int levels[3] = {lo, mid, hi};
  for (std::size_t h = 0; h < H; ++h) {
    const double share = total > 0 ? std::max(0.0, importance[h]) / total : 1.0 / static_cast<double>(H);
    const double want = std::clamp(share * static_cast<double>(H) * target, static_cast<double>(lo), static_cast<double>(hi));
    int best = lo;
    for (int l : levels) {
      if (std::fabs(want - l) < std::fabs(want - best)) best = l;
    }
    bits[h] = best;
  }
  const double goal = static_cast<double>(H) * target;
  auto sum = [&]() {
    double s = 0;
    for (int b : bits) s += b;
    return s;
  };
  auto step = [&](int b, int dir) {  // next level up (dir 1) or down (-1), or b if none
    if (dir > 0) return b < mid ? mid : (b < hi ? hi : b);
    return b > mid ? mid : (b > lo ? lo : b);
  };
  for (;;) {
    const double s = sum();
    const int dir = s < goal ? 1 : -1;
    if (s == goal) break;
    // The head whose scaled importance is closest to its next boundary in that direction.
    std::size_t pick = H;
    double best_gap = std::numeric_limits<double>::infinity();
    for (std::size_t h = 0; h < H; ++h) {
      const int nb = step(bits[h], dir);
      if (nb == bits[h]) continue;
      const double share = total > 0 ? std::max(0.0, importance[h]) / total : 1.0 / static_cast<double>(H);
      const double want = share * static_cast<double>(H) * target;
      const double gap = std::fabs(0.5 * (bits[h] + nb) - want);
      if (gap < best_gap) {
        best_gap = gap;
        pick = h;
      }
    }
    if (pick == H) break;
    const int nb = step(bits[pick], dir);
    const double after = s + (nb - bits[pick]);
    if (std::fabs(after - goal) >= std::fabs(s - goal)) break;
    bits[pick] = nb;
  }
  return bits;
}

}  // namespace akv
