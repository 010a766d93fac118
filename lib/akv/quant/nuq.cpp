#include "akv/quant/nuq.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/core/sort.h"
#include "akv/quant/nuq_avx512.h"
#include "akv/quant/pack.h"
#include "akv/tensor/codes8.h"
#include "akv/tensor/half.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace akv {
namespace {

// torch.quantile's rank of q in a row of n values: q as f32, times n - 1 in f32.
float quantile_rank(std::size_t n, double q) { return static_cast<float>(q) * static_cast<float>(n - 1); }

// The positions of the sorted values torch.quantile(row, q) reads: below and above its rank.
std::pair<std::size_t, std::size_t> quantile_neighbours(std::size_t n, double q) {
  const float rank = quantile_rank(n, q);
  return {static_cast<std::size_t>(rank), std::min(n - 1, static_cast<std::size_t>(std::ceil(rank)))};
}

// torch.quantile(row, q) (linear) as torch computes it for an f32 row: its rank, then torch's
// lerp between the neighbours in f32. `sorted`: the row's n >= 1 values, those at
// quantile_neighbours(n, q) where a sort puts them.
float torch_quantile(const float* sorted, std::size_t n, double q) {
  const float rank = quantile_rank(n, q);
  const auto [below, above] = quantile_neighbours(n, q);
  const float w = rank - static_cast<float>(below);
  const float a = sorted[below], b = sorted[above];
  return std::fabs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// Puts the values of [first, last) of ranks r[0..k) (ascending, distinct, counted from base) in
// place as a sort would, the others between them in any order: each selection splits the rest.
template <class T>
void select_ranks(T* first, T* last, const std::size_t* r, std::size_t k, std::size_t base) {
  if (k == 0) return;
  const std::size_t mid = k / 2;
  T* at = first + (r[mid] - base);
  std::nth_element(first, at, last);
  select_ranks(first, at, r, mid, base);
  select_ranks(at + 1, last, r + mid + 1, k - mid - 1, r[mid] + 1);
}

// The order statistics of some ranks of rows of n values, where a sort puts them: when every rank
// is within kEnds of the row's ends (a nuq table's thresholds at a head's width), by insertion
// networks of min and max (no branch a value; a sort's values, in any order among equal ones),
// else by selection.
template <class T>
class RankSelector {
 public:
  static constexpr std::size_t kEnds = 4;

  RankSelector(std::size_t n, std::vector<std::size_t> ranks) : n_(n), sorted_(n), ranks_(std::move(ranks)) {
    std::sort(ranks_.begin(), ranks_.end());
    ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
    networks_ = n >= 2 * kEnds && std::all_of(ranks_.begin(), ranks_.end(), [&](std::size_t r) {
                  return r < kEnds || r >= n - kEnds;
                });
  }

  // Row x's values at the ranks, each at its rank of the returned array (the other entries
  // unspecified).
  const T* operator()(const T* x) {
    T* s = sorted_.data();
    if (networks_) {
      T bottom[kEnds], top[kEnds];  // ascending from the least; descending from the greatest
      std::fill_n(bottom, kEnds, std::numeric_limits<T>::infinity());
      std::fill_n(top, kEnds, -std::numeric_limits<T>::infinity());
      for (std::size_t j = 0; j < n_; ++j) {
        T b = x[j], t = x[j];
        for (std::size_t e = 0; e < kEnds; ++e) {
          const T lo = std::min(bottom[e], b), hi = std::max(top[e], t);
          b = std::max(bottom[e], b);
          t = std::min(top[e], t);
          bottom[e] = lo;
          top[e] = hi;
        }
      }
      for (std::size_t e = 0; e < kEnds; ++e) {
        s[e] = bottom[e];
        s[n_ - 1 - e] = top[e];
      }
    } else {
      std::copy_n(x, n_, s);
      select_ranks(s, s + n_, ranks_.data(), ranks_.size(), 0);
    }
    return s;
  }

 private:
  std::size_t n_;
  std::vector<T> sorted_;
  std::vector<std::size_t> ranks_;
  bool networks_ = false;
};

// torch.quantile(row, 1 - q) and torch.quantile(row, q) of rows of n values (q in [0.5, 1]).
class RowQuantiles {
 public:
  RowQuantiles(std::size_t n, double q) : n_(n), q_(q), select_(n, ranks(n, q)) {}

  // {lo, hi} of row x.
  std::pair<float, float> operator()(const float* x) {
    const float* s = select_(x);
    return {torch_quantile(s, n_, 1.0 - q_), torch_quantile(s, n_, q_)};
  }

 private:
  static std::vector<std::size_t> ranks(std::size_t n, double q) {
    const auto [lo_below, lo_above] = quantile_neighbours(n, 1.0 - q);
    const auto [hi_below, hi_above] = quantile_neighbours(n, q);
    return {lo_below, lo_above, hi_below, hi_above};
  }

  std::size_t n_;
  double q_;
  RankSelector<float> select_;
};

// numpy.percentile(v, q_lo) and numpy.percentile(v, q_hi) of rows of n values.
class RowPercentiles {
 public:
  RowPercentiles(std::size_t n, double q_lo, double q_hi) : n_(n), q_lo_(q_lo), q_hi_(q_hi), select_(n, ranks(n)) {}

  // {lo, hi} of row x.
  std::pair<double, double> operator()(const double* x) {
    const double* s = select_(x);
    return {percentile_sorted(s, n_, q_lo_), percentile_sorted(s, n_, q_hi_)};
  }

 private:
  // The positions percentile_sorted reads: i and i + 1 of the sorted values (i alone at the top).
  std::vector<std::size_t> ranks(std::size_t n) const {
    std::vector<std::size_t> r;
    for (const double q : {q_lo_, q_hi_}) {
      const double f = std::floor(static_cast<double>(n - 1) * (q / 100.0));
      const std::size_t i = f >= static_cast<double>(n - 1) ? n - 1 : f < 0 ? 0 : static_cast<std::size_t>(f);
      r.push_back(i);
      r.push_back(std::min(i + 1, n - 1));
    }
    return r;
  }

  std::size_t n_;
  double q_lo_, q_hi_;
  RankSelector<double> select_;
};

// Lloyd rounds shared by the fast path and the reference: `assign` fills, for levels c, the
// cluster sums (weight, weighted value) and returns the assignment's signature (fast: the run
// boundaries; ref: every value's cluster).
template <class Assign>
std::vector<double> lloyd(const std::vector<double>& seeds, std::size_t max_iter, Assign assign) {
  std::vector<double> c = seeds, sw(c.size()), swx(c.size());
  std::vector<std::size_t> prev, cur;
  for (std::size_t it = 0; it < max_iter; ++it) {
    std::fill(sw.begin(), sw.end(), 0.0);
    std::fill(swx.begin(), swx.end(), 0.0);
    cur = assign(c, sw, swx);
    if (it > 0 && cur == prev) break;
    for (std::size_t j = 0; j < c.size(); ++j) {
      if (sw[j] > 0) c[j] = swx[j] / sw[j];
    }
    std::sort(c.begin(), c.end());
    prev.swap(cur);
  }
  return c;
}

// Cluster of value x under ascending levels c: the number of midpoints (c_j + c_{j+1}) / 2 below
// x (a value on a midpoint goes to the lower level).
std::size_t cluster_of(const std::vector<double>& c, double x) {
  std::size_t j = 0;
  while (j + 1 < c.size() && x > 0.5 * (c[j] + c[j + 1])) ++j;
  return j;
}

using Sorted = KMeansInput::Sorted;

Sorted sort_weighted(const std::vector<double>& x, const std::vector<double>& w) {
  if (x.empty()) throw InvalidInput("k-means of no values", {"", "values", "0"});
  if (!w.empty() && w.size() != x.size()) throw std::logic_error("kmeans_1d: one weight per value");
  Sorted s;
  if (w.empty()) {  // equal values are interchangeable: the values alone
    s.x = x;
    sort_values(s.x);
    s.w.assign(x.size(), 1.0);
  } else {  // the values' stable order (equal values by index), their weights alongside
    s.x.reserve(x.size());
    s.w.reserve(x.size());
    for (const std::uint32_t i : stable_order(x)) {
      s.x.push_back(x[i]);
      s.w.push_back(w[i]);
    }
  }
  s.pw.assign(x.size() + 1, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) s.pw[i + 1] = s.pw[i] + s.w[i];
  return s;
}

// Seeds: the weighted quantiles (j + 1/2) / k, each the first value (from the previous seed's
// on) whose cumulative weight reaches it; by_count: every weight taken as 1. The plain walk (the
// reference's); seeds_searched finds the same values by search.
std::vector<double> seeds_walked(const Sorted& s, std::size_t k, bool by_count) {
  std::vector<double> c;
  const double total = by_count ? static_cast<double>(s.x.size()) : s.pw.back();
  const auto weight = [&](std::size_t i) { return by_count ? 1.0 : s.w[i]; };
  double cum = 0;
  std::size_t i = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const double target = (static_cast<double>(j) + 0.5) / static_cast<double>(k) * total;
    for (; i + 1 < s.x.size() && cum + weight(i) < target; ++i) cum += weight(i);
    c.push_back(s.x[i]);
  }
  return c;
}

// The walk's cumulative weight through value i is pw[i + 1] (the same running sum), or i + 1 by
// count: the first i with pw[i + 1] >= target by binary search, i = ceil(target) - 1 by count.
std::vector<double> seeds_searched(const Sorted& s, std::size_t k, bool by_count) {
  std::vector<double> c;
  const std::size_t n = s.x.size();
  const double total = by_count ? static_cast<double>(n) : s.pw[n];
  std::size_t i = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const double target = (static_cast<double>(j) + 0.5) / static_cast<double>(k) * total;
    if (by_count) {
      i = std::max(i, static_cast<std::size_t>(std::ceil(target)) - 1);
    } else {
      const auto pw = s.pw.begin();
      i = static_cast<std::size_t>(std::lower_bound(pw + static_cast<std::ptrdiff_t>(i) + 1,
                                                    pw + static_cast<std::ptrdiff_t>(n), target) - pw) - 1;
    }
    i = std::min(i, n - 1);
    c.push_back(s.x[i]);
  }
  return c;
}

