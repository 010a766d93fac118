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

std::vector<std::size_t> knapsack_min_error(const std::vector<std::vector<double>>& err,
                                            const std::vector<int>& cost, long long budget) {
  if (cost.empty()) throw InvalidInput("empty candidate set", {"", "--bits", ""});
  const std::size_t n = err.size(), k = cost.size();
  const int cmin = *std::min_element(cost.begin(), cost.end());
  if (static_cast<long long>(n) * cmin > budget) {
    throw InvalidInput("budget below the cheapest choice (needs " + std::to_string(static_cast<long long>(n) * cmin) + ")",
                       {"", "budget", std::to_string(budget)});
  }
  const long long B = std::min<long long>(budget, static_cast<long long>(n) * *std::max_element(cost.begin(), cost.end()));
  const double inf = std::numeric_limits<double>::infinity();
  // best[i][b]: minimal error of items [0, i) using exactly b cost units.
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(static_cast<std::size_t>(B) + 1, inf));
  std::vector<std::vector<int>> choice(n + 1, std::vector<int>(static_cast<std::size_t>(B) + 1, -1));
  best[0][0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    for (long long b = 0; b <= B; ++b) {
      if (best[i][static_cast<std::size_t>(b)] == inf) continue;
      for (std::size_t j = 0; j < k; ++j) {
        const long long nb = b + cost[j];
        if (nb > B) continue;
        const double v = best[i][static_cast<std::size_t>(b)] + err[i][j];
        double& slot = best[i + 1][static_cast<std::size_t>(nb)];
        if (v < slot) {
          slot = v;
          choice[i + 1][static_cast<std::size_t>(nb)] = static_cast<int>(j);
        }
      }
    }
  }
  long long end = -1;
  for (long long b = 0; b <= B; ++b) {
    if (best[n][static_cast<std::size_t>(b)] < (end < 0 ? inf : best[n][static_cast<std::size_t>(end)])) end = b;
  }
  std::vector<std::size_t> pick(n);
  for (std::size_t i = n; i > 0; --i) {
    const int j = choice[i][static_cast<std::size_t>(end)];
    pick[i - 1] = static_cast<std::size_t>(j);
    end -= cost[static_cast<std::size_t>(j)];
  }
  return pick;
}

}  // namespace akv
