#pragma once
// Vector loops of the attention kernels (internal): included by kernels.cpp (x86-64-v3: AVX2,
// F16C, FMA) and by kernels_avx512.cpp (the same loops compiled with AVX-512 F/VL/BW/DQ, called
// only when the CPU has them), each time inside namespace akv::attn::AKV_SIMD_NS. Both compute
// the same products and sums in the same order, so results are bitwise identical; AVX-512 reads
// 4-bit codes without a shift (unsigned conversion, see load8) and keeps 16 score accumulators.
// Only intrinsics and plain code here: no standard-library templates, whose out-of-line copies
// could be shared with code that runs on CPUs without AVX-512.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "akv/attention/kernels.h"

namespace akv::attn::AKV_SIMD_NS {
namespace {

// Code formats whose loads leave lane i scaled by 2^(b * i): the code is masked in place
// (code << b * i) and converted, without a per-lane shift. Accumulators of such loads hold
// exactly 2^(b * i) times the unscaled sums (scaling by powers of two commutes with rounding
// away from overflow and the denormal range, 2^-126), and lane_unscale() restores them bit for
// bit. 4 bits need an unsigned conversion (AVX-512).
template <RowFormat F>
constexpr bool kScaledLanes = F == RowFormat::code2 || F == RowFormat::code3
#ifdef __AVX512VL__
                              || F == RowFormat::code4
#endif
    ;

template <RowFormat F>
constexpr int code_bits() {
  return F == RowFormat::code2 ? 2 : F == RowFormat::code3 ? 3 : F == RowFormat::code4 ? 4 : 8;
}

// Multiplies lane i by 2^(-b * i) for scaled-lane formats (identity otherwise).
template <RowFormat F>
[[gnu::always_inline]] inline __m256 lane_unscale(__m256 v) {
  if constexpr (kScaledLanes<F>) {
    constexpr int b = code_bits<F>();
    constexpr float u = 1.0f / static_cast<float>(1 << b);
    return _mm256_mul_ps(v, _mm256_setr_ps(1.0f, u, u * u, u * u * u, u * u * u * u, u * u * u * u * u,
                                           u * u * u * u * u * u, u * u * u * u * u * u * u));
  } else {
    return v;
  }
}

// Values 8k .. 8k+7 of a row as floats (scaled-lane formats: lane i times 2^(b * i)).
template <RowFormat F>
[[gnu::always_inline]] inline __m256 load8(const std::uint8_t* row, std::size_t k) {
  if constexpr (F == RowFormat::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + 8 * k);
  } else if constexpr (F == RowFormat::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * k)));
  } else if constexpr (F == RowFormat::code8) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * k))));
  } else {
    constexpr int b = code_bits<F>();
    std::uint32_t w;
    std::memcpy(&w, row + static_cast<std::size_t>(b) * k, 4);
    const __m256i word = _mm256_set1_epi32(static_cast<int>(w));
    constexpr unsigned m = (1u << b) - 1u;
    if constexpr (kScaledLanes<F>) {
      const __m256i mask = _mm256_setr_epi32(static_cast<int>(m), static_cast<int>(m << b), static_cast<int>(m << 2 * b),
                                             static_cast<int>(m << 3 * b), static_cast<int>(m << 4 * b),
                                             static_cast<int>(m << 5 * b), static_cast<int>(m << 6 * b),
                                             static_cast<int>(m << 7 * b));
#ifdef __AVX512VL__
      if constexpr (b == 4) return _mm256_cvtepu32_ps(_mm256_and_si256(word, mask));
#endif
      return _mm256_cvtepi32_ps(_mm256_and_si256(word, mask));
    } else {
      const __m256i shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
      return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(word, shifts), _mm256_set1_epi32(static_cast<int>(m))));
    }
  }
}

// ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)): the order of hsum8, so that a row's score
// does not depend on the block it was computed in.
inline float hsum(__m256 v) {
  const __m256 a = _mm256_hadd_ps(v, v);
  const __m256 b = _mm256_hadd_ps(a, a);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1)));
}

// Independent score accumulators per block of rows: 16 with AVX-512's 32 registers, else 8 (with 8
// chains of 4-cycle FMAs the FMA units barely stay busy).
#ifdef __AVX512VL__
constexpr int kAccs = 16;
#else
constexpr int kAccs = 8;
#endif

