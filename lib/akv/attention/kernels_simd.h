#pragma once
// Vector loops of the attention kernels (internal): included by kernels.cpp (x86-64-v3: AVX2,
// F16C, FMA) and by kernels_avx512.cpp (the same loops compiled with AVX-512 F/VL/BW/DQ, called
// only when the CPU has them), each time inside namespace akv::attn::AKV_SIMD_NS. Both compute
// the same products and sums in the same order, so results are bitwise identical; AVX-512 reads
// 4-bit codes without a shift (unsigned conversion, see load8) and keeps 16 score accumulators.
// Only intrinsics and plain code here: no standard-library templates, whose out-of-line copies
// could be shared with code that runs on CPUs without AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "akv/attention/kernels.h"
#include "akv/attention/prefetch.h"
#include "akv/core/isa.h"
#include "akv/tensor/ggml_blocks.h"

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
constexpr bool kLevels = F == RowFormat::level2 || F == RowFormat::level3 || F == RowFormat::level4;

template <RowFormat F>
constexpr int code_bits() {
  return F == RowFormat::code2 || F == RowFormat::level2   ? 2
         : F == RowFormat::code3 || F == RowFormat::level3 ? 3
         : F == RowFormat::code4 || F == RowFormat::level4 ? 4
                                                           : 8;
}

// levels[idx mod 16] per lane (levels: level_table's 16 floats; idx's bits above the code need
// no mask): one permute of 8 (2 and 3 bits), for 4 bits two permutes and a blend on bit 3
// (AVX-512 VL: one two-table permute; the same values).
template <RowFormat F>
[[gnu::always_inline]] inline __m256 lookup_levels(__m256i idx, const float* levels) {
  const __m256 lo = _mm256_loadu_ps(levels);
  if constexpr (F != RowFormat::level4) {
    return _mm256_permutevar8x32_ps(lo, idx);
  } else {
    const __m256 hi = _mm256_loadu_ps(levels + 8);
#ifdef __AVX512VL__
    return _mm256_permutex2var_ps(lo, idx, hi);
#else
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
#endif
  }
}

template <RowFormat F>
constexpr bool kFp8 = F == RowFormat::e4m3 || F == RowFormat::e5m2;

// ggml's 32-value block types (kernels.h): bytes a block, where its codes start, whether a min
// follows the scale (Q4_1, Q5_1), whether a word of 5th bits precedes the codes (Q5_0, Q5_1),
// and the offset subtracted from the codes (ggml_blocks.h has the layouts).
template <RowFormat F>
constexpr bool kGgml = F == RowFormat::q8_0 || F == RowFormat::q4_0 || F == RowFormat::q4_1 ||
                       F == RowFormat::q5_0 || F == RowFormat::q5_1 || F == RowFormat::iq4_nl;
template <RowFormat F>
constexpr bool kGgmlMin = F == RowFormat::q4_1 || F == RowFormat::q5_1;
template <RowFormat F>
constexpr bool kGgmlFive = F == RowFormat::q5_0 || F == RowFormat::q5_1;
template <RowFormat F>
constexpr std::size_t ggml_block_bytes() {
  return F == RowFormat::q8_0 ? 34 : F == RowFormat::q4_1 ? 20 : F == RowFormat::q5_0 ? 22 : F == RowFormat::q5_1 ? 24 : 18;
}
template <RowFormat F>
constexpr std::size_t ggml_codes_at() {
  return 2 + (kGgmlMin<F> ? 2 : 0) + (kGgmlFive<F> ? 4 : 0);
}
template <RowFormat F>
constexpr int ggml_code_offset() {
  return F == RowFormat::q4_0 ? 8 : F == RowFormat::q5_0 ? 16 : 0;
}

// A block's f16 scale d and min m (0 without) in every lane; Q5_0 / Q5_1: its 32 fifth bits as
// bytes, byte i 16 where bit i of the block's word is set (0 elsewhere, as for other types).
struct BlockConst {
  __m256 d, m;
  __m256i five;
};

// The fifth bits of a block (kGgmlFive) as BlockConst::five: the word's byte p copied to bytes
// 8p .. 8p + 7 (one in-lane shuffle of the word in every dword), each byte's bit p % 8 tested.
template <RowFormat F>
[[gnu::always_inline]] inline __m256i ggml_five(const std::uint8_t* b) {
  std::uint32_t qh;
  std::memcpy(&qh, b + ggml_codes_at<F>() - 4, 4);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), spread);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}

template <RowFormat F>
[[gnu::always_inline]] inline BlockConst ggml_block(const std::uint8_t* row, std::size_t k) {
  const std::uint8_t* b = row + k / 4 * ggml_block_bytes<F>();
  std::uint16_t h;
  std::memcpy(&h, b, 2);
  BlockConst c{_mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h))), _mm256_setzero_ps(), _mm256_setzero_si256()};
  if constexpr (kGgmlMin<F>) {
    std::memcpy(&h, b + 2, 2);
    c.m = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
  }
  if constexpr (kGgmlFive<F>) c.five = ggml_five<F>(b);
  return c;
}

// Chunk k's 8 codes as 32-bit integers, the offset subtracted (IQ4_NL: the levels they pick);
// five: the block's BlockConst::five (read for Q5_0 and Q5_1 only; no default, so that no caller
// drops their fifth bits).
template <RowFormat F>
[[gnu::always_inline]] inline __m256i ggml_codes(const std::uint8_t* row, std::size_t k, [[maybe_unused]] __m256i five) {
  const std::uint8_t* b = row + k / 4 * ggml_block_bytes<F>();
  const std::size_t p = k % 4;  // values 8p .. 8p + 7 of the block
  if constexpr (F == RowFormat::q8_0) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * p)));
  } else {
    __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + ggml_codes_at<F>() + 8 * (p % 2)));
    if (p >= 2) q = _mm_srli_epi16(q, 4);
    q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    if constexpr (F == RowFormat::iq4_nl) {
      return _mm256_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)), q));
    } else {
      if constexpr (kGgmlFive<F>) {  // bytes 8p .. 8p + 7 of five: the 5th bits times 16
        const __m128i f = p >= 2 ? _mm256_extracti128_si256(five, 1) : _mm256_castsi256_si128(five);
        q = _mm_or_si128(q, p % 2 ? _mm_unpackhi_epi64(f, f) : f);
      }
      __m256i v = _mm256_cvtepu8_epi32(q);
      if constexpr (ggml_code_offset<F>() != 0) v = _mm256_sub_epi32(v, _mm256_set1_epi32(ggml_code_offset<F>()));
      return v;
    }
  }
}

// Chunk k's values given its block's constants: ggml_dequantize's products, plus the min (the
// product of a code below 2^8 and an f16 is exact in f32, so a compiler fusing the sum into a
// multiply-add changes no bit).
template <RowFormat F>
[[gnu::always_inline]] inline __m256 ggml_values(const std::uint8_t* row, std::size_t k, const BlockConst& c) {
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(ggml_codes<F>(row, k, c.five)), c.d);
  if constexpr (kGgmlMin<F>) return _mm256_add_ps(v, c.m);
  return v;
}

// fp8 bytes sign-extended to 16-bit lanes -> f16 bits (e5m2: the byte to the top; e4m3: shifted
// left 7, the sign's copies above it leaving bit 15 set and bit 14 to clear, exponent and
// mantissa at bits 13..7, i.e. the value times 2^-8, every e4m3 value exact in f16: one shift
// and an AND where zero extension took two shifts).
template <RowFormat F, class V>
[[gnu::always_inline]] inline V fp8_to_f16(V x) {
  if constexpr (F == RowFormat::e5m2) {
    if constexpr (sizeof(V) == 16) {
      return _mm_slli_epi16(x, 8);
    } else {
      return _mm256_slli_epi16(x, 8);
    }
  } else if constexpr (sizeof(V) == 16) {
    return _mm_and_si128(_mm_slli_epi16(x, 7), _mm_set1_epi16(static_cast<short>(0xBFFF)));
  } else {
    return _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  }
}

// Multiplies lane i by 2^(-b * i) for scaled-lane formats, every lane by 2^8 for e4m3 (whose
// loads read the values times 2^-8, fp8_to_f16), identity otherwise.
template <RowFormat F>
[[gnu::always_inline]] inline __m256 lane_unscale(__m256 v) {
  if constexpr (F == RowFormat::e4m3) {
    return _mm256_mul_ps(v, _mm256_set1_ps(256.0f));
  } else if constexpr (kScaledLanes<F>) {
    constexpr int b = code_bits<F>();
    constexpr float u = 1.0f / static_cast<float>(1 << b);
    return _mm256_mul_ps(v, _mm256_setr_ps(1.0f, u, u * u, u * u * u, u * u * u * u, u * u * u * u * u,
                                           u * u * u * u * u * u, u * u * u * u * u * u * u));
  } else {
    return v;
  }
}

// Values 8k .. 8k+7 of a row as floats (scaled-lane formats: lane i times 2^(b * i); level
// formats: levels[code], levels as Rows::levels).
template <RowFormat F>
[[gnu::always_inline]] inline __m256 load8(const std::uint8_t* row, std::size_t k, const float* levels) {
  static_cast<void>(levels);
  if constexpr (F == RowFormat::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + 8 * k);
  } else if constexpr (F == RowFormat::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * k)));
  } else if constexpr (F == RowFormat::code8) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * k))));
  } else if constexpr (kFp8<F>) {
    return _mm256_cvtph_ps(fp8_to_f16<F>(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * k)))));
  } else if constexpr (kGgml<F>) {
    return ggml_values<F>(row, k, ggml_block<F>(row, k));
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
      const __m256i shifted = _mm256_srlv_epi32(word, shifts);
      if constexpr (kLevels<F>) {
        return lookup_levels<F>(shifted, levels);
      } else {
        return _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(static_cast<int>(m))));
      }
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


// Start of rows r0 .. r0+RB.
template <int RB>
[[gnu::always_inline]] inline void block_rows(const Rows& rows, std::size_t r0, const std::uint8_t* (&row)[RB]) {
  for (int r = 0; r < RB; ++r) row[r] = rows.base + (r0 + static_cast<std::size_t>(r)) * rows.stride;
}

// 2- and 4-bit rows with an even number of chunks, one query head: AVX-512 reads them 16
// values at a time (score_block_wide) and the 256-bit loops sum them in the same order
// (score_block_paired).
template <RowFormat F>
constexpr bool kWide = F == RowFormat::code2 || F == RowFormat::code4;