// The starting levels Lloyd's rounds run from: the weighted quantiles (j + 1/2) / k, the same
// quantiles by count, and k levels evenly spaced over [min, max] (a weighted fit's quantile seeds
// may crowd where the weight is and stop in a worse local optimum). seeds_of: seeds_walked or
// seeds_searched.
using SeedsOf = std::vector<double> (*)(const Sorted&, std::size_t, bool);
std::vector<std::vector<double>> candidate_seeds(const Sorted& s, std::size_t k, SeedsOf seeds_of) {
  std::vector<std::vector<double>> seeds = {seeds_of(s, k, false), seeds_of(s, k, true)};
  std::vector<double> even(k);
  const double lo = s.x.front(), hi = s.x.back();
  for (std::size_t j = 0; j < k; ++j) {
    even[j] = k == 1 ? 0.5 * (lo + hi) : lo + (hi - lo) * static_cast<double>(j) / static_cast<double>(k - 1);
  }
  seeds.push_back(std::move(even));
  return seeds;
}

// Lloyd's rounds from every candidate seeding; the levels of least cost (the first on ties).
template <class Run>
std::vector<double> best_of_seeds(const Sorted& s, std::size_t k, SeedsOf seeds_of, const std::vector<double>& x,
                                  const std::vector<double>& w, Run run) {
  std::vector<double> best;
  double best_cost = INFINITY;
  // A seeding or levels met before cannot do better (the same rounds, the same cost, and a tie
  // keeps the first): unweighted fits' two quantile seedings are one.
  std::vector<std::vector<double>> seeds_met, levels_met;
  const auto met = [](const std::vector<std::vector<double>>& v, const std::vector<double>& e) {
    return std::find(v.begin(), v.end(), e) != v.end();
  };
  for (const std::vector<double>& seed : candidate_seeds(s, k, seeds_of)) {
    if (met(seeds_met, seed)) continue;
    seeds_met.push_back(seed);
    std::vector<double> c = run(seed);
    if (met(levels_met, c)) continue;
    levels_met.push_back(c);
    const double cost = kmeans_1d_cost(x, w, c);
    if (cost < best_cost) {
      best_cost = cost;
      best = std::move(c);
    }
  }
  return best;
}

}  // namespace