// Lane i of the result = horizontal sum of v[i].
inline __m256 hsum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// RB rows x NQ heads of dot products; accumulators acc[r * NQ + h].
template <RowFormat F, int NQ, int RB>
[[gnu::always_inline]] inline void score_block(const Rows& rows, std::size_t r0, const float* w, std::size_t ws,
                        const float* bias, float* s, std::size_t ss) {
  __m256 acc[RB * NQ];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const std::uint8_t* row[RB];
  for (int r = 0; r < RB; ++r) row[r] = rows.base + (r0 + static_cast<std::size_t>(r)) * rows.stride;
  for (std::size_t k = 0; k < rows.chunks; ++k) {
    // Weights once per chunk in registers: as memory operands of every FMA they were loaded RB
    // times, and loads, not FMAs, bounded the loop.
    __m256 wk[NQ];
    for (int h = 0; h < NQ; ++h) {
      wk[h] = _mm256_loadu_ps(w + static_cast<std::size_t>(h) * ws + 8 * k);
      __asm__("" : "+x"(wk[h]));  // keeps the compiler from folding the load back into each FMA
    }
    for (int r = 0; r < RB; ++r) {
      const __m256 x = load8<F>(row[r], k);
      for (int h = 0; h < NQ; ++h) acc[r * NQ + h] = _mm256_fmadd_ps(wk[h], x, acc[r * NQ + h]);
    }
  }
  for (auto& a : acc) a = lane_unscale<F>(a);
  if constexpr (RB * NQ % 8 == 0) {
    for (int b = 0; b < RB * NQ; b += 8) {
      alignas(32) float out[8];
      _mm256_store_ps(out, hsum8(acc + b));
      for (int t = 0; t < 8; ++t) {
        const int r = (b + t) / NQ, h = (b + t) % NQ;
        s[static_cast<std::size_t>(h) * ss + r0 + static_cast<std::size_t>(r)] = out[t] + (bias ? bias[h] : 0.0f);
      }
    }
  } else {
    for (int r = 0; r < RB; ++r) {
      for (int h = 0; h < NQ; ++h) {
        s[static_cast<std::size_t>(h) * ss + r0 + static_cast<std::size_t>(r)] =
            hsum(acc[r * NQ + h]) + (bias ? bias[h] : 0.0f);
      }
    }
  }
}

template <RowFormat F, int NQ>
void score_heads(const Rows& rows, const float* w, std::size_t ws, const float* bias, float* s,
                 std::size_t ss) {
  constexpr int RB = kAccs / NQ;
  std::size_t r = 0;
  for (; r + RB <= rows.n; r += RB) score_block<F, NQ, RB>(rows, r, w, ws, bias, s, ss);
  for (; r < rows.n; ++r) score_block<F, NQ, 1>(rows, r, w, ws, bias, s, ss);
}

template <RowFormat F>
void score_format(const Rows& rows, std::size_t nq, const float* w, std::size_t ws,
                  const float* bias, float* s, std::size_t ss) {
  for (std::size_t h = 0; h < nq;) {
    const std::size_t left = nq - h;
    const float* b = bias ? bias + h : nullptr;
    if (left >= 8) {
      score_heads<F, 8>(rows, w + h * ws, ws, b, s + h * ss, ss);
      h += 8;
    } else if (left >= 4) {
      score_heads<F, 4>(rows, w + h * ws, ws, b, s + h * ss, ss);
      h += 4;
    } else if (left >= 2) {
      score_heads<F, 2>(rows, w + h * ws, ws, b, s + h * ss, ss);
      h += 2;
    } else {
      score_heads<F, 1>(rows, w + h * ws, ws, b, s + h * ss, ss);
      h += 1;
    }
  }
}