// Scores of rows r0 .. r0+RB for NQ heads: s[h * ss + r0 + r] = hsum(acc[r * NQ + h]) + bias[h]
// (bias may be null), 8 sums at a time where the count allows (same order as hsum).
template <int NQ, int RB>
[[gnu::always_inline]] inline void store_scores(const __m256* acc, std::size_t r0, const float* bias, float* s,
                                                std::size_t ss) {
  if constexpr (NQ > 1 && RB % 8 == 0) {
    // 8 rows of one head at a time: one vector store (rather than 8 scalar ones across heads).
    for (int h = 0; h < NQ; ++h) {
      const __m256 b = _mm256_set1_ps(bias ? bias[h] : 0.0f);
      for (int r = 0; r < RB; r += 8) {
        __m256 v[8];
        for (int t = 0; t < 8; ++t) v[t] = acc[(r + t) * NQ + h];
        _mm256_storeu_ps(s + static_cast<std::size_t>(h) * ss + r0 + static_cast<std::size_t>(r), _mm256_add_ps(hsum8(v), b));
      }
    }
  } else if constexpr (RB * NQ % 8 == 0) {
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

// Byte b of every level of a table, in both 128-bit lanes of plane[b] (AVX2's 4-bit level loops,
// load_quad_levels).
struct LevelPlanes {
  __m256i plane[4];
};

#ifndef __AVX512F__
// 4-bit level rows with 256-bit vectors, 32 codes (16 bytes: chunks 4u .. 4u + 3) at a time.
// AVX2 has no 16-entry float permute (load8 spends two 8-entry ones and a blend per 8 values),
// but its byte shuffle is a 16-entry table lookup: each of the table's four byte planes is looked
// up with one shuffle of the 32 codes (low nibbles in the low 128-bit lane, high nibbles in the
// high one), and two rounds of unpacks put the bytes back together into floats, bit for bit the
// table's: 12 shuffles and 2 other operations per 32 values where load8 spends 28. Chunk j's 8
// values come in quad_lane order: lane l holds value 8j + quad_lane(l), the even values first.
// Measured with `akv -t 1 bench attention --isa avx2` against the two permutes (docs/compress.md,
// nuq section: commit 0dd05f3, Intel Xeon, 2026-12-05): nuq4 / q4 at GQA 4 1.48-1.50x ->
// 1.42-1.45x, TurboQuant 4-bit NC 1.25-1.33x -> 1.18-1.22x.
constexpr std::size_t kQuadMaxChunks = 32;  // head_dim <= 256: the weights' copy in quad-lane order fits the stack

constexpr int quad_lane(int l) { return l < 4 ? 2 * l : 2 * (l - 4) + 1; }

// Permutation indices: to quad-lane order, and back to channel order (lane c takes the lane that
// holds value c: c / 2 for even c, 4 + c / 2 for odd c).
inline __m256i quad_gather() { return _mm256_setr_epi32(quad_lane(0), quad_lane(1), quad_lane(2), quad_lane(3),
                                                         quad_lane(4), quad_lane(5), quad_lane(6), quad_lane(7)); }
inline __m256i quad_scatter() { return _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); }

inline LevelPlanes level_planes(const float* levels) {
  alignas(16) std::uint8_t bytes[4][16];
  for (int c = 0; c < 16; ++c) {
    std::uint32_t bits;
    std::memcpy(&bits, levels + c, 4);
    for (int b = 0; b < 4; ++b) bytes[b][c] = static_cast<std::uint8_t>(bits >> (8 * b));
  }
  LevelPlanes t;
  for (int b = 0; b < 4; ++b) {
    t.plane[b] = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes[b])));
  }
  return t;
}

// Chunks 4u .. 4u + 3 of a row, x[j] = chunk 4u + j in quad-lane order.
[[gnu::always_inline]] inline void load_quad_levels(const std::uint8_t* row, std::size_t u, const LevelPlanes& t,
                                                    __m256 (&x)[4]) {
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * u)));
  // Low nibbles in the low lane, high nibbles in the high one: one per-lane shift (0 or 4 bits)
  // and one mask.
  const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(bytes, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                       _mm256_set1_epi8(0x0F));
  const __m256i p0 = _mm256_shuffle_epi8(t.plane[0], idx), p1 = _mm256_shuffle_epi8(t.plane[1], idx);
  const __m256i p2 = _mm256_shuffle_epi8(t.plane[2], idx), p3 = _mm256_shuffle_epi8(t.plane[3], idx);
  const __m256i lo01 = _mm256_unpacklo_epi8(p0, p1), hi01 = _mm256_unpackhi_epi8(p0, p1);  // bytes 0-1 of values 0-15, 16-31
  const __m256i lo23 = _mm256_unpacklo_epi8(p2, p3), hi23 = _mm256_unpackhi_epi8(p2, p3);  // bytes 2-3
  x[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(lo01, lo23));
  x[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(lo01, lo23));
  x[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(hi01, hi23));
  x[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(hi01, hi23));
}

// wq[h * 8 chunks + 8k + l] = w[h * ws + 8k + quad_lane(l)] for NQ heads.
template <int NQ>
inline void quad_order_weights(const float* w, std::size_t ws, std::size_t chunks, float* wq) {
  const __m256i gather = quad_gather();
  for (int h = 0; h < NQ; ++h) {
    for (std::size_t k = 0; k < chunks; ++k) {
      const __m256 v = _mm256_loadu_ps(w + static_cast<std::size_t>(h) * ws + 8 * k);
      _mm256_store_ps(wq + static_cast<std::size_t>(h) * 8 * chunks + 8 * k, _mm256_permutevar8x32_ps(v, gather));
    }
  }
}
#endif  // !__AVX512F__

// RB rows x NQ heads of dot products; accumulators acc[r * NQ + h]. Sq: also each row's sum of
// squares into sq[r0 + r] (acc2[r]: fused multiply-adds of the row's values by themselves).
// Quads (AVX2, 4-bit level rows, a multiple of 4 chunks): a quad of chunks at a time through the
// byte planes t (load_quad_levels) against weights in quad-lane order (quad_order_weights); each
// lane does the multiply-adds of the chunk loop in the same order and the accumulators are put
// back in channel order before their sums, so the scores are bitwise the same.
template <RowFormat F, int NQ, int RB, bool Sq = false, bool Quads = false>
[[gnu::always_inline]] inline void score_block(const Rows& rows, std::size_t r0, const float* w, std::size_t ws,
                        const float* bias, float* s, std::size_t ss, float* sq = nullptr,
                        [[maybe_unused]] const LevelPlanes* t = nullptr) {
  __m256 acc[RB * NQ];
  for (auto& a : acc) a = _mm256_setzero_ps();
  [[maybe_unused]] __m256 acc2[Sq ? RB : 1];
  if constexpr (Sq) {
    for (auto& a : acc2) a = _mm256_setzero_ps();
  }
  const std::uint8_t* row[RB];
  block_rows(rows, r0, row);
  if constexpr (NQ > 1) {
    for (int r = 0; r < RB; ++r) prefetch_row(row[r], rows.stride);
  }
#ifndef __AVX512F__
  if constexpr (Quads) {
    for (std::size_t u = 0; u < rows.chunks / 4; ++u) {
      for (int r = 0; r < RB; ++r) {
        __m256 x[4];
        load_quad_levels(row[r], u, *t, x);
        for (int j = 0; j < 4; ++j) {
          const float* wj = w + 32 * u + 8 * static_cast<std::size_t>(j);
          for (int h = 0; h < NQ; ++h) {
            acc[r * NQ + h] = _mm256_fmadd_ps(_mm256_load_ps(wj + static_cast<std::size_t>(h) * ws), x[j], acc[r * NQ + h]);
          }
          if constexpr (Sq) acc2[r] = _mm256_fmadd_ps(x[j], x[j], acc2[r]);
        }
      }
    }
    for (auto& a : acc) a = _mm256_permutevar8x32_ps(a, quad_scatter());
    if constexpr (Sq) {
      for (auto& a : acc2) a = _mm256_permutevar8x32_ps(a, quad_scatter());
    }
  } else
#endif
  {
    // ggml blocks: each row's block scale converted once per block, not per chunk.
    [[maybe_unused]] BlockConst scale[kGgml<F> ? RB : 1];
    for (auto& v : scale) v = BlockConst{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_si256()};
    for (std::size_t k = 0; k < rows.chunks; ++k) {
      // Weights once per chunk in registers: as memory operands of every FMA they were loaded RB
      // times, and loads, not FMAs, bounded the loop.
      __m256 wk[NQ];
      for (int h = 0; h < NQ; ++h) {
        wk[h] = _mm256_loadu_ps(w + static_cast<std::size_t>(h) * ws + 8 * k);
        __asm__("" : "+v"(wk[h]));  // keeps the compiler from folding the load back into each FMA ("v": any vector register)
      }
      if constexpr (kGgml<F>) {
        if (k % 4 == 0) {
          for (int r = 0; r < RB; ++r) scale[r] = ggml_block<F>(row[r], k);
        }
      }
      for (int r = 0; r < RB; ++r) {
        __m256 x;
        if constexpr (kGgml<F>) {
          x = ggml_values<F>(row[r], k, scale[r]);
        } else {
          x = load8<F>(row[r], k, rows.levels);
        }
        for (int h = 0; h < NQ; ++h) acc[r * NQ + h] = _mm256_fmadd_ps(wk[h], x, acc[r * NQ + h]);
        if constexpr (Sq) acc2[r] = _mm256_fmadd_ps(x, x, acc2[r]);
      }
    }
  }
  for (auto& a : acc) a = lane_unscale<F>(a);
  store_scores<NQ, RB>(acc, r0, bias, s, ss);
  if constexpr (Sq) {  // squares of scaled lanes: unscaled twice
    for (int r = 0; r < RB; ++r) sq[r0 + static_cast<std::size_t>(r)] = hsum(lane_unscale<F>(lane_unscale<F>(acc2[r])));
  }
}

#ifdef __AVX512F__
// 512-bit loops for 1-, 2- and 4-bit codes: 16 codes per vector from one (1-bit: 16-bit word;
// 2-bit: 32-bit word) or two (4-bit: 64-bit word) words, masked in place against the word
// broadcast into every lane,
// so one AND with a broadcast memory operand, one conversion and one FMA per 16 values (the
// 256-bit loops spend a broadcast, an AND, a conversion and an FMA per 8). Lane j of wide
// chunk k (values 16k .. 16k+15) holds value 16k + wide_lane<F>(j), times 2^(wide_shift<F>(j)).
template <RowFormat F>
constexpr int wide_lane(int j) {
  return code_bits<F>() != 4 ? j : j / 2 + 8 * (j % 2);  // 4-bit: lanes alternate the two words
}

template <RowFormat F>
constexpr int wide_shift(int j) {
  return code_bits<F>() == 4 ? 4 * (j / 2) : code_bits<F>() == 3 ? 3 * (j % 8) : code_bits<F>() * j;
}