double percentile_sorted(const double* x, std::size_t n, double q) {
  if (n == 0) throw std::logic_error("percentile_sorted: no values");
  const double v = static_cast<double>(n - 1) * (q / 100.0);
  const double f = std::floor(v);
  if (f >= static_cast<double>(n - 1)) return x[n - 1];
  if (f < 0) return x[0];
  const auto i = static_cast<std::size_t>(f);
  const double g = v - f, a = x[i], b = x[i + 1], d = b - a;
  return g >= 0.5 ? b - d * (1.0 - g) : a + d * g;
}

KMeansInput::KMeansInput(std::vector<double> x, std::vector<double> w)
    : x_(std::move(x)), w_(std::move(w)), sorted_(sort_weighted(x_, w_)) {
  const std::size_t n = sorted_.x.size();
  pwx_.assign(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) pwx_[i + 1] = pwx_[i] + sorted_.w[i] * sorted_.x[i];
}

std::vector<double> kmeans_1d(const std::vector<double>& x, const std::vector<double>& w, std::size_t k,
                              std::size_t max_iter) {
  return KMeansInput(x, w).fit(k, max_iter);
}

std::vector<double> KMeansInput::fit(std::size_t k, std::size_t max_iter) const {
  const Sorted& s = sorted_;
  const std::vector<double>&pw = s.pw, &pwx = pwx_;
  const std::size_t n = s.x.size();
  return best_of_seeds(s, k, seeds_searched, x_, w_, [&](const std::vector<double>& seed) {
    return lloyd(seed, max_iter, [&](const std::vector<double>& c, std::vector<double>& sw, std::vector<double>& swx) {
    std::vector<std::size_t> end(c.size());
    std::size_t start = 0;
    for (std::size_t j = 0; j < c.size(); ++j) {
      // Values of cluster j: up to the last one not above the midpoint to the next level.
      end[j] = j + 1 == c.size() ? n
                                 : static_cast<std::size_t>(std::upper_bound(s.x.begin(), s.x.end(), 0.5 * (c[j] + c[j + 1])) -
                                                            s.x.begin());
      end[j] = std::max(end[j], start);
      sw[j] = pw[end[j]] - pw[start];
      swx[j] = pwx[end[j]] - pwx[start];
      start = end[j];
    }
    return end;
    });
  });
}

