#include "akv/eval/token_metrics.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "akv/attention/block_attention.h"

namespace akv {
namespace {

using ConstArrayF = Eigen::Map<const Eigen::ArrayXf>;

double max_of(const float* x, std::size_t n) {
  return static_cast<double>(ConstArrayF(x, static_cast<Eigen::Index>(n)).maxCoeff());
}

}  // namespace

void ReferenceRow::set(const float* logits, std::size_t count) {
  r = logits;
  n = count;
  const double m = max_of(r, n);
  // Converted first, then exp over f64 alone: Eigen vectorizes exp(f64 - m) but not through a
  // float -> double cast inside the same expression.
  e = ConstArrayF(r, static_cast<Eigen::Index>(n)).cast<double>();
  e = (e - m).exp();
  sum = e.sum();
  lse = m + std::log(sum);
}

double log_sum_exp(const float* x, std::size_t n) {
  const double m = max_of(x, n);
  thread_local Eigen::ArrayXd d;
  d = ConstArrayF(x, static_cast<Eigen::Index>(n)).cast<double>();
  return m + std::log((d - m).exp().sum());
}

double kl_divergence(const ReferenceRow& ref, const float* x, double lse_x) {
  const auto len = static_cast<Eigen::Index>(ref.n);
  thread_local Eigen::ArrayXd d;
  d = ConstArrayF(ref.r, len).cast<double>();
  d -= ConstArrayF(x, len).cast<double>();
  const double cross = (ref.e * d).sum() / ref.sum;
  return std::max(0.0, cross - (ref.lse - lse_x));
}

std::size_t argmax(const float* x, std::size_t n) {
  // The largest value (vectorized), then the first 64-value chunk holding it (vectorized
  // compares), then its first position there: the same index as std::max_element.
  if (n == 0) return 0;
  const float m = ConstArrayF(x, static_cast<Eigen::Index>(n)).maxCoeff();
  constexpr std::size_t kChunk = 64;
  std::size_t c = 0;
  while (c + kChunk < n && !(ConstArrayF(x + c, kChunk) == m).any()) c += kChunk;
  return static_cast<std::size_t>(std::find(x + c, x + n, m) - x);
}

TokenMetricsRef token_metrics_ref(const float* ref, const float* x, std::size_t n, std::size_t target) {
  std::vector<double> lr(n), lx(n);
  log_softmax(ref, n, lr.data());
  log_softmax(x, n, lx.data());
  TokenMetricsRef m;
  m.nll = -lx[target];
  for (std::size_t j = 0; j < n; ++j) m.kl += std::exp(lr[j]) * (lr[j] - lx[j]);
  return m;
}

}  // namespace akv