template <RowFormat F>
inline __m512i wide_mask() {
  constexpr unsigned m = (1u << code_bits<F>()) - 1u;
  alignas(64) static constexpr unsigned k[16] = {
      m << wide_shift<F>(0),  m << wide_shift<F>(1),  m << wide_shift<F>(2),  m << wide_shift<F>(3),
      m << wide_shift<F>(4),  m << wide_shift<F>(5),  m << wide_shift<F>(6),  m << wide_shift<F>(7),
      m << wide_shift<F>(8),  m << wide_shift<F>(9),  m << wide_shift<F>(10), m << wide_shift<F>(11),
      m << wide_shift<F>(12), m << wide_shift<F>(13), m << wide_shift<F>(14), m << wide_shift<F>(15)};
  return _mm512_load_si512(k);
}

// Lane j: 2^(-wide_shift(j)).
template <RowFormat F>
inline __m512 wide_unscale() {
  alignas(64) static constexpr float k[16] = {
      1.0f / (1u << wide_shift<F>(0)),  1.0f / (1u << wide_shift<F>(1)),  1.0f / (1u << wide_shift<F>(2)),
      1.0f / (1u << wide_shift<F>(3)),  1.0f / (1u << wide_shift<F>(4)),  1.0f / (1u << wide_shift<F>(5)),
      1.0f / (1u << wide_shift<F>(6)),  1.0f / (1u << wide_shift<F>(7)),  1.0f / (1u << wide_shift<F>(8)),
      1.0f / (1u << wide_shift<F>(9)),  1.0f / (1u << wide_shift<F>(10)), 1.0f / (1u << wide_shift<F>(11)),
      1.0f / (1u << wide_shift<F>(12)), 1.0f / (1u << wide_shift<F>(13)), 1.0f / (1u << wide_shift<F>(14)),
      1.0f / (1u << wide_shift<F>(15))};
  return _mm512_load_ps(k);
}

// Lane j of the result: fn(j), for j < 16.
template <int (*Fn)(int)>
inline __m512i lane_index() {
  alignas(64) static constexpr int k[16] = {Fn(0), Fn(1), Fn(2),  Fn(3),  Fn(4),  Fn(5),  Fn(6),  Fn(7),
                                            Fn(8), Fn(9), Fn(10), Fn(11), Fn(12), Fn(13), Fn(14), Fn(15)};
  return _mm512_load_si512(k);
}

// Permutation index: lane j of the result takes lane wide_lane(j) of a natural-order vector.
template <RowFormat F>
inline __m512i wide_gather() {
  return lane_index<wide_lane<F>>();
}

// Inverse of wide_lane: the lane that holds value c of a wide chunk.
template <RowFormat F>
constexpr int wide_slot(int c) {
  return code_bits<F>() != 4 ? c : c < 8 ? 2 * c : 2 * (c - 8) + 1;
}

template <RowFormat F>
constexpr bool wide_slots_invert() {
  for (int c = 0; c < 16; ++c) {
    if (wide_lane<F>(wide_slot<F>(c)) != c) return false;
  }
  return true;
}

// Permutation index back to natural order: lane c of the result takes lane wide_slot(c).
template <RowFormat F>
inline __m512i wide_scatter() {
  static_assert(wide_slots_invert<F>());
  return lane_index<wide_slot<F>>();
}

// The word of wide chunk k of a row in every lane (2 bits: 32-bit; 4 bits:
// 64-bit, lanes alternating its halves; 3 bits: the 32-bit words of its two chunks, load8's, in
// lanes 0-7 and 8-15).
template <RowFormat F>
[[gnu::always_inline]] inline __m512i wide_word(const std::uint8_t* row, std::size_t k) {
  if constexpr (code_bits<F>() == 3) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, row + 6 * k, 4);
    std::memcpy(&hi, row + 6 * k + 3, 4);
    return _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(lo)), 0xFF00, static_cast<int>(hi));
  } else if constexpr (code_bits<F>() == 2) {
    std::uint32_t w;
    std::memcpy(&w, row + 4 * k, 4);
    return _mm512_set1_epi32(static_cast<int>(w));
  } else {
    std::uint64_t w;
    std::memcpy(&w, row + 8 * k, 8);
    return _mm512_set1_epi64(static_cast<long long>(w));
  }
}

// Wide chunk k of a row: 16 values in wide_lane order, scaled by 2^wide_shift.
template <RowFormat F>
[[gnu::always_inline]] inline __m512 load16(const std::uint8_t* row, std::size_t k, __m512i mask) {
  return _mm512_cvtepu32_ps(_mm512_and_si512(wide_word<F>(row, k), mask));
}

// Level formats (2 and 4 bits): wide chunk k of a row as levels in wide_lane order, each lane's
// word shifted right by wide_shift (its code in the low bits, the bits above unmasked:
// level_table) and looked up in the table.
template <RowFormat F>
inline __m512i wide_shifts() {
  return lane_index<wide_shift<F>>();
}

template <RowFormat F>
[[gnu::always_inline]] inline __m512 load16_levels(const std::uint8_t* row, std::size_t k, __m512i shifts, __m512 table) {
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(wide_word<F>(row, k), shifts), table);
}

// RB rows of one head's dot products over wide chunks; one 512-bit accumulator each, unscaled,
// put in channel order, and its halves (even and odd chunks) added: the order of
// score_block_paired. 2- and 4-bit codes, or levels (load16_levels: not scaled). Sq (levels):
// also each row's sum of squares into sq[r0 + r], its lanes in the same order.
template <RowFormat F, int RB, bool Sq = false>
[[gnu::always_inline]] inline void score_block_wide(const Rows& rows, std::size_t r0, const float* w, const float* bias,
                                                    float* s, [[maybe_unused]] float* sq = nullptr) {
  static_assert(!Sq || kLevels<F>);
  __m512 acc[RB];
  for (auto& a : acc) a = _mm512_setzero_ps();
  [[maybe_unused]] __m512 acc2[Sq ? RB : 1];
  if constexpr (Sq) {
    for (auto& a : acc2) a = _mm512_setzero_ps();
  }
  const std::uint8_t* row[RB];
  block_rows(rows, r0, row);
  const __m512i mask = kLevels<F> ? wide_shifts<F>() : wide_mask<F>(), gather = wide_gather<F>();
  const __m512 table = kLevels<F> ? _mm512_loadu_ps(rows.levels) : _mm512_setzero_ps();
  for (std::size_t k = 0; k < rows.chunks / 2; ++k) {
    __m512 wk = _mm512_loadu_ps(w + 16 * k);
    if constexpr (code_bits<F>() == 4) wk = _mm512_permutexvar_ps(gather, wk);
    for (int r = 0; r < RB; ++r) {
      const __m512 x = kLevels<F> ? load16_levels<F>(row[r], k, mask, table) : load16<F>(row[r], k, mask);
      acc[r] = _mm512_fmadd_ps(wk, x, acc[r]);
      if constexpr (Sq) acc2[r] = _mm512_fmadd_ps(x, x, acc2[r]);
    }
  }
  const __m512 unscale = wide_unscale<F>();
  const __m512i scatter = wide_scatter<F>();
  __m256 half[RB];
  for (int r = 0; r < RB; ++r) {
    __m512 a = kLevels<F> ? acc[r] : _mm512_mul_ps(acc[r], unscale);  // unscaled sums
    if constexpr (code_bits<F>() == 4) a = _mm512_permutexvar_ps(scatter, a);  // channel order
    half[r] = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  }
  store_scores<1, RB>(half, r0, bias, s, 0);
  if constexpr (Sq) {
    for (int r = 0; r < RB; ++r) {
      __m512 a = acc2[r];
      if constexpr (code_bits<F>() == 4) a = _mm512_permutexvar_ps(scatter, a);
      sq[r0 + static_cast<std::size_t>(r)] = hsum(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
    }
  }
}
#else
// 4-bit rows with 256-bit vectors in the AVX-512 wide chunks' lane order, without a per-lane
// shift: half-chunk u holds half u % 2 of wide chunk k = u / 2, i.e. wide lanes 8 (u % 2) + j
// (values 16k + {0, 8, 1, 9, 2, 10, 3, 11} or 16k + {4, 12, 5, 13, 6, 14, 7, 15}), masked in
// place in the 64-bit word at byte 8k + 2 (u % 2), so lane j is scaled by 2^(4 (j / 2)) < 2^16
// and a signed conversion suffices (AVX2 has no unsigned one; the AVX-512 lanes 8..15 carry
// 2^16 more, which unscaling removes exactly). One AND, one conversion and one FMA per 8
// values where the shifted loads of load8 spend four operations (measured 2026-12-01, commit
// 101d44d, AMD EPYC Zen 5, AVX2, one core: 0.32 -> 0.23 ns per 8 values in a loop of only these
// operations).
constexpr std::size_t kHalvesMaxChunks = 128;  // head_dim <= 1024: the key weights' copy in wide-lane order fits the stack

inline __m256i half4_mask() { return _mm256_setr_epi32(0xF, 0xF, 0xF0, 0xF0, 0xF00, 0xF00, 0xF000, 0xF000); }

inline __m256 half4_unscale() {
  constexpr float a = 1.0f / 16, b = a / 16, c = b / 16;
  return _mm256_setr_ps(1.0f, 1.0f, a, a, b, b, c, c);
}

[[gnu::always_inline]] inline __m256 load_half4(const std::uint8_t* row, std::size_t u, __m256i mask) {
  std::uint64_t w;
  std::memcpy(&w, row + 4 * u - 2 * (u % 2), 8);  // byte 8 (u / 2) + 2 (u % 2)
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_set1_epi64x(static_cast<long long>(w)), mask));
}

// wp[16k + j] = w[16k + wide_lane(j)] for the rows' wide chunks k.
inline void wide_order_weights(const float* w, std::size_t chunks, float* wp) {
  for (std::size_t k = 0; k < chunks / 2; ++k) {
    const __m256 a = _mm256_loadu_ps(w + 16 * k), b = _mm256_loadu_ps(w + 16 * k + 8);
    const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);  // a0 b0 a1 b1 | a4 b4 a5 b5, ...
    _mm256_store_ps(wp + 16 * k, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_store_ps(wp + 16 * k + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

// lane i = lo[2i] + lo[2i + 1] for i < 4, hi[2i - 8] + hi[2i - 7] for i >= 4: the sums of the
// wide lanes 2i and 2i + 1 (channels i and i + 8), score_block_wide's halves.
inline __m256 add_lane_pairs(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(lo, hi)), 0xD8));
}