std::vector<double> kmeans_1d_ref(const std::vector<double>& x, const std::vector<double>& w, std::size_t k,
                                  std::size_t max_iter) {
  const Sorted s = sort_weighted(x, w);
  return best_of_seeds(s, k, seeds_walked, x, w, [&](const std::vector<double>& seed) {
    return lloyd(seed, max_iter, [&](const std::vector<double>& c, std::vector<double>& sw, std::vector<double>& swx) {
    std::vector<std::size_t> a(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      a[i] = cluster_of(c, x[i]);
      const double wi = w.empty() ? 1.0 : w[i];
      sw[a[i]] += wi;
      swx[a[i]] += wi * x[i];
    }
    // Cluster sizes as the signature (the assignment of sorted values is determined by them).
    std::vector<std::size_t> count(c.size(), 0);
    for (const std::size_t j : a) ++count[j];
    std::partial_sum(count.begin(), count.end(), count.begin());
    return count;
    });
  });
}

double kmeans_1d_cost(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& levels) {
  // Each value's least squared distance (a minimum: the same in any order) for a block of values
  // at a time, level by level (vectors of values), then the sum in the values' order.
  constexpr std::size_t kBlock = 256;
  double best[kBlock];
  double cost = 0;
  for (std::size_t i0 = 0; i0 < x.size(); i0 += kBlock) {
    const std::size_t m = std::min(kBlock, x.size() - i0);
    const double* xb = x.data() + i0;
    std::fill_n(best, m, INFINITY);
    for (const double c : levels) {
      for (std::size_t i = 0; i < m; ++i) best[i] = std::min(best[i], (xb[i] - c) * (xb[i] - c));
    }
    for (std::size_t i = 0; i < m; ++i) cost += (w.empty() ? 1.0 : w[i0 + i]) * best[i];
  }
  return cost;
}

namespace {

void check_nuq_bits(int bits) {
  if (bits < 1 || bits > 8) throw InvalidInput("nuq bits must be in [1, 8]", {"", "bits", std::to_string(bits)});
}

}  // namespace

NuqCalibration calibrate_nuq(const float* rows, std::size_t n, std::size_t C, int bits, bool per_channel,
                             double sparsity, std::size_t sink, const float* weights, std::size_t row_width) {
  check_nuq_bits(bits);
  return NuqFit(rows, n, C, per_channel, sparsity, sink, weights, row_width).levels(bits);
}

NuqCalibration NuqFit::levels(int bits) const {
  check_nuq_bits(bits);
  NuqCalibration c;
  c.bits = bits;
  c.per_channel = per_channel_;
  for (const double l : input_->fit(std::size_t{1} << bits)) c.levels.push_back(static_cast<float>(l));
  if (per_channel_) {
    c.upper = upper_;
    c.lower = lower_;
  }
  return c;
}

NuqFit::NuqFit(const float* rows, std::size_t n, std::size_t C, bool per_channel, double sparsity, std::size_t sink,
               const float* weights, std::size_t row_width)
    : per_channel_(per_channel) {
  if (!(sparsity > 0.0 && sparsity <= 1.0)) {
    throw InvalidInput("nuq sparsity threshold must be in (0, 1]", {"", "sparsity", format_number(sparsity)});
  }
  const std::size_t w = per_channel || row_width == 0 ? C : row_width;
  if (C % w != 0) throw std::logic_error("calibrate_nuq: row_width must divide the row");
  const double t = 1.0 - ((1.0 - sparsity) / 2.0);  // KVQuant's expression
  const double q_hi = t * 100.0, q_lo = (1.0 - t) * 100.0;
  // Thresholds per channel (keys) or per run of w channels of a row (values).
  const std::size_t runs = C / w, groups = per_channel ? C : n * runs, len = per_channel ? n : w;
  std::vector<double> up(groups), lo(groups), v(len);
  RowPercentiles percentiles(len, q_lo, q_hi);
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t i = 0; i < len; ++i) v[i] = per_channel ? rows[i * C + g] : rows[g * w + i];
    std::tie(lo[g], up[g]) = percentiles(v.data());
  }
  std::vector<double> x, wt;
  for (std::size_t i = sink; i < n; ++i) {
    for (std::size_t j = 0; j < C; ++j) {
      const std::size_t g = per_channel ? j : i * runs + j / w;
      const double y = (static_cast<double>(rows[i * C + j]) - (up[g] + lo[g]) / 2.0) / ((up[g] - lo[g]) / 2.0);
      if (!(y >= -1.0 && y <= 1.0)) continue;  // outliers (and 0 / 0 of a constant group)
      x.push_back(static_cast<double>(static_cast<float>(y)));
      if (weights) wt.push_back(weights[i * C + j]);
    }
  }
  if (x.empty()) throw InvalidInput("no value left to fit nuq levels to (every value an outlier or a sink)", {"", "rows", std::to_string(n)});
  input_.emplace(std::move(x), std::move(wt));
  if (per_channel) {
    upper_ = std::move(up);
    lower_ = std::move(lo);
  }
}

