#include "akv/core/exp.h"

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace akv {
namespace {

constexpr double kLog2e = 0x1.71547652b82fep0;
constexpr double kLn2Hi = 0x1.62e42fefa39efp-1;   // ln 2 = kLn2Hi + kLn2Lo to 2^-110
constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;
constexpr double kShift = 0x1.8p52;  // v + kShift - kShift rounds v to an integer (|v| < 2^51)
constexpr double kLow = -746.0, kHigh = 710.0;  // beyond them exp is 0 or inf
constexpr double kPowLimit = 1000.0;             // 2^k = 2^ka * 2^kb with |ka| <= 1000: both normal
// 1/i! for i = 13 .. 2 (the Horner coefficients, highest first).
constexpr double kCoef[12] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                              1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
                              1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        0.5};

// 2^k for an integer-valued k in [-1022, 1023], from its bits.
double pow2(double k) {
  const std::int64_t i = std::bit_cast<std::int64_t>(k + kShift) - std::bit_cast<std::int64_t>(kShift);
  return std::bit_cast<double>(static_cast<std::uint64_t>(i + 1023) << 52);
}

#if defined(__AVX2__) && defined(__FMA__)
__m256d pow2(__m256d k) {
  const __m256i i = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(k, _mm256_set1_pd(kShift))),
                                     _mm256_castpd_si256(_mm256_set1_pd(kShift)));
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(i, _mm256_set1_epi64x(1023)), 52));
}

// exp_f64 of four lanes: each operation is the scalar one's (max_pd(c, x) is x < c ? c : x with
// x's NaN kept; fnmadd(a, b, c) is fma(-a, b, c)).
__m256d exp4(__m256d x) {
  x = _mm256_max_pd(_mm256_set1_pd(kLow), x);
  x = _mm256_min_pd(_mm256_set1_pd(kHigh), x);
  const __m256d k = _mm256_sub_pd(_mm256_fmadd_pd(x, _mm256_set1_pd(kLog2e), _mm256_set1_pd(kShift)), _mm256_set1_pd(kShift));
  __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kLn2Hi), x);
  r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kCoef[0]);
  for (int i = 1; i < 12; ++i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kCoef[i]));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
  p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
  __m256d ka = _mm256_max_pd(_mm256_set1_pd(-kPowLimit), k);
  ka = _mm256_min_pd(_mm256_set1_pd(kPowLimit), ka);
  const __m256d kb = _mm256_sub_pd(k, ka);
  return _mm256_mul_pd(_mm256_mul_pd(p, pow2(ka)), pow2(kb));
}
#endif

}  // namespace

double exp_f64(double x) {
  x = x < kLow ? kLow : x;
  x = x > kHigh ? kHigh : x;
  const double k = std::fma(x, kLog2e, kShift) - kShift;
  double r = std::fma(-k, kLn2Hi, x);
  r = std::fma(-k, kLn2Lo, r);
  double p = kCoef[0];
  for (int i = 1; i < 12; ++i) p = std::fma(p, r, kCoef[i]);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  double ka = k < -kPowLimit ? -kPowLimit : k;
  ka = ka > kPowLimit ? kPowLimit : ka;
  const double kb = k - ka;
  return p * pow2(ka) * pow2(kb);
}

void exp_f64(const double* x, std::size_t n, double* y) {
  std::size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, exp4(_mm256_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) y[i] = exp_f64(x[i]);
}

}  // namespace akv