// score_block_paired's order for 4-bit level rows (a multiple of 4 chunks) a quad of chunks at a
// time (load_quad_levels, the byte planes t) against weights in quad-lane order
// (quad_order_weights), both halves' accumulators live, put back in channel order before they are
// added: each row's lanes into sums[r] (and its squares' into sqs[r] with Sq), which the caller
// adds up (hsum or hsum8: the same order).
template <int RB, bool Sq>
[[gnu::always_inline]] inline void quad_row_sums(const Rows& rows, std::size_t r0, const float* w, const LevelPlanes& t,
                                                 __m256* sums, [[maybe_unused]] __m256* sqs) {
  const std::uint8_t* row[RB];
  block_rows(rows, r0, row);
  __m256 a[2][RB];
  [[maybe_unused]] __m256 a2[2][Sq ? RB : 1];
  for (auto& h : a) {
    for (auto& v : h) v = _mm256_setzero_ps();
  }
  if constexpr (Sq) {
    for (auto& h : a2) {
      for (auto& v : h) v = _mm256_setzero_ps();
    }
  }
  for (std::size_t u = 0; u < rows.chunks / 4; ++u) {
    for (int r = 0; r < RB; ++r) {
      __m256 x[4];
      load_quad_levels(row[r], u, t, x);
      for (int j = 0; j < 4; ++j) {
        a[j % 2][r] = _mm256_fmadd_ps(_mm256_load_ps(w + 32 * u + 8 * static_cast<std::size_t>(j)), x[j], a[j % 2][r]);
        if constexpr (Sq) a2[j % 2][r] = _mm256_fmadd_ps(x[j], x[j], a2[j % 2][r]);
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    sums[r] = _mm256_add_ps(_mm256_permutevar8x32_ps(a[0][r], quad_scatter()), _mm256_permutevar8x32_ps(a[1][r], quad_scatter()));
    if constexpr (Sq) {
      sqs[r] = _mm256_add_ps(_mm256_permutevar8x32_ps(a2[0][r], quad_scatter()), _mm256_permutevar8x32_ps(a2[1][r], quad_scatter()));
    }
  }
}

// The 256-bit loops' order for rows that the AVX-512 loops read 16 values at a time (2- and
// 4-bit codes, one query head, an even number of chunks): even and odd chunks in two
// accumulators, added lane by lane at the end, so that both instruction sets give the same bits.
// Halves (4 bits): score_block_wide's own lane order instead, half-chunks (load_half4) against
// the weights in wide-lane order (w from wide_order_weights), each lane pair added at the end.
// Sq (levels): also each row's sum of squares into sq[r0 + r], in the same order
// (score_block_wide's). 4-bit levels in quads: quad_row_sums.
template <RowFormat F, int RB, bool Halves = false, bool Sq = false>
[[gnu::always_inline]] inline void score_block_paired(const Rows& rows, std::size_t r0, const float* w, const float* bias,
                                                      float* s, [[maybe_unused]] float* sq = nullptr) {
  static_assert(!Halves || F == RowFormat::code4);
  static_assert(!Sq || kLevels<F>);
  const std::uint8_t* row[RB];
  block_rows(rows, r0, row);
  const __m256i mask = half4_mask();
  __m256 acc[2][RB];  // even chunks, then odd chunks: RB accumulators live at a time
  [[maybe_unused]] __m256 acc2[2][Sq ? RB : 1];
  for (int half = 0; half < 2; ++half) {
    __m256 a[RB];
    [[maybe_unused]] __m256 a2[Sq ? RB : 1];
    for (auto& v : a) v = _mm256_setzero_ps();
    if constexpr (Sq) {
      for (auto& v : a2) v = _mm256_setzero_ps();
    }
    for (std::size_t k = static_cast<std::size_t>(half); k < rows.chunks; k += 2) {
      __m256 wk = _mm256_loadu_ps(w + 8 * k);
      __asm__("" : "+v"(wk));  // in a register, not folded into every FMA (see score_block)
      for (int r = 0; r < RB; ++r) {
        const __m256 x = Halves ? load_half4(row[r], k, mask) : load8<F>(row[r], k, rows.levels);
        a[r] = _mm256_fmadd_ps(wk, x, a[r]);
        if constexpr (Sq) a2[r] = _mm256_fmadd_ps(x, x, a2[r]);
      }
    }
    for (int r = 0; r < RB; ++r) acc[half][r] = Halves ? _mm256_mul_ps(a[r], half4_unscale()) : lane_unscale<F>(a[r]);
    if constexpr (Sq) {
      for (int r = 0; r < RB; ++r) acc2[half][r] = a2[r];
    }
  }
  __m256 sum[RB];
  for (int r = 0; r < RB; ++r) sum[r] = Halves ? add_lane_pairs(acc[0][r], acc[1][r]) : _mm256_add_ps(acc[0][r], acc[1][r]);
  store_scores<1, RB>(sum, r0, bias, s, 0);
  if constexpr (Sq) {
    for (int r = 0; r < RB; ++r) sq[r0 + static_cast<std::size_t>(r)] = hsum(_mm256_add_ps(acc2[0][r], acc2[1][r]));
  }
}
#endif  // __AVX512F__

#ifdef __AVX512F__
// Chunk k of rows a (lanes 0..7) and b (lanes 8..15): load8's values of each, side by side.
template <RowFormat F>
[[gnu::always_inline]] inline __m512 load8x2(const std::uint8_t* a, const std::uint8_t* b, std::size_t k,
                                             const float* levels) {
  static_cast<void>(levels);
  if constexpr (F == RowFormat::f32) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a) + 8 * k)),
                              _mm256_loadu_ps(reinterpret_cast<const float*>(b) + 8 * k), 1);
  } else if constexpr (F == RowFormat::f16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16 * k));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * k));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(x), y, 1));
  } else if constexpr (F == RowFormat::code8) {
    const __m128i x = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + 8 * k)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * k)));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(x));
  } else if constexpr (kFp8<F>) {
    const __m128i x = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + 8 * k)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * k)));
    return _mm512_cvtph_ps(fp8_to_f16<F>(_mm256_cvtepi8_epi16(x)));
  } else if constexpr (kGgml<F>) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(load8<F>(a, k, levels)), load8<F>(b, k, levels), 1);
  } else if constexpr (kLevels<F>) {
    constexpr int bits = code_bits<F>();
    std::uint32_t wa, wb;
    std::memcpy(&wa, a + static_cast<std::size_t>(bits) * k, 4);
    std::memcpy(&wb, b + static_cast<std::size_t>(bits) * k, 4);
    const __m512i word = _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(wa)), 0xFF00, static_cast<int>(wb));
    const __m512i shifts = _mm512_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits, 0, bits,
                                             2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(word, shifts), _mm512_loadu_ps(levels));  // no mask: level_table
  } else {
    static_assert(kScaledLanes<F>);
    constexpr int bits = code_bits<F>();
    constexpr unsigned m = (1u << bits) - 1u;
    std::uint32_t wa, wb;
    std::memcpy(&wa, a + static_cast<std::size_t>(bits) * k, 4);
    std::memcpy(&wb, b + static_cast<std::size_t>(bits) * k, 4);
    const __m512i word = _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(wa)), 0xFF00, static_cast<int>(wb));
    const __m512i mask = _mm512_setr_epi32(
        static_cast<int>(m), static_cast<int>(m << bits), static_cast<int>(m << 2 * bits), static_cast<int>(m << 3 * bits),
        static_cast<int>(m << 4 * bits), static_cast<int>(m << 5 * bits), static_cast<int>(m << 6 * bits),
        static_cast<int>(m << 7 * bits), static_cast<int>(m), static_cast<int>(m << bits), static_cast<int>(m << 2 * bits),
        static_cast<int>(m << 3 * bits), static_cast<int>(m << 4 * bits), static_cast<int>(m << 5 * bits),
        static_cast<int>(m << 6 * bits), static_cast<int>(m << 7 * bits));
    return _mm512_cvtepu32_ps(_mm512_and_si512(word, mask));
  }
}