NuqTable nuq_table(const NuqCalibration& c, double sparsity, std::size_t sink, std::size_t first, std::size_t width) {
  if (c.levels.size() != (std::size_t{1} << c.bits)) throw std::logic_error("nuq_table: 2^bits levels");
  NuqTable t;
  t.bits = c.bits;
  t.per_channel = c.per_channel;
  t.sparsity = sparsity;
  t.sink = sink;
  t.levels = c.levels;
  if (c.per_channel) {
    if (first + width > c.upper.size() || first + width > c.lower.size()) {
      throw std::logic_error("nuq_table: channels past the calibration's");
    }
    for (std::size_t j = first; j < first + width; ++j) {
      t.upper.push_back(f32_to_f16_ref(static_cast<float>(c.upper[j])));  // torch: f64 -> f32 -> f16
      t.lower.push_back(f32_to_f16_ref(static_cast<float>(c.lower[j])));
    }
  }
  return t;
}

NuqView NuqRows::view(const NuqTable& t) const {
  NuqView v;
  v.table = &t;
  v.rows = rows;
  v.sink_rows = sink_rows;
  v.sink = sink.data();
  v.codes = codes.data();
  v.offset = offset.data();
  v.range = range.data();
  v.outlier_end = outlier_end.data();
  v.outlier_channel = outlier_channel.data();
  v.outlier_value = outlier_value.data();
  return v;
}

std::uint8_t nuq_nearest_ref(const std::vector<float>& levels, float y) {
  if (!std::isfinite(y)) return 0;
  const auto it = std::upper_bound(levels.begin(), levels.end(), y);
  if (it == levels.begin()) return 0;
  const auto hi = static_cast<std::size_t>(it - levels.begin());
  if (it == levels.end()) return static_cast<std::uint8_t>(hi - 1);
  return static_cast<std::uint8_t>(std::fabs(y - levels[hi]) < std::fabs(y - levels[hi - 1]) ? hi : hi - 1);
}

NuqNearest::NuqNearest(const std::vector<float>& levels) : levels_(levels) {
  if (levels.empty() || levels.size() > 256) throw std::logic_error("NuqNearest: 1 to 256 levels");
  std::fill(std::begin(padded_), std::end(padded_), INFINITY);
  std::copy_n(levels.begin(), std::min<std::size_t>(levels.size(), 16), padded_);
}

std::uint8_t NuqNearest::operator()(float y) const {
  std::uint8_t c = 0;
  codes(&y, 1, &c);
  return c;
}

void NuqNearest::codes(const float* y, std::size_t n, std::uint8_t* out) const {
  const int m = static_cast<int>(levels_.size());
  if (m > 16) {
    for (std::size_t j = 0; j < n; ++j) out[j] = nuq_nearest_ref(levels_, y[j]);
    return;
  }
  constexpr std::size_t kChunk = 64;
  std::int32_t above[kChunk];  // levels <= y: upper_bound's index (the padding's +inf counts for no finite y)
  for (std::size_t j0 = 0; j0 < n; j0 += kChunk) {
    const std::size_t c = std::min(kChunk, n - j0);
    const float* yc = y + j0;
    std::fill_n(above, c, 0);
    for (int k = 0; k < 16; ++k) {  // a level against the chunk's values: vectors of values
      const float l = padded_[k];
      for (std::size_t j = 0; j < c; ++j) above[j] += l <= yc[j] ? 1 : 0;
    }
    for (std::size_t j = 0; j < c; ++j) {
      // Between levels above - 1 and above the nearer (ties to the lower); below the first or
      // above the last that level; 0 for a y that is not finite.
      const int a = above[j], hi = a < m ? a : m - 1, lo = a > 0 ? a - 1 : 0;
      const float v = yc[j];
      const int nearest = std::fabs(v - padded_[hi]) < std::fabs(v - padded_[lo]) ? hi : lo;
      out[j0 + j] = static_cast<std::uint8_t>(std::isfinite(v) ? nearest : 0);
    }
  }
}

