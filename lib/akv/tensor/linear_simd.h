#pragma once
// Register blocks of linear_rows (internal): included by linear.cpp (x86-64-v3: AVX2 + FMA) and
// by linear_avx512.cpp (the same code compiled with AVX-512 F/VL, called only when the CPU has
// them), each time inside namespace akv::AKV_LINEAR_NS. Every output (o, b) is one 8-lane
// accumulator of fused multiply-adds over k, reduced in linear.h's order, so any block shape
// gives the same bits; AVX-512's 32 vector registers hold a 4 x 6 block (24 accumulators) where
// AVX2's 16 hold 4 x 3, halving how often each weight row is read per batch. Only intrinsics and
// plain code: no standard-library templates, whose out-of-line copies could be shared with code
// that runs on CPUs without AVX-512.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "akv/tensor/half.h"

namespace akv::AKV_LINEAR_NS {

// How the kernels read W's values: element i of a row pointer as f32 (load8: i .. i + 7).
// F32Rows: f32 values; F16Rows and BF16Rows: 16-bit values at any byte offset (row pointers are
// byte pointers; the conversions to f32 are exact, so every kind gives the bits of its f32 copy).
struct F32Rows {
  using T = float;
  static __m256 load8(const float* w, std::size_t i) { return _mm256_loadu_ps(w + i); }
  static float load1(const float* w, std::size_t i) { return w[i]; }
  static const char* addr(const float* w, std::size_t i) { return reinterpret_cast<const char*>(w + i); }
};
struct F16Rows {
  using T = std::uint8_t;
  static __m256 load8(const std::uint8_t* w, std::size_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
  }
  static float load1(const std::uint8_t* w, std::size_t i) {
    std::uint16_t h;
    __builtin_memcpy(&h, w + 2 * i, 2);
    return f16_value(h);
  }
  static const char* addr(const std::uint8_t* w, std::size_t i) { return reinterpret_cast<const char*>(w + 2 * i); }
};
struct BF16Rows {
  using T = std::uint8_t;
  static __m256 load8(const std::uint8_t* w, std::size_t i) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float load1(const std::uint8_t* w, std::size_t i) {
    unsigned short h;
    __builtin_memcpy(&h, w + 2 * i, 2);
    const unsigned int bits = static_cast<unsigned int>(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  static const char* addr(const std::uint8_t* w, std::size_t i) { return reinterpret_cast<const char*>(w + 2 * i); }
};

namespace {

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s_l + s_{l+4}
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// R rows of W times NB vectors of X (loops fully unrolled: the R x NB sums stay in registers).
// Prefetch: also asks for the next R rows, one cache line per row every 16 values, so the first
// pass over a block of W (from memory: a decode step reads every weight once) overlaps the next
// rows' loads with this group's multiply-adds; later passes find the rows in L2. (A prefetch
// past the last row is harmless: prefetches do not fault.) 4-5% off `akv evaluate --model` on
// the 58M llama of docs/model.md, 2026-12-01, AMD EPYC Zen 5.
template <int R, int NB, bool Prefetch = false, class W = F32Rows>
void block(const typename W::T* w, std::size_t ldw, std::size_t cols, const float* x, std::size_t ldx, float* y,
           std::size_t ldy) {
  __m256 acc[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_setzero_ps();
  }
  const std::size_t k8 = cols - cols % 8;
  for (std::size_t k = 0; k < k8; k += 8) {
    __m256 wr[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wr[r] = W::load8(w, r * ldw + k);
    if constexpr (Prefetch) {
      if (k % 16 == 0) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) _mm_prefetch(W::addr(w, (R + r) * ldw + k), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const __m256 xb = _mm256_loadu_ps(x + b * ldx + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][b] = _mm256_fmadd_ps(wr[r], xb, acc[r][b]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < NB; ++b) {
      float s = hsum8(acc[r][b]);
      for (std::size_t k = k8; k < cols; ++k) {
        s = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(W::load1(w, r * ldw + k)), _mm_set_ss(x[b * ldx + k]), _mm_set_ss(s)));
      }
      y[b * ldy + r] = s;
    }
  }
}

// NB vectors of X times rows [0, rows) of W: the vectors stay in L1 while W's rows pass (W's
// block is meant to fit L2: callers hand over a few hundred KB of rows at a time).
template <int NB, bool Prefetch = false, class W = F32Rows>
void batch_block(const typename W::T* w, std::size_t rows, std::size_t ldw, std::size_t cols, const float* x,
                 std::size_t ldx, float* y, std::size_t ldy) {
  constexpr std::size_t kScale = sizeof(typename W::T) == 1 ? 2 : 1;  // T units per value
  std::size_t o = 0;
  for (; o + 4 <= rows; o += 4) block<4, NB, Prefetch, W>(w + o * ldw * kScale, ldw, cols, x, ldx, y + o, ldy);
  for (; o < rows; ++o) block<1, NB, false, W>(w + o * ldw * kScale, ldw, cols, x, ldx, y + o, ldy);
}

}  // namespace

// Batches of kWide vectors, then the rest (kWide - 1 or fewer) in one narrower block.
// W's rows: F32Rows (float*), F16Rows / BF16Rows (byte pointer to 16-bit values; ldw in values).
template <int kWide, class W = F32Rows>
void linear_rows_simd(const typename W::T* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                      std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  std::size_t b = 0;
  for (; b + kWide <= batch; b += kWide) {
    if (b == 0) batch_block<kWide, true, W>(w, rows, ldw, cols, x + b * ldx, ldx, y + b * ldy, ldy);
    else batch_block<kWide, false, W>(w, rows, ldw, cols, x + b * ldx, ldx, y + b * ldy, ldy);
  }
  const float* xr = x + b * ldx;
  float* yr = y + b * ldy;
  switch (batch - b) {
    case 5: if constexpr (kWide > 5) batch_block<5, false, W>(w, rows, ldw, cols, xr, ldx, yr, ldy); break;
    case 4: if constexpr (kWide > 4) batch_block<4, false, W>(w, rows, ldw, cols, xr, ldx, yr, ldy); break;
    case 3: if constexpr (kWide > 3) batch_block<3, false, W>(w, rows, ldw, cols, xr, ldx, yr, ldy); break;
    case 2: batch_block<2, false, W>(w, rows, ldw, cols, xr, ldx, yr, ldy); break;
    case 1: batch_block<1, false, W>(w, rows, ldw, cols, xr, ldx, yr, ldy); break;
    default: break;
  }
}

}  // namespace akv::AKV_LINEAR_NS