// NQ heads (h0..h0+NQ of nq) x CB chunks starting at chunk k0, over all rows.
template <RowFormat F, int NQ, int CB>
[[gnu::always_inline]] inline void accumulate_block(const Rows& rows, std::size_t k0, std::size_t nq, std::size_t h0,
                             const float* coef, std::size_t ng, std::size_t cpg, float* acc,
                             std::size_t as) {
  __m256 a[NQ * CB];
  for (auto& v : a) v = _mm256_setzero_ps();
  std::size_t g[CB];
  for (int j = 0; j < CB; ++j) g[j] = (k0 + static_cast<std::size_t>(j)) / cpg;
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    const float* cr = coef + (r * nq + h0) * ng;
    __m256 c[NQ];  // the row's coefficients, broadcast once per group (broadcasts compete with the FMAs)
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) {
      if (j == 0 || g[j] != g[j - 1]) {
        for (int h = 0; h < NQ; ++h) c[h] = _mm256_set1_ps(cr[static_cast<std::size_t>(h) * ng + g[j]]);
      }
      const __m256 x = load8<F>(row, k0 + static_cast<std::size_t>(j));
      for (int h = 0; h < NQ; ++h) a[h * CB + j] = _mm256_fmadd_ps(c[h], x, a[h * CB + j]);
    }
  }
  for (int h = 0; h < NQ; ++h) {
    for (int j = 0; j < CB; ++j) {
      float* p = acc + (h0 + static_cast<std::size_t>(h)) * as + 8 * (k0 + static_cast<std::size_t>(j));
      _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), lane_unscale<F>(a[h * CB + j])));
    }
  }
}

template <RowFormat F, int NQ>
void accumulate_heads(const Rows& rows, std::size_t nq, std::size_t h0, const float* coef,
                      std::size_t ng, std::size_t cpg, float* acc, std::size_t as) {
  constexpr int CB = 8 / NQ;  // more value accumulators measured slower (register pressure)
  std::size_t k = 0;
  for (; k + CB <= rows.chunks; k += CB) accumulate_block<F, NQ, CB>(rows, k, nq, h0, coef, ng, cpg, acc, as);
  for (; k < rows.chunks; ++k) accumulate_block<F, NQ, 1>(rows, k, nq, h0, coef, ng, cpg, acc, as);
}

template <RowFormat F>
void accumulate_format(const Rows& rows, std::size_t nq, const float* coef, std::size_t ng,
                       std::size_t cpg, float* acc, std::size_t as) {
  for (std::size_t h = 0; h < nq;) {
    const std::size_t left = nq - h;
    if (left >= 8) {
      accumulate_heads<F, 8>(rows, nq, h, coef, ng, cpg, acc, as);
      h += 8;
    } else if (left >= 4) {
      accumulate_heads<F, 4>(rows, nq, h, coef, ng, cpg, acc, as);
      h += 4;
    } else if (left >= 2) {
      accumulate_heads<F, 2>(rows, nq, h, coef, ng, cpg, acc, as);
      h += 2;
    } else {
      accumulate_heads<F, 1>(rows, nq, h, coef, ng, cpg, acc, as);
      h += 1;
    }
  }
}

// Calls fn(std::integral_constant<RowFormat, F>{}) for the runtime format.
template <typename Fn>
void with_format(RowFormat f, Fn&& fn) {
  switch (f) {
    case RowFormat::f32: return fn(std::integral_constant<RowFormat, RowFormat::f32>{});
    case RowFormat::f16: return fn(std::integral_constant<RowFormat, RowFormat::f16>{});
    case RowFormat::code2: return fn(std::integral_constant<RowFormat, RowFormat::code2>{});
    case RowFormat::code3: return fn(std::integral_constant<RowFormat, RowFormat::code3>{});
    case RowFormat::code4: return fn(std::integral_constant<RowFormat, RowFormat::code4>{});
    case RowFormat::code8: return fn(std::integral_constant<RowFormat, RowFormat::code8>{});
  }
}

}  // namespace

void score_rows_simd(const Rows& rows, std::size_t nq, const float* w, std::size_t ws, const float* bias,
                     float* s, std::size_t ss) {
  with_format(rows.format, [&](auto f) { score_format<decltype(f)::value>(rows, nq, w, ws, bias, s, ss); });
}

void accumulate_rows_simd(const Rows& rows, std::size_t nq, const float* coef, std::size_t ng,
                          std::size_t cpg, float* acc, std::size_t as) {
  with_format(rows.format, [&](auto f) { accumulate_format<decltype(f)::value>(rows, nq, coef, ng, cpg, acc, as); });
}

}  // namespace akv::attn::AKV_SIMD_NS