namespace {

// Per-channel offset and range of a key table in f16 arithmetic (the array conversions agree
// with the scalar ones bit for bit).
void channel_params(const NuqTable& t, std::size_t width, std::vector<float>& offset, std::vector<float>& range) {
  offset.resize(width);
  range.resize(width);
  f16_to_f32(t.upper.data(), offset.data(), width);
  f16_to_f32(t.lower.data(), range.data(), width);
  for (std::size_t j = 0; j < width; ++j) {
    const float u = offset[j], l = range[j];
    offset[j] = u + l;
    range[j] = u - l;
  }
  round_through_f16(offset.data(), width);
  round_through_f16(range.data(), width);
  for (std::size_t j = 0; j < width; ++j) {
    offset[j] /= 2.0f;
    range[j] /= 2.0f;
  }
  round_through_f16(offset.data(), width);
  round_through_f16(range.data(), width);
}

// A per-row table's row x [width]: its outliers (mask: at or beyond the quantiles) and {offset,
// range} of the row with them replaced by its median. The median's value matters only when it is
// an outlier itself (else it is among the values kept), known by counting; ranked: width floats
// of scratch.
std::pair<float, float> row_range(const float* x, std::size_t width, RowQuantiles& quantiles, char* mask, float* ranked) {
  const auto [lo, hi] = quantiles(x);
  float mx = -INFINITY, mn = INFINITY;
  std::size_t at_or_below = 0, at_or_above = 0;
  for (std::size_t j = 0; j < width; ++j) {
    at_or_below += x[j] <= lo ? 1 : 0;
    at_or_above += x[j] >= hi ? 1 : 0;
    mask[j] = x[j] <= lo || x[j] >= hi;
    if (!mask[j]) {
      mx = std::max(mx, x[j]);
      mn = std::min(mn, x[j]);
    }
  }
  const std::size_t m = (width - 1) / 2;
  if (at_or_below > m || at_or_above >= width - m) {
    std::copy_n(x, width, ranked);
    std::nth_element(ranked, ranked + m, ranked + width);
    mx = std::max(mx, ranked[m]);
    mn = std::min(mn, ranked[m]);
  }
  return {(mx + mn) / 2.0f, (mx - mn) / 2.0f};
}

}  // namespace

void nuq_encode(const NuqTable& t, const float* rows, std::size_t n, std::size_t width, NuqRows& out,
                const std::int32_t* pos) {
  if (width == 0 || width > 65536) throw std::logic_error("nuq_encode: width in [1, 65536]");
  if (t.per_channel && (t.upper.size() != width || t.lower.size() != width)) {
    throw std::logic_error("nuq_encode: per-channel thresholds for another width");
  }
  const double q = 1.0 - ((1.0 - t.sparsity) / 2.0);
  const std::size_t row_bytes = packed_size(width, t.bits);
  // Per-channel tables: the thresholds (uf, lf) and each channel's offset and range; per-row
  // ones: the quantiles' scratch (a decode step codes one row a call: nothing the other needs).
  std::vector<float> offset(width), range(width), uf, lf, ranked, scaled(width);
  std::optional<RowQuantiles> quantiles;
  if (t.per_channel) {
    channel_params(t, width, offset, range);
    uf.resize(width);
    lf.resize(width);
    f16_to_f32(t.upper.data(), uf.data(), width);
    f16_to_f32(t.lower.data(), lf.data(), width);
  } else {
    quantiles.emplace(width, q);
    ranked.resize(width);
  }
  std::vector<std::uint8_t> code(width);
  std::vector<char> mask(width);
  const NuqNearest nearest(t.levels);
  for (std::size_t i = 0; i < n; ++i, ++out.rows) {
    const float* x = rows + i * width;
    const std::size_t position = pos ? static_cast<std::size_t>(pos[i]) : out.rows;
    if (position < t.sink) {
      if (out.sink_rows != out.rows) throw std::logic_error("nuq_encode: a sink row after coded rows");
      const std::size_t at = out.sink.size();
      out.sink.resize(at + width);
      f32_to_f16(x, out.sink.data() + at, width);
      ++out.sink_rows;
      continue;
    }
    if (!t.per_channel) {
      const auto [o, r] = row_range(x, width, *quantiles, mask.data(), ranked.data());
      std::fill(offset.begin(), offset.end(), o);
      std::fill(range.begin(), range.end(), r);
      out.offset.push_back(o);
      out.range.push_back(r);
    } else {
      for (std::size_t j = 0; j < width; ++j) mask[j] = x[j] < lf[j] || x[j] > uf[j];
    }
    for (std::size_t j = 0; j < width; ++j) scaled[j] = (x[j] - offset[j]) / range[j];
    nearest.codes(scaled.data(), width, code.data());
    for (std::size_t j = 0; j < width; ++j) {
      if (mask[j]) {
        code[j] = 0;
        const float y = x[j] - offset[j];
        float r = y + offset[j];
        if (!std::isfinite(r)) r = 0.0f;  // torch.nan_to_num(nan=0, posinf=0, neginf=0)
        out.outlier_channel.push_back(static_cast<std::uint16_t>(j));
        out.outlier_value.push_back(f32_to_f16_ref(r));
      }
    }
    out.outlier_end.push_back(static_cast<std::uint32_t>(out.outlier_value.size()));
    const std::size_t at = out.codes.size();
    out.codes.resize(at + row_bytes);
    pack_codes(code.data(), width, t.bits, out.codes.data() + at);
  }
}

