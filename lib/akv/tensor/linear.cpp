#include "akv/tensor/linear.h"

#include <cmath>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace akv {

namespace {

float dot_ref(const float* w, const float* x, std::size_t cols) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t k8 = cols - cols % 8;
  for (std::size_t k = 0; k < k8; ++k) s[k % 8] = std::fma(w[k], x[k], s[k % 8]);
  float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (std::size_t k = k8; k < cols; ++k) r = std::fma(w[k], x[k], r);
  return r;
}

#if defined(__AVX2__) && defined(__FMA__)

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s_l + s_{l+4}
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// R rows of W times NB vectors of X.
// R rows of W times NB vectors of X (loops fully unrolled: the R x NB sums stay in registers).
template <int R, int NB>
void block(const float* w, std::size_t ldw, std::size_t cols, const float* x, std::size_t ldx, float* y,
           std::size_t ldy) {
  __m256 acc[R][NB];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_setzero_ps();
  }
  const std::size_t k8 = cols - cols % 8;
  for (std::size_t k = 0; k < k8; k += 8) {
    __m256 wr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wr[r] = _mm256_loadu_ps(w + r * ldw + k);
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      const __m256 xb = _mm256_loadu_ps(x + b * ldx + k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][b] = _mm256_fmadd_ps(wr[r], xb, acc[r][b]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < NB; ++b) {
      float s = hsum8(acc[r][b]);
      for (std::size_t k = k8; k < cols; ++k) s = std::fma(w[r * ldw + k], x[b * ldx + k], s);
      y[b * ldy + r] = s;
    }
  }
}

// NB vectors of X times rows [0, rows) of W: the vectors stay in L1 while W's rows pass (W's
// block is meant to fit L2: callers hand over a few hundred KB of rows at a time).
template <int NB>
void batch_block(const float* w, std::size_t rows, std::size_t ldw, std::size_t cols, const float* x,
                 std::size_t ldx, float* y, std::size_t ldy) {
  std::size_t o = 0;
  for (; o + 4 <= rows; o += 4) block<4, NB>(w + o * ldw, ldw, cols, x, ldx, y + o, ldy);
  for (; o < rows; ++o) block<1, NB>(w + o * ldw, ldw, cols, x, ldx, y + o, ldy);
}

#endif

}  // namespace

void linear_rows_ref(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                     std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t o = 0; o < rows; ++o) y[b * ldy + o] = dot_ref(w + o * ldw, x + b * ldx, cols);
  }
}

void linear_rows(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                 std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
#if defined(__AVX2__) && defined(__FMA__)
  std::size_t b = 0;
  for (; b + 3 <= batch; b += 3) batch_block<3>(w, rows, ldw, cols, x + b * ldx, ldx, y + b * ldy, ldy);
  if (batch - b == 2) batch_block<2>(w, rows, ldw, cols, x + b * ldx, ldx, y + b * ldy, ldy);
  if (batch - b == 1) batch_block<1>(w, rows, ldw, cols, x + b * ldx, ldx, y + b * ldy, ldy);
#else
  linear_rows_ref(w, rows, cols, ldw, x, batch, ldx, y, ldy);
#endif
}

}  // namespace akv