// score_block for NQ heads with two rows per 512-bit register (rows r0 + 2p and r0 + 2p + 1 in
// the low and high halves of acc[p * NQ + h], each chunk's weights broadcast to both halves):
// every lane does the multiply-adds of score_block's lane in the same order, so the scores are
// bitwise the 256-bit loops', with half the conversions and FMAs.
template <RowFormat F, int NQ, int RB, bool Sq = false>
[[gnu::always_inline]] inline void score_block_rowpairs(const Rows& rows, std::size_t r0, const float* w, std::size_t ws,
                                                        const float* bias, float* s, std::size_t ss, float* sq = nullptr) {
  static_assert(RB % 2 == 0);
  constexpr int P = RB / 2;
  __m512 acc[P * NQ];
  for (auto& a : acc) a = _mm512_setzero_ps();
  [[maybe_unused]] __m512 acc2[Sq ? P : 1];
  if constexpr (Sq) {
    for (auto& a : acc2) a = _mm512_setzero_ps();
  }
  const std::uint8_t* row[RB];
  block_rows(rows, r0, row);
  for (int r = 0; r < RB; ++r) prefetch_row(row[r], rows.stride);
  // ggml blocks: each pair's block constants side by side, once per block.
  [[maybe_unused]] __m512 scale[kGgml<F> ? P : 1], mins[kGgmlMin<F> ? P : 1];
  [[maybe_unused]] __m256i five[kGgmlFive<F> ? RB : 1];
  for (auto& v : scale) v = _mm512_setzero_ps();
  for (auto& v : mins) v = _mm512_setzero_ps();
  for (auto& v : five) v = _mm256_setzero_si256();
  for (std::size_t k = 0; k < rows.chunks; ++k) {
    __m512 wk[NQ];
    for (int h = 0; h < NQ; ++h) wk[h] = _mm512_broadcast_f32x8(_mm256_loadu_ps(w + static_cast<std::size_t>(h) * ws + 8 * k));
    if constexpr (kGgml<F>) {
      if (k % 4 == 0) {
        for (int p = 0; p < P; ++p) {
          const BlockConst a = ggml_block<F>(row[2 * p], k), b = ggml_block<F>(row[2 * p + 1], k);
          scale[p] = _mm512_insertf32x8(_mm512_castps256_ps512(a.d), b.d, 1);
          if constexpr (kGgmlMin<F>) mins[p] = _mm512_insertf32x8(_mm512_castps256_ps512(a.m), b.m, 1);
          if constexpr (kGgmlFive<F>) {
            five[2 * p] = a.five;
            five[2 * p + 1] = b.five;
          }
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      __m512 x;
      if constexpr (kGgml<F>) {  // ggml_values for both rows
        const __m256i qa = ggml_codes<F>(row[2 * p], k, five[kGgmlFive<F> ? 2 * p : 0]);
        const __m256i qb = ggml_codes<F>(row[2 * p + 1], k, five[kGgmlFive<F> ? 2 * p + 1 : 0]);
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
        x = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale[p]);
        if constexpr (kGgmlMin<F>) x = _mm512_add_ps(x, mins[p]);
      } else {
        x = load8x2<F>(row[2 * p], row[2 * p + 1], k, rows.levels);
      }
      for (int h = 0; h < NQ; ++h) acc[p * NQ + h] = _mm512_fmadd_ps(wk[h], x, acc[p * NQ + h]);
      if constexpr (Sq) acc2[p] = _mm512_fmadd_ps(x, x, acc2[p]);
    }
  }
  __m256 out[RB * NQ];  // score_block's order: row r, head h at r * NQ + h
  for (int p = 0; p < P; ++p) {
    for (int h = 0; h < NQ; ++h) {
      out[(2 * p) * NQ + h] = _mm512_castps512_ps256(acc[p * NQ + h]);
      out[(2 * p + 1) * NQ + h] = _mm512_extractf32x8_ps(acc[p * NQ + h], 1);
      out[(2 * p) * NQ + h] = lane_unscale<F>(out[(2 * p) * NQ + h]);
      out[(2 * p + 1) * NQ + h] = lane_unscale<F>(out[(2 * p + 1) * NQ + h]);
    }
  }
  store_scores<NQ, RB>(out, r0, bias, s, ss);
  if constexpr (Sq) {
    for (int p = 0; p < P; ++p) {
      const std::size_t r = r0 + 2 * static_cast<std::size_t>(p);
      sq[r] = hsum(lane_unscale<F>(lane_unscale<F>(_mm512_castps512_ps256(acc2[p]))));
      sq[r + 1] = hsum(lane_unscale<F>(lane_unscale<F>(_mm512_extractf32x8_ps(acc2[p], 1))));
    }
  }
}
#endif  // __AVX512F__

// One query head over dense or 8-bit rows: blocks of rows spanning at most kScoreWindow bytes.
// A block's rows are read side by side, chunk by chunk; spread over more bytes, that pattern
// loses the hardware prefetchers (measured 2026-12-01, AMD EPYC Zen 5, 2 threads, 16K tokens,
// GQA 1: dense f16 at head_dim 128 2.2-2.6 ms with blocks of 16 rows (4 KB), 1.56-1.61 ms with
// 2 (512 bytes); head_dim 64 0.84-1.17 -> 0.64-0.67 ms; 8-bit codes at head_dim 128 1.26-1.58 ->
// 1.09-1.19 ms). Each row keeps its own accumulator, so the scores do not depend on the block
// size.
constexpr std::size_t kScoreWindow = 512;

template <RowFormat F, int RB, bool Sq>
void score_head_rows(const Rows& rows, const float* w, std::size_t ws, const float* bias, float* s, std::size_t ss,
                     float* sq) {
  std::size_t r = 0;
  for (; r + RB <= rows.n; r += RB) score_block<F, 1, RB, Sq>(rows, r, w, ws, bias, s, ss, sq);
  for (; r < rows.n; ++r) score_block<F, 1, 1, Sq>(rows, r, w, ws, bias, s, ss, sq);
}

template <RowFormat F, int NQ, bool Sq>
void score_heads(const Rows& rows, const float* w, std::size_t ws, const float* bias, float* s,
                 std::size_t ss, float* sq) {
  constexpr int RB = kAccs / NQ;
  if constexpr (NQ == 1 && (F == RowFormat::f16 || F == RowFormat::f32 || F == RowFormat::code8 || kFp8<F>)) {
    const std::size_t fit = kScoreWindow / rows.stride;
    if (fit < static_cast<std::size_t>(RB)) {
      if (fit >= 4) return score_head_rows<F, 4, Sq>(rows, w, ws, bias, s, ss, sq);
      if (fit >= 2) return score_head_rows<F, 2, Sq>(rows, w, ws, bias, s, ss, sq);
      return score_head_rows<F, 1, Sq>(rows, w, ws, bias, s, ss, sq);
    }
  }
  std::size_t r = 0;
  // One head, 2- or 4-bit codes or 4-bit levels: AVX-512 reads 16 values at a time (measured
  // faster only for one head; with more, the 256-bit loops are as fast or faster). 2-bit levels
  // keep their loops: sixteen wide on AVX-512 they took 0.75 ms against 0.82-0.85, but the
  // 256-bit loops of the same order took 0.81-0.83 against 0.79-0.80 (akv -t 1 bench attention
  // --head-dims 128 --gqa 1 --contexts 4096 --variants nuq2, Intel Xeon, 2026-12-05).
  // 4-bit levels with their sums of squares (TurboQuant's norm correction) too: those sums in the
  // same order, half the rows at a time (their accumulators double).
  if constexpr ((kWide<F> || F == RowFormat::level4) && NQ == 1 && (!Sq || F == RowFormat::level4)) {
    if (rows.chunks % 2 == 0) {
#ifdef __AVX512F__
      constexpr int RW = Sq ? RB / 2 : RB;
      for (; r + RW <= rows.n; r += RW) score_block_wide<F, RW, Sq>(rows, r, w, bias, s, sq);
      for (; r < rows.n; ++r) score_block_wide<F, 1, Sq>(rows, r, w, bias, s, sq);
#else
      constexpr int RP = Sq ? kAccs / 2 : kAccs;
      if constexpr (F == RowFormat::level4) {
        if (rows.chunks % 4 == 0 && rows.chunks <= kQuadMaxChunks) {
          alignas(32) float wq[8 * kQuadMaxChunks];
          quad_order_weights<1>(w, ws, rows.chunks, wq);
          const LevelPlanes t = level_planes(rows.levels);
          constexpr int RQ = 2;  // both halves' accumulators live: 2 rows measured faster than 4 or 8
          const float b = bias ? bias[0] : 0.0f;
          while (r < rows.n) {  // eight rows' sums added up together (fewer at the end)
            const std::size_t m = std::min<std::size_t>(8, rows.n - r);
            __m256 sums[8], sqs[8];
            std::size_t j = 0;
            for (; j + RQ <= m; j += RQ) quad_row_sums<RQ, Sq>(rows, r + j, wq, t, sums + j, sqs + j);
            for (; j < m; ++j) quad_row_sums<1, Sq>(rows, r + j, wq, t, sums + j, sqs + j);
            if (m == 8) {
              store_scores<1, 8>(sums, r, bias, s, 0);
              if constexpr (Sq) _mm256_storeu_ps(sq + r, hsum8(sqs));
            } else {
              for (std::size_t i = 0; i < m; ++i) {
                s[r + i] = hsum(sums[i]) + b;
                if constexpr (Sq) sq[r + i] = hsum(sqs[i]);
              }
            }
            r += m;
          }
          return;
        }
      }
      if constexpr (F == RowFormat::code4) {
        if (rows.chunks <= kHalvesMaxChunks) {
          alignas(32) float wp[8 * kHalvesMaxChunks];
          wide_order_weights(w, rows.chunks, wp);
          for (; r + RP <= rows.n; r += RP) score_block_paired<F, RP, true>(rows, r, wp, bias, s);
          for (; r < rows.n; ++r) score_block_paired<F, 1, true>(rows, r, wp, bias, s);
          return;
        }
      }
      for (; r + RP <= rows.n; r += RP) score_block_paired<F, RP, false, Sq>(rows, r, w, bias, s, sq);
      for (; r < rows.n; ++r) score_block_paired<F, 1, false, Sq>(rows, r, w, bias, s, sq);
#endif
      return;
    }
  }
#ifndef __AVX512F__
  if constexpr (F == RowFormat::level4) {
    if (rows.chunks % 4 == 0 && rows.chunks <= kQuadMaxChunks) {
      alignas(32) float wq[NQ * 8 * kQuadMaxChunks];
      quad_order_weights<NQ>(w, ws, rows.chunks, wq);
      const LevelPlanes t = level_planes(rows.levels);
      const std::size_t wqs = 8 * rows.chunks;
      // Two heads: 3 rows a block. With 4 rows (8 accumulators, 4 more for the sums of squares, the
      // four byte planes and a quad of values) GCC spilled; 2 rows left the loads of the weights
      // uncovered (GQA 2, head_dim 128, min ms: turboquant_4bit_nc 0.925 -> 0.879-0.883 (2 rows
      // 0.894-0.899), nuq4 1.016-1.020 -> 0.978-0.983; 2026-12-07, AMD EPYC Zen 4, `akv -t 1 bench
      // attention --gqa 2 --isa avx2`; GQA 4's 2 rows were best of 1, 2 and 3).
      constexpr int RQ = NQ == 2 ? 3 : RB;
      for (; r + RQ <= rows.n; r += RQ) score_block<F, NQ, RQ, Sq, true>(rows, r, wq, wqs, bias, s, ss, sq, &t);
      for (; r < rows.n; ++r) score_block<F, NQ, 1, Sq, true>(rows, r, wq, wqs, bias, s, ss, sq, &t);
      return;
    }
  }
#endif
#ifdef __AVX512F__
  // 2 or 4 heads: two rows per 512-bit register. 8 heads keep the 256-bit loops (with 2 row pairs x 8
  // heads of accumulators, head_dim 64 ran 2-13% slower, 128 4-7% faster). One head over 4-bit levels
  // whose wide chunks do not pair (an odd chunk count) too, 16 rows a block. One head over 2- and
  // 3-bit levels takes the 256-bit loops, 16 rows a block (the row pairs measured slower: GQA 1,
  // head_dim 128, min ms with the 3-bit values below nuq2 0.65-0.67 -> 0.57-0.60, nuq3 0.73-0.75 ->
  // 0.61-0.70 by the variants run before it, turboquant_3bit_nc 0.62 -> 0.55-0.56; 2026-12-06, AMD
  // EPYC Zen 4, AVX-512, `akv -t 1 bench attention --gqa 1 --isa avx512`; on Intel Xeon the AVX2
  // build's 256-bit loops were already as fast as these row pairs or faster, docs/compress.md). Two
  // heads over 3-bit rows so too (their row pairs, never measured for 3 bits before, took longer: GQA
  // 2 q3 0.66-0.67 -> 0.59 ms at head_dim 128, 0.43-0.44 -> 0.39 at 64, nuq3 0.90-0.91 -> 0.85,
  // turboquant_3bit_nc 0.78-0.79 -> 0.745; GQA 4 within 1%, kept; same CPU, day and command, `--gqa
  // 2,4`). On AVX-512 of 256-bit units (core/isa.h avx512_halves: Zen 4) two heads over any rows so
  // (GQA 2, head_dim 128, min ms: q2 0.67-0.69 -> 0.60, q4 0.72-0.73 -> 0.63, nuq2 0.90 -> 0.84,
  // turboquant_4bit_nc 0.78-0.79 -> 0.74-0.75; f16 at head_dim 64 0.42 -> 0.37-0.39; same CPU and
  // day, `--gqa 2 --head-dims 64,128`), where Zen 5's 512-bit units measured the row pairs 1.00-1.11x
  // faster (2506fce); 4 heads keep them (within 5% either way).
  if constexpr ((NQ == 2 && code_bits<F>() != 3) || NQ == 4 || (NQ == 1 && F == RowFormat::level4)) {
    if (NQ != 2 || !avx512_halves()) {
      constexpr int RR = NQ == 1 ? kAccs : 2 * (kAccs / NQ);
      for (; r + RR <= rows.n; r += RR) score_block_rowpairs<F, NQ, RR, Sq>(rows, r, w, ws, bias, s, ss, sq);
      for (; r + 2 <= rows.n; r += 2) score_block_rowpairs<F, NQ, 2, Sq>(rows, r, w, ws, bias, s, ss, sq);
    }
  }
#endif
  // One head with sums of squares (TurboQuant NC's 2- and 3-bit level keys): half the rows a
  // block, as their accumulators double (AVX2: 8 rows took all 16 registers; GQA 1, head_dim 128,
  // min ms turboquant_3bit_nc 0.60-0.61 -> 0.58, turboquant:bits-key=2:bits-value=2 0.60-0.61 ->
  // 0.58, head_dim 64 within 1%; AVX-512 unchanged; 2026-12-06, AMD EPYC Zen 4, `akv -t 1 bench
  // attention --gqa 1 --head-dims 64,128 --isa avx512,avx2`). On AVX2 two heads so too (4 rows x
  // 2 heads and 4 rows' squares with the table left no register: GQA 2, head_dim 128,
  // turboquant_3bit_nc 0.90 -> 0.81 ms, turboquant:bits-key=2:bits-value=2 0.89 -> 0.81; same
  // host, day and command with --gqa 2, 6ab7045; AVX-512 5% slower so, kept).
#ifdef __AVX512F__
  constexpr int RS = Sq && NQ == 1 ? RB / 2 : RB;
#else
  constexpr int RS = Sq && NQ <= 2 ? RB / 2 : RB;
#endif
  for (; r + RS <= rows.n; r += RS) score_block<F, NQ, RS, Sq>(rows, r, w, ws, bias, s, ss, sq);
  for (; r < rows.n; ++r) score_block<F, NQ, 1, Sq>(rows, r, w, ws, bias, s, ss, sq);
}

// NQ heads from h on; the rows' sums of squares (sq, when given) with the first group of heads.
template <RowFormat F, int NQ>
void score_group(const Rows& rows, const float* w, std::size_t ws, const float* bias, float* s, std::size_t ss,
                 float* sq) {
  if (sq) return score_heads<F, NQ, true>(rows, w, ws, bias, s, ss, sq);
  score_heads<F, NQ, false>(rows, w, ws, bias, s, ss, nullptr);
}

template <RowFormat F>
void score_format(const Rows& rows, std::size_t nq, const float* w, std::size_t ws,
                  const float* bias, float* s, std::size_t ss, float* sq) {
  for (std::size_t h = 0; h < nq;) {
    const std::size_t left = nq - h;
    const float* b = bias ? bias + h : nullptr;
    float* q2 = h == 0 ? sq : nullptr;
    if (left >= 8) {
      score_group<F, 8>(rows, w + h * ws, ws, b, s + h * ss, ss, q2);
      h += 8;
    } else if (left >= 4) {
      score_group<F, 4>(rows, w + h * ws, ws, b, s + h * ss, ss, q2);
      h += 4;
    } else if (left >= 2) {
      score_group<F, 2>(rows, w + h * ws, ws, b, s + h * ss, ss, q2);
      h += 2;
    } else {
      score_group<F, 1>(rows, w + h * ws, ws, b, s + h * ss, ss, q2);
      h += 1;
    }
  }
}

// Calls fn(std::integral_constant<int, GW>{}) for a block of CB units (chunks, or wide chunks)
// starting at unit k0, with upg units per coefficient group: GW = CB when the block lies in one
// group, CB / 2 or CB / 4 when its groups are whole and start at k0, else 0 (any layout).
template <int CB, typename Fn>
[[gnu::always_inline]] inline void with_group_width(std::size_t k0, std::size_t upg, Fn&& fn) {
  if (k0 / upg == (k0 + CB - 1) / upg) return fn(std::integral_constant<int, CB>{});
  if constexpr (CB % 2 == 0) {
    if (upg == CB / 2 && k0 % upg == 0) return fn(std::integral_constant<int, CB / 2>{});
  }
  if constexpr (CB % 4 == 0) {
    if (upg == CB / 4 && k0 % upg == 0) return fn(std::integral_constant<int, CB / 4>{});
  }
  fn(std::integral_constant<int, 0>{});
}

// Whether unit j of a block starts a coefficient group, and that group, given the group g[] of
// every unit: fixed positions for GW > 0 (with_group_width), else tested.
template <int GW>
[[gnu::always_inline]] inline bool starts_group(int j, const std::size_t* g) {
  if constexpr (GW > 0) {
    return j % GW == 0;
  } else {
    return j == 0 || g[j] != g[j - 1];
  }
}
template <int GW>
[[gnu::always_inline]] inline std::size_t group_at(int j, const std::size_t* g) {
  if constexpr (GW > 0) {
    return g[0] + static_cast<std::size_t>(j / GW);
  } else {
    return g[j];
  }
}

// The multiply-adds of accumulate_block over all rows, with GW chunks per coefficient group
// inside the block (GW divides CB, groups start at chunk k0): the coefficients are broadcast at
// j % GW == 0 without testing each chunk's group, whose branches and spilled indices cost more
// than the FMAs when the rows sit in L1/L2 (f32 rows, head_dim 64, GQA 2: ~19 cycles a row
// with the test). GW = 0: any layout, the group of each chunk tested.
// Halves (AVX2, 4-bit rows): the units are half-chunks (load_half4) rather than chunks; a group's
// cpg chunks are its cpg half-chunks when cpg is even.
// Quads (AVX2, 4-bit level rows): chunks decoded four at a time (load_quad_levels), in quad-lane
// order.
template <RowFormat F, int NQ, int CB, int GW, bool Halves, bool Quads>
[[gnu::always_inline]] inline void accumulate_rows_in_block(const Rows& rows, std::size_t k0, std::size_t nq,
                                                            std::size_t h0, const float* coef, std::size_t ng,
                                                            std::size_t cpg, __m256* a) {
#ifndef __AVX512F__
  const __m256i mask = half4_mask();
  [[maybe_unused]] LevelPlanes t;
  if constexpr (Quads) t = level_planes(rows.levels);
#endif
  std::size_t g[CB];
  for (int j = 0; j < CB; ++j) g[j] = (k0 + static_cast<std::size_t>(j)) / cpg;
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    if (NQ > 1 && k0 == 0) prefetch_row(row, rows.stride);
    const float* cr = coef + (r * nq + h0) * ng;
    __m256 c[NQ];  // the row's coefficients, broadcast once per group (broadcasts compete with the FMAs)
#ifndef __AVX512F__
    [[maybe_unused]] __m256 xq[4];
#endif
    [[maybe_unused]] BlockConst scale{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_si256()};  // ggml blocks: once per block
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) {
      if (starts_group<GW>(j, g)) {
        const std::size_t gj = group_at<GW>(j, g);
        for (int h = 0; h < NQ; ++h) c[h] = _mm256_set1_ps(cr[static_cast<std::size_t>(h) * ng + gj]);
      }
      __m256 x;
      const std::size_t kj = k0 + static_cast<std::size_t>(j);
#ifndef __AVX512F__
      if constexpr (Quads) {
        if (j % 4 == 0) load_quad_levels(row, kj / 4, t, xq);
        x = xq[j % 4];
      } else if constexpr (Halves) {
        x = load_half4(row, kj, mask);
      } else
#endif
      if constexpr (kGgml<F>) {
        if (j == 0 || kj % 4 == 0) scale = ggml_block<F>(row, kj);
        x = ggml_values<F>(row, kj, scale);
      } else {
        x = load8<F>(row, kj, rows.levels);
      }
      for (int h = 0; h < NQ; ++h) a[h * CB + j] = _mm256_fmadd_ps(c[h], x, a[h * CB + j]);
    }
  }
}