namespace {

// One coded row's values from its codes: levels[code] * range + offset in f32 (range / offset per
// channel, or one for the row when per_row), 0 where that is not finite, rounded through f16.
void decode_codes(const std::vector<float>& levels, const std::uint8_t* code, const float* range, const float* offset,
                  bool per_row, std::size_t n, float* o) {
  for (std::size_t j = 0; j < n; ++j) {
    const float x = levels[code[j]] * range[per_row ? 0 : j] + offset[per_row ? 0 : j];
    o[j] = std::isfinite(x) ? f16_nearest(x) : 0.0f;
  }
}

// The same from the packed row: the plain loop, codes unpacked by the bit-by-bit reference.
void decode_values_ref(const std::vector<float>& levels, const std::uint8_t* packed, int bits, const float* range,
                       const float* offset, bool per_row, std::size_t n, float* o) {
  std::vector<std::uint8_t> code(n);
  unpack_codes_ref(packed, n, bits, code.data());
  decode_codes(levels, code.data(), range, offset, per_row, n, o);
}

#if defined(__AVX2__) && defined(__F16C__)
// levels[k] * rg + off rounded as decode_codes rounds it, for eight levels at once.
inline __m256 decode_level(__m256 lv, __m256 rg, __m256 off) {
  __m256 x = _mm256_add_ps(_mm256_mul_ps(lv, rg), off);
  x = _mm256_and_ps(x, _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_EQ_OQ));  // not finite -> 0
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The same as decode_values_ref, eight values a step straight from the packed codes, with the
// same operations per value (the product and the sum as two roundings, no fused multiply-add; the
// f16 conversion instructions, round to nearest even): per_row, the row's 2^bits decoded levels
// are computed once and each value is a lookup; per channel, each value is computed, without the
// not-finite test when no level times range plus offset can leave the f32 range. Prepared once
// for the rows of a decode: the table, its registers, the packed row's length.
template <int Bits>
class SimdRowDecoder {
 public:
  // range, offset: the per-channel parameters [n] (empty for a per-row table).
  SimdRowDecoder(const std::vector<float>& levels, std::size_t n, const std::vector<float>& range,
                 const std::vector<float>& offset)
      : n_(n), bytes_(packed_size(n, Bits)) {
    std::copy(levels.begin(), levels.end(), table_);
    lo_ = _mm256_loadu_ps(table_);
    hi_ = _mm256_loadu_ps(table_ + 8);
#ifdef AKV_NUQ_AVX512_TU
    // Sixteen wide for 2 and 4 bits (4: one permute of 16 levels instead of two and a blend);
    // 3-bit codes measured slower that way (docs/compress.md) and stay eight wide.
    wide_ = Bits != 3 && active_isa() >= Isa::avx512;
#endif
    double level = 0, rg = 0, off = 0;
    for (const float x : levels) level = std::max(level, std::fabs(static_cast<double>(x)));
    for (const float x : range) rg = std::max(rg, std::fabs(static_cast<double>(x)));
    for (const float x : offset) off = std::max(off, std::fabs(static_cast<double>(x)));
    finite_ = level * rg + off < 1e38;  // false when any is not finite
  }

