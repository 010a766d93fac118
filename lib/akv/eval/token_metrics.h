#pragma once
// Per-token metrics of one decode step from f32 logits, in f64: the log-sum-exp (negative
// log-likelihood = lse - x[target]), KL(reference || method) and the top-1 token. One pass of
// exponentials per row (vectorized through Eigen), where materializing both rows'
// log-probabilities took two, plus a third for the reference's probabilities.
//
//   lse(x)        = m + log(sum_j exp(x_j - m)), m = max_j x_j
//   KL(r || x)    = sum_j p_j ((r_j - lse(r)) - (x_j - lse(x)))
//                 = (1 / S) sum_j e_j (r_j - x_j) - (lse(r) - lse(x)),  e_j = exp(r_j - m_r), S = sum e_j
//
// token_metrics_ref spells the definitions out with std::exp / std::log over the log-probability
// rows; tests compare the two (tests/unit/test_eval.cpp).
#include <Eigen/Core>
#include <cstddef>

namespace akv {

// A reference row prepared once per step: its lse and exp(r_j - max).
struct ReferenceRow {
  const float* r = nullptr;
  std::size_t n = 0;
  double lse = 0, sum = 0;  // sum = S above
  // Eigen's own (aligned) storage: its vectorized sums peel to the first aligned element, so an
  // unaligned buffer would make the summation order depend on the address (and the thread).
  Eigen::ArrayXd e;
  void set(const float* logits, std::size_t n);
};

// log-sum-exp of n f32 logits in f64.
double log_sum_exp(const float* x, std::size_t n);
// KL(ref || x) of a row x with log-sum-exp lse_x; clamped at 0 (rounding can make it negative).
double kl_divergence(const ReferenceRow& ref, const float* x, double lse_x);
// Index of the largest logit (the first one among equals).
std::size_t argmax(const float* x, std::size_t n);

struct TokenMetricsRef {
  double nll = 0, kl = 0;
};
// Reference: f64 log-softmax of both rows with std::exp, then nll = -log p_x[target] and
// KL = sum exp(lr) (lr - lx).
TokenMetricsRef token_metrics_ref(const float* ref, const float* x, std::size_t n, std::size_t target);

}  // namespace akv