// NQ heads (h0..h0+NQ of nq) x CB chunks starting at chunk k0, over all rows. Halves: CB
// half-chunks from half-chunk k0 (both even), unscaled and put in channel order at the end.
// Quads: CB chunks from chunk k0 (both multiples of 4), put back in channel order at the end.
template <RowFormat F, int NQ, int CB, bool Halves = false, bool Quads = false>
[[gnu::always_inline]] inline void accumulate_block(const Rows& rows, std::size_t k0, std::size_t nq, std::size_t h0,
                             const float* coef, std::size_t ng, std::size_t cpg, float* acc,
                             std::size_t as) {
  __m256 a[NQ * CB];
  for (auto& v : a) v = _mm256_setzero_ps();
  with_group_width<CB>(k0, cpg, [&](auto gw) {
    accumulate_rows_in_block<F, NQ, CB, decltype(gw)::value, Halves, Quads>(rows, k0, nq, h0, coef, ng, cpg, a);
  });
#ifndef __AVX512F__
  if constexpr (Quads) {
    static_assert(CB % 4 == 0);
    for (auto& v : a) v = _mm256_permutevar8x32_ps(v, quad_scatter());
  }
  if constexpr (Halves) {
    static_assert(CB % 2 == 0);
    const __m256 unscale = half4_unscale();
    for (int h = 0; h < NQ; ++h) {
      for (int j = 0; j < CB; j += 2) {
        // lo: values {0, 8, 1, 9, 2, 10, 3, 11}, hi: {4, 12, 5, 13, 6, 14, 7, 15} of a wide chunk
        const __m256 lo = _mm256_mul_ps(a[h * CB + j], unscale), hi = _mm256_mul_ps(a[h * CB + j + 1], unscale);
        const __m256 v0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
        const __m256 v1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
        float* p = acc + (h0 + static_cast<std::size_t>(h)) * as + 8 * (k0 + static_cast<std::size_t>(j));
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), v0));
        _mm256_storeu_ps(p + 8, _mm256_add_ps(_mm256_loadu_ps(p + 8), v1));
      }
    }
    return;
  }
#endif
  for (int h = 0; h < NQ; ++h) {
    for (int j = 0; j < CB; ++j) {
      float* p = acc + (h0 + static_cast<std::size_t>(h)) * as + 8 * (k0 + static_cast<std::size_t>(j));
      _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), lane_unscale<F>(a[h * CB + j])));
    }
  }
}