  void operator()(const std::uint8_t* packed, const float* range, const float* offset, bool per_row, float* o) const {
    __m256 lo = lo_, hi = hi_;
    if (per_row) {
      const __m256 rg = _mm256_set1_ps(range[0]), off = _mm256_set1_ps(offset[0]);
      lo = decode_level(lo, rg, off);
      hi = decode_level(hi, rg, off);
    }
    std::size_t j = 0;
#ifdef AKV_NUQ_AVX512_TU
    if (wide_) j = nuq_decode_values_avx512(table_, Bits, packed, range, offset, per_row, n_, o);
#endif
    if (per_row) {
      for (; j + 8 <= n_; j += 8) {
        const std::size_t at = j / 8 * Bits;
        _mm256_storeu_ps(o + j, lookup8(lo, hi, codes8<Bits>(packed + at, at + 4 <= bytes_), Bits == 4));
      }
    } else if (finite_) {
      for (; j + 8 <= n_; j += 8) {
        const std::size_t at = j / 8 * Bits;
        const __m256 lv = lookup8(lo, hi, codes8<Bits>(packed + at, at + 4 <= bytes_), Bits == 4);
        const __m256 x = _mm256_add_ps(_mm256_mul_ps(lv, _mm256_loadu_ps(range + j)), _mm256_loadu_ps(offset + j));
        _mm256_storeu_ps(o + j, _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
      }
    } else {
      for (; j + 8 <= n_; j += 8) {
        const std::size_t at = j / 8 * Bits;
        const __m256 lv = lookup8(lo, hi, codes8<Bits>(packed + at, at + 4 <= bytes_), Bits == 4);
        _mm256_storeu_ps(o + j, decode_level(lv, _mm256_loadu_ps(range + j), _mm256_loadu_ps(offset + j)));
      }
    }
    if (j < n_) {  // the tail starts on a byte boundary (j is a multiple of 8)
      const std::vector<float> levels(table_, table_ + (1 << Bits));
      decode_values_ref(levels, packed + j / 8 * Bits, Bits, per_row ? range : range + j,
                        per_row ? offset : offset + j, per_row, n_ - j, o + j);
    }
  }

 private:
  float table_[16] = {};
  __m256 lo_, hi_;
  std::size_t n_, bytes_;
  bool wide_ = false, finite_ = false;
};
#endif

// Rows [r0, r1) of a view: sink rows widened, each coded row by values(packed row, range,
// offset, per_row, out) (per channel: `range` and `offset` [width]; per row: the row's), then its
// outliers written over.
template <class Values>
void decode_rows(const NuqView& v, std::size_t width, std::size_t r0, std::size_t r1, float* out,
                 const std::vector<float>& offset, const std::vector<float>& range, const Values& values) {
  const NuqTable& t = *v.table;
  const std::size_t row_bytes = packed_size(width, t.bits);
  for (std::size_t r = r0; r < r1; ++r) {
    float* o = out + (r - r0) * width;
    if (r < v.sink_rows) {
      f16_to_f32(v.sink + r * width, o, width);
      continue;
    }
    const std::size_t q = r - v.sink_rows;
    const std::uint8_t* packed = v.codes + q * row_bytes;
    if (t.per_channel) {
      values(packed, range.data(), offset.data(), false, o);
    } else {
      values(packed, v.range + q, v.offset + q, true, o);
    }
    for (std::uint32_t e = q == 0 ? 0 : v.outlier_end[q - 1]; e < v.outlier_end[q]; ++e) {
      o[v.outlier_channel[e]] = f16_to_f32_ref(v.outlier_value[e]);
    }
  }
}

}  // namespace

void nuq_channel_params(const NuqTable& t, std::size_t width, std::vector<float>& offset, std::vector<float>& range) {
  channel_params(t, width, offset, range);
}

void nuq_decode(const NuqView& v, std::size_t width, std::size_t r0, std::size_t r1, float* out) {
  const NuqTable& t = *v.table;
  std::vector<float> offset, range;
  if (t.per_channel) channel_params(t, width, offset, range);
#if defined(__AVX2__) && defined(__F16C__)
  if (t.levels.size() <= 16) {
    switch (t.bits) {
      case 2: return decode_rows(v, width, r0, r1, out, offset, range, SimdRowDecoder<2>(t.levels, width, range, offset));
      case 3: return decode_rows(v, width, r0, r1, out, offset, range, SimdRowDecoder<3>(t.levels, width, range, offset));
      case 4: return decode_rows(v, width, r0, r1, out, offset, range, SimdRowDecoder<4>(t.levels, width, range, offset));
      default: break;
    }
  }
#endif
  std::vector<std::uint8_t> code(width);
  decode_rows(v, width, r0, r1, out, offset, range,
              [&](const std::uint8_t* packed, const float* rg, const float* off, bool per_row, float* o) {
                unpack_codes(packed, width, t.bits, code.data());
                decode_codes(t.levels, code.data(), rg, off, per_row, width, o);
              });
}

void nuq_decode_ref(const NuqView& v, std::size_t width, std::size_t r0, std::size_t r1, float* out) {
  const NuqTable& t = *v.table;
  std::vector<float> offset, range;
  if (t.per_channel) channel_params(t, width, offset, range);
  decode_rows(v, width, r0, r1, out, offset, range,
              [&](const std::uint8_t* packed, const float* rg, const float* off, bool per_row, float* o) {
                decode_values_ref(t.levels, packed, t.bits, rg, off, per_row, width, o);
              });
}

std::size_t nuq_quantize(const NuqCalibration& c, const float* rows, std::size_t n, std::size_t C, double sparsity,
                         std::size_t sink, float* out) {
  if (c.per_channel && (c.upper.size() != C || c.lower.size() != C)) {
    throw std::logic_error("nuq_quantize: per-channel thresholds for another width");
  }
  const NuqTable t = nuq_table(c, sparsity, sink, 0, c.per_channel ? C : 0);
  NuqRows rows_out;
  nuq_encode(t, rows, n, C, rows_out);
  nuq_decode(rows_out.view(t), C, 0, n, out);
  return rows_out.sink_rows * C + rows_out.outlier_value.size();
}

}  // namespace akv
