#include "akv/score/kv_scores.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "akv/attention/block_attention.h"

namespace akv {
namespace {

double norm(const float* x, std::size_t d) {
  double s = 0;
  for (std::size_t c = 0; c < d; ++c) s += static_cast<double>(x[c]) * x[c];
  return std::sqrt(s);
}

// LagKV's per-token score of one partition `x` [lag, d] against the next `ref` [lag, d]: the
// std over channels (n - 1) of x min-max scaled by ref's channel ranges (a channel without range
// scales to 0), softmaxed over the partition.
std::vector<double> lag_partition(const float* x, const float* ref, std::size_t lag, std::size_t d) {
  std::vector<double> lo(d, INFINITY), hi(d, -INFINITY), s(lag), p(lag);
  for (std::size_t i = 0; i < lag; ++i) {
    for (std::size_t c = 0; c < d; ++c) {
      lo[c] = std::min(lo[c], static_cast<double>(ref[i * d + c]));
      hi[c] = std::max(hi[c], static_cast<double>(ref[i * d + c]));
    }
  }
  for (std::size_t i = 0; i < lag; ++i) {
    double mean = 0, ss = 0;
    std::vector<double> y(d);
    for (std::size_t c = 0; c < d; ++c) {
      y[c] = hi[c] > lo[c] ? (x[i * d + c] - lo[c]) / (hi[c] - lo[c]) : 0.0;
      mean += y[c];
    }
    mean /= static_cast<double>(d);
    for (double v : y) ss += (v - mean) * (v - mean);
    s[i] = std::sqrt(ss / static_cast<double>(d - 1));
  }
  softmax(s.data(), lag, p.data());
  return p;
}

}  // namespace

std::vector<double> knorm_scores(const Tensor3& key, std::size_t h, std::size_t T, std::size_t d) {
  std::vector<double> out(T);
  for (std::size_t t = 0; t < T; ++t) out[t] = -norm(key.row(h, t), d);
  return out;
}

std::vector<double> keydiff_scores(const Tensor3& key, std::size_t h, std::size_t T, std::size_t d) {
  std::vector<double> anchor(d, 0.0), out(T);
  for (std::size_t t = 0; t < T; ++t) {
    const float* k = key.row(h, t);
    const double n = std::max(norm(k, d), 1e-12);
    for (std::size_t c = 0; c < d; ++c) anchor[c] += k[c] / n;
  }
  double an = 0;
  for (double& a : anchor) {
    a /= static_cast<double>(T);
    an += a * a;
  }
  an = std::sqrt(an);
  for (std::size_t t = 0; t < T; ++t) {
    const float* k = key.row(h, t);
    double dot = 0;
    for (std::size_t c = 0; c < d; ++c) dot += k[c] * anchor[c];
    out[t] = -dot / std::max(norm(k, d) * an, 1e-8);
  }
  return out;
}

std::vector<double> lagkv_scores(const Tensor3& key, const Tensor3& value, std::size_t h, std::size_t T,
                                 std::size_t d, std::size_t sinks, std::size_t lag) {
  std::vector<double> out(T, 1.0);
  if (T < sinks + 2 * lag) {  // too short for two partitions: the most recent win
    for (std::size_t t = sinks; t < T; ++t) out[t] = static_cast<double>(t - sinks) / static_cast<double>(T - sinks);
    return out;
  }
  const std::size_t parts = (T - sinks) / lag;  // the last one only serves as a reference
  for (std::size_t b = 0; b + 1 < parts; ++b) {
    const std::size_t t0 = sinks + b * lag;
    const std::vector<double> ks = lag_partition(key.row(h, t0), key.row(h, t0 + lag), lag, d);
    const std::vector<double> vs = lag_partition(value.row(h, t0), value.row(h, t0 + lag), lag, d);
    std::vector<double> avg(lag);
    for (std::size_t i = 0; i < lag; ++i) avg[i] = (ks[i] + vs[i]) / 2;
    std::vector<std::size_t> order(lag);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) { return avg[a] < avg[c]; });
    for (std::size_t r = 0; r < lag; ++r) out[t0 + order[r]] = static_cast<double>(r) / static_cast<double>(lag);
  }
  return out;
}

}  // namespace akv