#ifdef __AVX512F__
// accumulate_rows_in_block for wide chunks (16 values; group of wide chunk j: 2 (k0 + j) / cpg).
template <RowFormat F, int NQ, int CB, int GW>
[[gnu::always_inline]] inline void accumulate_rows_in_block_wide(const Rows& rows, std::size_t k0, std::size_t nq,
                                                                 std::size_t h0, const float* coef, std::size_t ng,
                                                                 std::size_t cpg, __m512* a) {
  std::size_t g[CB];
  for (int j = 0; j < CB; ++j) g[j] = 2 * (k0 + static_cast<std::size_t>(j)) / cpg;
  const __m512i mask = kLevels<F> ? wide_shifts<F>() : wide_mask<F>();
  const __m512 table = kLevels<F> ? _mm512_loadu_ps(rows.levels) : _mm512_setzero_ps();
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    if (NQ > 1 && k0 == 0) prefetch_row(row, rows.stride);
    const float* cr = coef + (r * nq + h0) * ng;
    __m512 c[NQ];
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) {
      if (starts_group<GW>(j, g)) {
        const std::size_t gj = group_at<GW>(j, g);
        for (int h = 0; h < NQ; ++h) c[h] = _mm512_set1_ps(cr[static_cast<std::size_t>(h) * ng + gj]);
      }
      const std::size_t kj = k0 + static_cast<std::size_t>(j);
      const __m512 x = kLevels<F> ? load16_levels<F>(row, kj, mask, table) : load16<F>(row, kj, mask);
      for (int h = 0; h < NQ; ++h) a[h * CB + j] = _mm512_fmadd_ps(c[h], x, a[h * CB + j]);
    }
  }
}

// NQ heads x CB wide chunks starting at wide chunk k0, over all rows (values in wide_lane
// order; accumulators unscaled and put back in channel order at the end). Needs an even number
// of chunks per coefficient group.
template <RowFormat F, int NQ, int CB>
[[gnu::always_inline]] inline void accumulate_block_wide(const Rows& rows, std::size_t k0, std::size_t nq, std::size_t h0,
                                                         const float* coef, std::size_t ng, std::size_t cpg, float* acc,
                                                         std::size_t as) {
  __m512 a[NQ * CB];
  for (auto& v : a) v = _mm512_setzero_ps();
  // cpg / 2 wide chunks per coefficient group (cpg is even here).
  with_group_width<CB>(k0, cpg / 2, [&](auto gw) {
    accumulate_rows_in_block_wide<F, NQ, CB, decltype(gw)::value>(rows, k0, nq, h0, coef, ng, cpg, a);
  });
  const __m512 unscale = wide_unscale<F>();
  const __m512i scatter = wide_scatter<F>();
  for (int h = 0; h < NQ; ++h) {
    for (int j = 0; j < CB; ++j) {
      float* p = acc + (h0 + static_cast<std::size_t>(h)) * as + 16 * (k0 + static_cast<std::size_t>(j));
      __m512 v = kLevels<F> ? a[h * CB + j] : _mm512_mul_ps(a[h * CB + j], unscale);  // levels: not scaled
      if constexpr (code_bits<F>() == 4) v = _mm512_permutexvar_ps(scatter, v);
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), v));
    }
  }
}
#endif  // __AVX512F__

#ifdef __AVX512F__
// Dense value rows (f16, f32) of several query heads with one coefficient per row and head
// (ng == 1): 16 channels per 512-bit register in channel order, so each lane does the
// multiply-adds of accumulate_block's lane for that channel, in the same order (the same bits),
// with half the instructions; 8 / heads registers of 16 channels a pass. Measured 2026-12-01
// (AMD EPYC Zen 5, full-width AVX-512, 2 threads, 16K tokens, three alternating rounds): GQA 2
// 1.02-1.13x, GQA 4 1.09-1.26x, GQA 8 1.02-1.25x faster at head_dim 64 and 128; one head kept
// its 256-bit loops (16 chunks a pass), which the 512-bit ones did not beat there.
constexpr int kDenseValueAccs = 8;

template <RowFormat F>
[[gnu::always_inline]] inline __m512 load16_dense(const std::uint8_t* row, std::size_t k) {
  if constexpr (F == RowFormat::f32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + 16 * k);
  } else if constexpr (kGgml<F>) {  // half k % 2 of block k / 2: ggml_values' products
    const std::uint8_t* b = row + k / 2 * ggml_block_bytes<F>();
    const std::size_t p = k % 2;
    std::uint16_t h;
    std::memcpy(&h, b, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)));
    __m512i q;
    if constexpr (F == RowFormat::q8_0) {
      q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * p)));
    } else {
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + ggml_codes_at<F>()));
      const __m128i nib = _mm_and_si128(p ? _mm_srli_epi16(qs, 4) : qs, _mm_set1_epi8(0x0F));
      if constexpr (F == RowFormat::iq4_nl) {
        q = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)), nib));
      } else {
        __m128i code = nib;
        if constexpr (kGgmlFive<F>) {  // the half's 16 fifth bits as a byte mask of 16s
          std::uint16_t qh;
          std::memcpy(&qh, b + ggml_codes_at<F>() - 4 + 2 * p, 2);
          code = _mm_or_si128(code, _mm_maskz_mov_epi8(qh, _mm_set1_epi8(16)));
        }
        q = _mm512_cvtepu8_epi32(code);
        if constexpr (ggml_code_offset<F>() != 0) q = _mm512_sub_epi32(q, _mm512_set1_epi32(ggml_code_offset<F>()));
      }
    }
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
    if constexpr (kGgmlMin<F>) {
      std::memcpy(&h, b + 2, 2);
      return _mm512_add_ps(v, _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h))));
    }
    return v;
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * k)));
  }
}

// NQ heads x CB 16-channel chunks from 16-channel chunk k0, over all rows.
template <RowFormat F, int NQ, int CB>
[[gnu::always_inline]] inline void accumulate_block_dense16(const Rows& rows, std::size_t k0, std::size_t nq,
                                                            std::size_t h0, const float* coef, float* acc,
                                                            std::size_t as) {
  __m512 a[NQ * CB];
  for (auto& v : a) v = _mm512_setzero_ps();
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    if (NQ > 1 && k0 == 0) prefetch_row(row, rows.stride);
    const float* cr = coef + r * nq + h0;
    __m512 c[NQ];
    for (int h = 0; h < NQ; ++h) c[h] = _mm512_set1_ps(cr[h]);
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) {
      const __m512 x = load16_dense<F>(row, k0 + static_cast<std::size_t>(j));
      for (int h = 0; h < NQ; ++h) a[h * CB + j] = _mm512_fmadd_ps(c[h], x, a[h * CB + j]);
    }
  }
  for (int h = 0; h < NQ; ++h) {
    for (int j = 0; j < CB; ++j) {
      float* p = acc + (h0 + static_cast<std::size_t>(h)) * as + 16 * (k0 + static_cast<std::size_t>(j));
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), a[h * CB + j]));
    }
  }
}
#endif  // __AVX512F__

template <RowFormat F, int NQ>
void accumulate_heads(const Rows& rows, std::size_t nq, std::size_t h0, const float* coef,
                      std::size_t ng, std::size_t cpg, float* acc, std::size_t as) {
  constexpr int CB = 8 / NQ;  // more value accumulators measured slower (register pressure)
  std::size_t k = 0;
#ifdef __AVX512F__
  // One head, dense rows of at most 512 bytes: 16 chunks per pass with AVX-512's 32 registers,
  // so a row is read in one or two passes instead of two or four (2026-12-01, AMD EPYC Zen 5, 2
  // threads, 16K tokens: head_dim 128 f16 1.99 -> 1.37 ms, f32 3.30 -> 2.59 ms; head_dim 256 f16
  // 4.47 -> 3.74 ms; head_dim 256 f32 rows, 1 KB, ran 9% slower with 16 and keep 8).
  if constexpr (NQ == 1 && (F == RowFormat::f16 || F == RowFormat::f32)) {
    if (rows.stride <= 512) {
      for (; k + 16 <= rows.chunks; k += 16) accumulate_block<F, 1, 16>(rows, k, nq, h0, coef, ng, cpg, acc, as);
    }
  }
  // Several heads over dense rows with one coefficient per row and head: 16 channels per 512-bit
  // register.
  if constexpr (NQ >= 2 && (F == RowFormat::f16 || F == RowFormat::f32 || kGgml<F>)) {
    if (ng == 1 && rows.chunks % 2 == 0) {
      constexpr int CW = kDenseValueAccs / NQ > 0 ? kDenseValueAccs / NQ : 1;
      const std::size_t kw = rows.chunks / 2;
      for (; k + CW <= kw; k += CW) accumulate_block_dense16<F, NQ, CW>(rows, k, nq, h0, coef, acc, as);
      for (; k < kw; ++k) accumulate_block_dense16<F, NQ, 1>(rows, k, nq, h0, coef, acc, as);
      return;
    }
  }
#endif
#ifdef __AVX512F__
  // Level formats too (2 and 4 bits: one word a wide chunk; 3 bits: its two chunks' words; the
  // same sums per channel as the 8-wide loops: values are not scaled), except 3-bit levels for one
  // or two heads, whose 8-wide loops measured faster (nuq3, head_dim 128, min ms: GQA 1 0.65-0.67
  // -> 0.61, GQA 2 0.92-0.94 -> 0.90-0.91; GQA 4 slower, 1.29-1.31 -> 1.37; 2026-12-06, AMD EPYC
  // Zen 4, AVX-512, one core). On AVX-512 of 256-bit units (core/isa.h avx512_halves: Zen 4) one
  // head's code values take the 8-wide loops (GQA 1, min ms at head_dim 64: q2 0.311-0.312 ->
  // 0.277-0.284, q4 0.328-0.330 -> 0.295-0.301; at 128 within 2%; GQA 2 equal, kept; same CPU and
  // day, `akv -t 1 bench attention --gqa 1,2 --head-dims 64,128 --isa avx512`).
  if constexpr (kWide<F> || (kLevels<F> && (F != RowFormat::level3 || NQ >= 4))) {
    if (rows.chunks % 2 == 0 && cpg % 2 == 0 && (NQ > 1 || !kWide<F> || !avx512_halves())) {
      const std::size_t kw = rows.chunks / 2;
      // 4 or 8 heads: 16 accumulators of AVX-512's 32 registers, two passes over the rows at
      // head_dim 128 where 8 accumulators took four (2026-12-01, commit 5ace68b, AMD EPYC Zen 5,
      // AVX-512, one core, rows in L1, 2- and 4-bit: GQA 4 0.086 -> 0.080, GQA 8 0.099 -> 0.076
      // ns per 8 values and head; GQA 2 with 16 ran slower, 0.10 -> 0.11).
      constexpr int CW = NQ >= 4 ? 16 / NQ : CB;
      for (; k + CW <= kw; k += CW) accumulate_block_wide<F, NQ, CW>(rows, k, nq, h0, coef, ng, cpg, acc, as);
      for (; k < kw; ++k) accumulate_block_wide<F, NQ, 1>(rows, k, nq, h0, coef, ng, cpg, acc, as);
      return;
    }
  }
#else
  // 4-bit rows in half-chunks (load_half4), two at a time at least.
  if constexpr (F == RowFormat::code4 && CB % 2 == 0) {
    if (rows.chunks % 2 == 0 && cpg % 2 == 0) {
      for (; k + CB <= rows.chunks; k += CB) accumulate_block<F, NQ, CB, true>(rows, k, nq, h0, coef, ng, cpg, acc, as);
      for (; k < rows.chunks; k += 2) accumulate_block<F, NQ, 2, true>(rows, k, nq, h0, coef, ng, cpg, acc, as);
      return;
    }
  }
  // 4-bit level rows a quad of chunks per pass over the rows (one or two heads): with two quads,
  // one head's eight accumulators beside the quad's decode spilled two of them (a store-to-load
  // chain a row; `akv -t 1 bench attention --isa avx2 --gqa 1 --variants q4,nuq4`, AMD EPYC Zen 4,
  // 2026-12-07, min ms: head_dim 64 0.471-0.475 -> 0.456-0.462, 128 0.762-0.767 -> 0.742-0.759).
  if constexpr (F == RowFormat::level4 && CB % 4 == 0) {
    if (rows.chunks % 4 == 0) {
      for (; k < rows.chunks; k += 4) accumulate_block<F, NQ, 4, false, true>(rows, k, nq, h0, coef, ng, cpg, acc, as);
      return;
    }
  }
#endif
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
    case RowFormat::level2: return fn(std::integral_constant<RowFormat, RowFormat::level2>{});
    case RowFormat::level3: return fn(std::integral_constant<RowFormat, RowFormat::level3>{});
    case RowFormat::level4: return fn(std::integral_constant<RowFormat, RowFormat::level4>{});
    case RowFormat::e4m3: return fn(std::integral_constant<RowFormat, RowFormat::e4m3>{});
    case RowFormat::e5m2: return fn(std::integral_constant<RowFormat, RowFormat::e5m2>{});
    case RowFormat::q8_0: return fn(std::integral_constant<RowFormat, RowFormat::q8_0>{});
    case RowFormat::q4_0: return fn(std::integral_constant<RowFormat, RowFormat::q4_0>{});
    case RowFormat::q4_1: return fn(std::integral_constant<RowFormat, RowFormat::q4_1>{});
    case RowFormat::q5_0: return fn(std::integral_constant<RowFormat, RowFormat::q5_0>{});
    case RowFormat::q5_1: return fn(std::integral_constant<RowFormat, RowFormat::q5_1>{});
    case RowFormat::iq4_nl: return fn(std::integral_constant<RowFormat, RowFormat::iq4_nl>{});
  }
}

// kernels.h nibble_sums: rows in lanes, 16 at a time (AVX-512 one 512-bit chain per head, AVX2
// two 256-bit chains of 8). Each nibble is looked up by a permute of each head's 16-entry table
// (AVX2: two 8-entry permutes and a blend on the nibble's top bit).
#ifdef __AVX512F__
using NibbleLanes = __m512i;  // 16 rows' 4-byte groups, row r in lane r
using NibbleAcc = __m512;
#else
struct NibbleLanes {
  __m256i x[2];  // rows 0-7, 8-15
};
struct NibbleAcc {
  __m256 a[2];
};
#endif

// acc[h] += head h's entries of the `count` nibbles of each lane's 4-byte group (tables t + h ts).
template <int NQ>
[[gnu::always_inline]] inline void nibble_group(const NibbleLanes& x, std::size_t count, const float* t, std::size_t ts,
                                                NibbleAcc (&acc)[NQ]) {
#pragma GCC unroll 8
  for (std::size_t k = 0; k < count; ++k) {
#ifdef __AVX512F__
    const __m512i nib = _mm512_srli_epi32(x, static_cast<unsigned>(4 * k));
    for (int h = 0; h < NQ; ++h) {
      acc[h] = _mm512_add_ps(acc[h], _mm512_permutexvar_ps(nib, _mm512_loadu_ps(t + h * ts + 16 * k)));
    }
#else
    __m256i nib[2];
    __m256 top[2];
    for (int j = 0; j < 2; ++j) {
      nib[j] = _mm256_srli_epi32(x.x[j], static_cast<int>(4 * k));
      top[j] = _mm256_castsi256_ps(_mm256_slli_epi32(x.x[j], static_cast<int>(28 - 4 * k)));
    }
    for (int h = 0; h < NQ; ++h) {
      const __m256 lo = _mm256_loadu_ps(t + h * ts + 16 * k), hi = _mm256_loadu_ps(t + h * ts + 16 * k + 8);
      for (int j = 0; j < 2; ++j) {
        const __m256 e_lo = _mm256_permutevar8x32_ps(lo, nib[j]), e_hi = _mm256_permutevar8x32_ps(hi, nib[j]);
        acc[h].a[j] = _mm256_add_ps(acc[h].a[j], _mm256_blendv_ps(e_lo, e_hi, top[j]));
      }
    }
#endif
  }
}

// Four consecutive 4-byte groups (16 bytes at b + r stride) of 16 rows, x[p] the p-th: each row
// read by one 16-byte load, four rows a register (row k + 4 L in 128-bit lane L of register k;
// AVX2: rows k and k + 4 of each eight), then a 4 x 4 transpose of 32-bit words in each lane.
[[gnu::always_inline]] inline void nibble_transpose(const std::uint8_t* b, std::size_t stride, NibbleLanes (&x)[4]) {
  const auto row = [&](std::size_t r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + r * stride)); };
#ifdef __AVX512F__
  __m512i z[4];
  for (std::size_t k = 0; k < 4; ++k) {
    z[k] = _mm512_inserti32x4(_mm512_castsi128_si512(row(k)), row(4 + k), 1);
    z[k] = _mm512_inserti32x4(_mm512_inserti32x4(z[k], row(8 + k), 2), row(12 + k), 3);
  }
  const __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
  x[0] = _mm512_unpacklo_epi64(a0, a2);
  x[1] = _mm512_unpackhi_epi64(a0, a2);
  x[2] = _mm512_unpacklo_epi64(a1, a3);
  x[3] = _mm512_unpackhi_epi64(a1, a3);
#else
  for (std::size_t half = 0; half < 2; ++half) {
    __m256i z[4];
    for (std::size_t k = 0; k < 4; ++k) z[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(row(8 * half + k)), row(8 * half + 4 + k), 1);
    const __m256i a0 = _mm256_unpacklo_epi32(z[0], z[1]), a1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(z[2], z[3]), a3 = _mm256_unpackhi_epi32(z[2], z[3]);
    x[0].x[half] = _mm256_unpacklo_epi64(a0, a2);
    x[1].x[half] = _mm256_unpackhi_epi64(a0, a2);
    x[2].x[half] = _mm256_unpacklo_epi64(a1, a3);
    x[3].x[half] = _mm256_unpackhi_epi64(a1, a3);
  }
#endif
}

// One 4-byte group (nb <= 4 bytes at b + r stride + 4 g) of rows r < m, zero past them, through
// the stack.
[[gnu::always_inline]] inline NibbleLanes nibble_stack(const std::uint8_t* b, std::size_t stride, std::size_t g,
                                                       std::size_t nb, std::size_t m) {
  alignas(64) std::uint32_t v[16];
  if (nb == 4 && m == 16) {
    for (std::size_t r = 0; r < 16; ++r) std::memcpy(&v[r], b + r * stride + 4 * g, 4);
  } else {
    std::fill_n(v, 16, 0u);
    for (std::size_t r = 0; r < m; ++r) std::memcpy(&v[r], b + r * stride + 4 * g, nb);
  }
#ifdef __AVX512F__
  return _mm512_load_si512(v);
#else
  return {{_mm256_load_si256(reinterpret_cast<const __m256i*>(v)), _mm256_load_si256(reinterpret_cast<const __m256i*>(v + 8))}};
#endif
}

template <int NQ>
void nibble_heads(const float* table, std::size_t nibbles, const std::uint8_t* bits, std::size_t stride,
                  std::size_t n, float* out, std::size_t os) {
  constexpr std::size_t B = 16;
  const std::size_t bytes = nibbles / 2, ts = 16 * nibbles;  // a head's table: nibbles x 16 entries
  for (std::size_t i = 0; i < n; i += B) {
    const std::size_t m = std::min(B, n - i);
    const std::uint8_t* b = bits + i * stride;
    NibbleAcc acc[NQ];
#ifdef __AVX512F__
    for (auto& a : acc) a = _mm512_setzero_ps();
#else
    for (auto& a : acc) a.a[0] = a.a[1] = _mm256_setzero_ps();
#endif
    std::size_t g = 0;  // 4-byte groups done
    if (m == B) {
      for (; 4 * g + 16 <= bytes; g += 4) {
        NibbleLanes x[4];
        nibble_transpose(b + 4 * g, stride, x);
        for (std::size_t p = 0; p < 4; ++p) nibble_group<NQ>(x[p], 8, table + 128 * (g + p), ts, acc);
      }
    }
    for (; 4 * g < bytes; ++g) {
      const std::size_t nb = std::min<std::size_t>(4, bytes - 4 * g);
      nibble_group<NQ>(nibble_stack(b, stride, g, nb, m), 2 * nb, table + 128 * g, ts, acc);
    }
    for (int h = 0; h < NQ; ++h) {
      alignas(64) float o[B];
      float* dst = m == B ? out + h * os + i : o;
#ifdef __AVX512F__
      _mm512_storeu_ps(dst, acc[h]);
#else
      _mm256_storeu_ps(dst, acc[h].a[0]);
      _mm256_storeu_ps(dst + 8, acc[h].a[1]);
#endif
      if (m < B) std::copy_n(o, m, out + h * os + i);
    }
  }
}

}  // namespace

void nibble_sums_simd(const float* table, std::size_t nq, std::size_t nibbles, const std::uint8_t* bits,
                      std::size_t stride, std::size_t n, float* out, std::size_t os) {
  const std::size_t ts = 16 * nibbles;
  std::size_t h = 0;
  for (; h + 2 <= nq; h += 2) nibble_heads<2>(table + h * ts, nibbles, bits, stride, n, out + h * os, os);
  if (h < nq) nibble_heads<1>(table + h * ts, nibbles, bits, stride, n, out + h * os, os);
}

void score_rows_simd(const Rows& rows, std::size_t nq, const float* w, std::size_t ws, const float* bias,
                     float* s, std::size_t ss, float* sq) {
  with_format(rows.format, [&](auto f) { score_format<decltype(f)::value>(rows, nq, w, ws, bias, s, ss, sq); });
}

void accumulate_rows_simd(const Rows& rows, std::size_t nq, const float* coef, std::size_t ng,
                          std::size_t cpg, float* acc, std::size_t as) {
  with_format(rows.format, [&](auto f) { accumulate_format<decltype(f)::value>(rows, nq, coef, ng, cpg, acc, as); });
}

}  // namespace akv::attn::AKV_SIMD_NS
