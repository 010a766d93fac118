#pragma once
// Vector loops of the integer attention path (internal; int8.h): included by int8.cpp (x86-64-v3:
// AVX2) and by int8_avx512.cpp (the same 256-bit loops compiled with AVX-512 VL and VNNI, which
// fuses the 16-bit multiply and the 32-bit add of the key loop into vpdpwssd, and with 32
// registers for more rows per block; plus the 512-bit VNNI key and value loops over transposed
// rows and the 512-bit roundings), each time inside namespace akv::attn::AKV_SIMD_NS. Integer
// sums are exact and the roundings do the plain loops' operations, so every build gives the bits
// of the plain loops. Only intrinsics and plain code here (see kernels_simd.h).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "akv/attention/int8.h"
#include "akv/attention/prefetch.h"

namespace akv::attn::AKV_SIMD_NS {
namespace {

// Bytes 4i + k of each 16 grouped by k (bytes 0, 4, 8, 12, 1, 5, ...), in both 128-bit lanes.
[[gnu::always_inline]] inline __m256i group_bytes_by4(__m256i v) {
  const __m256i order = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm256_shuffle_epi8(v, order);
}

// A block of 32 rounded weights w (int8, channel order) stored in channel order, in
// int8_lane_channel order and as quads (Int8Weights' layouts).
[[gnu::always_inline]] inline void store_weight_block(__m256i w, RowFormat f, std::int8_t* natural, std::int8_t* lanes,
                                                      std::int8_t* quads) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(natural), w);
  __m256i l;
  if (f == RowFormat::code4) {  // even bytes then odd bytes of each half, then halves interleaved by 8 bytes
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    l = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
    const __m256i quad = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                          0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quads), _mm256_shuffle_epi8(w, quad));
  } else {  // bytes 4i + k grouped by k in each half (the quads), then the halves' groups interleaved
    const __m256i grouped = group_bytes_by4(w);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quads), grouped);
    l = _mm256_permutevar8x32_epi32(grouped, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), l);
}

#ifdef __AVX512BW__
// quantize_weights_int8 with 512-bit vectors for heads of 1, 2, 4, 8 or 16 blocks: the largest
// |w| of 4 blocks reduced together into one vector, the multipliers and steps of 16 blocks (of 1
// to 16 heads) in one vector (the plain loop's operations: a division, a multiply, a division, a
// ceiling, a clamp, a product and a reciprocal), kept in registers, so the division latencies are
// paid once per 16 blocks; then each block rounded 16 at a time (multiply, clamp, convert to
// nearest even: the plain loop's codes).

// x * inv clamped to [lo, hi], converted to nearest even (int8.cpp's round_epi32, 16 lanes).
[[gnu::always_inline]] inline __m512i round16(__m512 x, __m512 inv, __m512 lo, __m512 hi) {
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, inv), lo), hi));
}

// Lanes 4i + k (every i) = max |x| over block k of the 4 blocks at x (0 for k >= count).
[[gnu::always_inline]] inline __m512 block_max4(const float* x, std::size_t count) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 m[4];
  for (std::size_t k = 0; k < 4; ++k) {
    const __mmask16 live = k < count ? 0xFFFF : 0;
    m[k] = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_maskz_loadu_ps(live, x + 32 * k)),
                         _mm512_andnot_ps(sign, _mm512_maskz_loadu_ps(live, x + 32 * k + 16)));
  }
  // Per 128-bit lane: [m0 0|2, m1 0|2, m0 1|3, m1 1|3], then [m0, m1, m2, m3], then across lanes.
  const __m512 a = _mm512_max_ps(_mm512_unpacklo_ps(m[0], m[1]), _mm512_unpackhi_ps(m[0], m[1]));
  const __m512 b = _mm512_max_ps(_mm512_unpacklo_ps(m[2], m[3]), _mm512_unpackhi_ps(m[2], m[3]));
  __m512 c = _mm512_max_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  c = _mm512_max_ps(c, _mm512_shuffle_f32x4(c, c, 0x4E));
  return _mm512_max_ps(c, _mm512_shuffle_f32x4(c, c, 0xB1));
}

// Heads h0 .. h0+hn (hn * nb <= 16 lanes, lane hi * nb + b = block b of head h0 + hi).
inline void quantize_heads_avx512(const float* w, RowFormat f, const Int8WeightsOut& o, std::size_t h0,
                                  std::size_t hn) {
  const std::size_t nb = o.cols / kInt8Block;
  const __m512 lo = _mm512_set1_ps(-kInt8Levels), hi = _mm512_set1_ps(kInt8Levels), one = _mm512_set1_ps(1.0f);
  const __m512 zero = _mm512_setzero_ps();
  // The heads' blocks are consecutive in w: lane B = block B of the batch.
  __m512 bm = zero;
  for (std::size_t b = 0; b < hn * nb; b += 4) {
    bm = _mm512_mask_mov_ps(bm, static_cast<__mmask16>(0xFu << b), block_max4(w + h0 * o.cols + 32 * b, hn * nb - b));
  }
  // Each lane: the largest block maximum of its head (nb = 1, 2, 4, 8 or 16 lanes).
  __m512 amax = bm;
  if (nb >= 2) amax = _mm512_max_ps(amax, _mm512_permute_ps(amax, 0xB1));
  if (nb >= 4) amax = _mm512_max_ps(amax, _mm512_permute_ps(amax, 0x4E));
  if (nb >= 8) amax = _mm512_max_ps(amax, _mm512_shuffle_f32x4(amax, amax, 0xB1));
  if (nb >= 16) amax = _mm512_max_ps(amax, _mm512_shuffle_f32x4(amax, amax, 0x4E));
  const __m512 u = _mm512_div_ps(amax, _mm512_set1_ps(kInt8Levels * kInt8MaxMult));
  __m512 m = _mm512_roundscale_ps(_mm512_div_ps(bm, _mm512_mul_ps(_mm512_set1_ps(kInt8Levels), u)),
                                  _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  m = _mm512_min_ps(_mm512_max_ps(m, one), _mm512_set1_ps(kInt8MaxMult));
  m = _mm512_mask_mov_ps(one, _mm512_cmp_ps_mask(u, zero, _CMP_GT_OQ), m);
  const __m512 step = _mm512_mul_ps(u, m);
  const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(step, zero, _CMP_GT_OQ), one, step);
  const auto live = static_cast<__mmask16>((1u << (hn * nb)) - 1);
  const __m256i m16 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(m));
  _mm256_mask_storeu_epi16(o.mult + h0 * nb, live, m16);
  const __m512i first = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(static_cast<int>(nb)));  // lane i: head i's first block
  _mm512_mask_storeu_ps(o.unit + h0, static_cast<__mmask16>((1u << hn) - 1), _mm512_permutexvar_ps(first, u));
  for (std::size_t i = 0; i < hn; ++i) {
    const std::size_t h = h0 + i;
    const float* x = w + h * o.cols;
    for (std::size_t b = 0; b < nb; ++b) {
      const auto lane = static_cast<int>(i * nb + b);
      const __m512 v = _mm512_permutexvar_ps(_mm512_set1_epi32(lane), inv);
      const __m128i a = _mm512_cvtepi32_epi8(round16(_mm512_loadu_ps(x + 32 * b), v, lo, hi));
      const __m128i c = _mm512_cvtepi32_epi8(round16(_mm512_loadu_ps(x + 32 * b + 16), v, lo, hi));
      const __m256i wb = _mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1);
      store_weight_block(wb, f, o.w + h * o.cols + 32 * b, o.lanes + (b * o.nq + h) * kInt8Block,
                         o.quads + h * o.cols + 32 * b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.mult16 + (b * o.nq + h) * 16),
                          _mm256_permutexvar_epi16(_mm256_set1_epi16(static_cast<short>(lane)), m16));
    }
  }
}

// quantize_coefficients_int8 with 512-bit vectors, 16 entries at a time (the plain loop's
// operations: maximum, division, reciprocal, multiply, clamp, convert to nearest even); false
// when a coefficient is negative or not finite (the plain loop then says which).
inline bool quantize_coefficients_avx512(const float* coef, std::size_t n, std::size_t e, std::uint32_t* quads,
                                         float* sigma) {
  const __m512 zero = _mm512_setzero_ps(), levels = _mm512_set1_ps(kInt8Levels);
  const __m512 big = _mm512_set1_ps(3.40282347e38f);  // the largest finite float
  for (std::size_t j = 0; j < e; j += 16) {
    const auto live = static_cast<__mmask16>(e - j >= 16 ? 0xFFFF : (1u << (e - j)) - 1);
    __m512 cmax = zero;
    unsigned bad = 0;  // lanes with a value not in [0, big] (NaN included): independent compares, OR-ed
    for (std::size_t r = 0; r < n; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(live, coef + r * e + j);
      bad |= _mm512_cmp_ps_mask(x, zero, _CMP_NGE_UQ) | _mm512_cmp_ps_mask(x, big, _CMP_NLE_UQ);
      cmax = _mm512_max_ps(cmax, x);
    }
    if (bad != 0) return false;
    _mm512_mask_storeu_ps(sigma + j, live, _mm512_div_ps(cmax, levels));
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(cmax, zero, _CMP_GT_OQ), levels, cmax);
    for (std::size_t q = 0; q < (n + 3) / 4; ++q) {
      __m512i w = _mm512_setzero_si512();
      for (std::size_t i = 0; i < 4 && 4 * q + i < n; ++i) {
        const __m512 x = _mm512_maskz_loadu_ps(live, coef + (4 * q + i) * e + j);
        const __m512i c = round16(x, inv, zero, levels);
        w = _mm512_or_si512(w, _mm512_sll_epi32(c, _mm_cvtsi32_si128(static_cast<int>(8 * i))));
      }
      _mm512_mask_storeu_epi32(quads + q * e + j, live, w);
    }
  }
  return true;
}

// nb = cols / 32 of 1, 2, 4, 8 or 16: 16 / nb heads per vector.
inline void quantize_weights_avx512(const float* w, RowFormat f, const Int8WeightsOut& o) {
  const std::size_t per = kInt8VectorBlocks / (o.cols / kInt8Block);
  for (std::size_t h = 0; h < o.nq; h += per) quantize_heads_avx512(w, f, o, h, o.nq - h < per ? o.nq - h : per);
}
#endif

#ifdef __AVX512VL__
constexpr int kIntAccs = 16;
#else
constexpr int kIntAccs = 8;
#endif

template <RowFormat F>
constexpr std::size_t block_bytes() {
  return F == RowFormat::code4 ? 16 : 8;  // bytes of 32 codes
}

// 32 codes (one block of a row) as bytes in int8_lane_channel order.
template <RowFormat F>
[[gnu::always_inline]] inline __m256i unpack_block(const std::uint8_t* p) {
  if constexpr (F == RowFormat::code4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
  } else {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i lo = _mm_unpacklo_epi64(x, _mm_srli_epi16(x, 2));
    const __m128i hi = _mm_unpacklo_epi64(_mm_srli_epi16(x, 4), _mm_srli_epi16(x, 6));
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), _mm256_set1_epi8(3));
  }
}

// acc + (pair sums of t) * m, lane by lane (32-bit).
[[gnu::always_inline]] inline __m256i madd_add(__m256i acc, __m256i t, __m256i m) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, t, m);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(t, m));
#endif
}

// Lane i of the result = sum of the lanes of v[i].
inline __m256i hsum8_epi32(const __m256i* v) {
  const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
  return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}


inline float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// Rows r0 .. r0+RB, heads h0 .. h0+NQ: integer sums, then s = fma(unit, sum, bias).
template <RowFormat F, int NQ, int RB>
[[gnu::always_inline]] inline void score_block_int8(const Rows& rows, std::size_t r0, const Int8WeightsView& w,
                                                    std::size_t h0, const float* bias, float* s, std::size_t ss,
                                                    __m256 u, __m256 bv) {
  __m256i acc[RB * NQ];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const std::uint8_t* row[RB];
  for (int r = 0; r < RB; ++r) {
    row[r] = rows.base + (r0 + static_cast<std::size_t>(r)) * rows.stride;
    prefetch_row(row[r], rows.stride);
  }
  const std::size_t nb = w.cols / kInt8Block;
  for (std::size_t b = 0; b < nb; ++b) {
    // This block's weights and multipliers of heads h0.. (consecutive: one pointer each).
    const std::int8_t* wl = w.lanes + (b * w.nq + h0) * kInt8Block;
    const std::int16_t* m16 = w.mult16 + (b * w.nq + h0) * 16;
    for (int r = 0; r < RB; ++r) {
      const __m256i x = unpack_block<F>(row[r] + b * block_bytes<F>());
      for (int h = 0; h < NQ; ++h) {
        const std::size_t hh = static_cast<std::size_t>(h);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wl + hh * kInt8Block));
        const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m16 + hh * 16));
        acc[r * NQ + h] = madd_add(acc[r * NQ + h], _mm256_maddubs_epi16(x, wv), m);
      }
    }
  }
  // s = fma(unit, float(sum), bias): 8 sums at a time where the count allows (u, bv: lane t
  // holds head h0 + t % NQ's unit and bias).
  if constexpr (RB * NQ % 8 == 0) {
    alignas(32) float out[8];
    for (int i = 0; i < RB * NQ; i += 8) {
      _mm256_store_ps(out, _mm256_fmadd_ps(u, _mm256_cvtepi32_ps(hsum8_epi32(acc + i)), bv));
      for (int t = 0; t < 8; ++t) {
        const int r = (i + t) / NQ, h = (i + t) % NQ;
        s[(h0 + static_cast<std::size_t>(h)) * ss + r0 + static_cast<std::size_t>(r)] = out[t];
      }
    }
  } else {
    for (int r = 0; r < RB; ++r) {
      for (int h = 0; h < NQ; ++h) {
        alignas(32) std::int32_t l[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(l), acc[r * NQ + h]);
        const std::int32_t sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        const std::size_t hh = h0 + static_cast<std::size_t>(h);
        s[hh * ss + r0 + static_cast<std::size_t>(r)] = fma1(w.unit[hh], static_cast<float>(sum), bias ? bias[hh] : 0.0f);
      }
    }
  }
}

template <RowFormat F, int NQ>
void score_heads_int8(const Rows& rows, const Int8WeightsView& w, std::size_t h0, const float* bias, float* s,
                      std::size_t ss) {
  constexpr int RB = kIntAccs / NQ;
  float ul[8], bl[8];
  for (int t = 0; t < 8; ++t) {
    const std::size_t hh = h0 + static_cast<std::size_t>(t % NQ);
    ul[t] = w.unit[hh];
    bl[t] = bias ? bias[hh] : 0.0f;
  }
  const __m256 u = _mm256_setr_ps(ul[0], ul[1], ul[2], ul[3], ul[4], ul[5], ul[6], ul[7]);
  const __m256 bv = _mm256_setr_ps(bl[0], bl[1], bl[2], bl[3], bl[4], bl[5], bl[6], bl[7]);
  std::size_t r = 0;
  for (; r + RB <= rows.n; r += RB) score_block_int8<F, NQ, RB>(rows, r, w, h0, bias, s, ss, u, bv);
  for (; r < rows.n; ++r) score_block_int8<F, NQ, 1>(rows, r, w, h0, bias, s, ss, u, bv);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// 2- and 4-bit key rows with AVX-512 VNNI, 16 rows at a time with one row per 32-bit lane (rows
// of 32 bytes: two rows per lane, 32 at a time): each 64-byte slice of the 16 rows is transposed
// (t[k] lane r = 32-bit word k of row r), each word split into its fields (4 bytes per lane each)
// and multiplied with vpdpbusd against the matching weights broadcast, so one instruction does 64
// products and no horizontal sums remain; each block of 32 channels is then scaled by its
// multiplier. The integer sums are score_block_int8's, so the scores are the same bits.

// t[k] lane r = 32-bit word k of a[r] (a is overwritten).
[[gnu::always_inline]] inline void transpose16(__m512i (&a)[16], __m512i (&t)[16]) {
  __m512i b[16];
  for (int r = 0; r < 16; r += 2) {
    b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
    b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
  }
  // a[4g + m], 128-bit lane L: rows 4g .. 4g+3 of word m + 4L.
  for (int g = 0; g < 16; g += 4) {
    a[g] = _mm512_unpacklo_epi64(b[g], b[g + 2]);
    a[g + 1] = _mm512_unpackhi_epi64(b[g], b[g + 2]);
    a[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
    a[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x0 = _mm512_shuffle_i32x4(a[m], a[4 + m], 0x88), x1 = _mm512_shuffle_i32x4(a[m], a[4 + m], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(a[8 + m], a[12 + m], 0x88), y1 = _mm512_shuffle_i32x4(a[8 + m], a[12 + m], 0xDD);
    t[m] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    t[m + 8] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    t[m + 4] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    t[m + 12] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// Heads h0 .. h0+NQ over 16 rows from r0 (rows of a multiple of 64 bytes), or (Pair: rows of 32
// bytes) over 32 rows: rows r0 + i and r0 + 16 + i side by side in lane i, the slice's first half
// of blocks summed for the first, the second half for the other. A 32-bit word of a row holds 8
// (4 bits) or 16 (2 bits) channels; its 2 or 4 fields (codes at bit 4m or 2m of each byte) are
// multiplied against the matching dword of Int8Weights::quads.
template <RowFormat F, int NQ, bool Pair>
[[gnu::always_inline]] inline void score_rows16_vnni(const Rows& rows, std::size_t r0, const Int8WeightsView& w,
                                                     std::size_t h0, const float* bias, float* s, std::size_t ss) {
  constexpr int kBits = F == RowFormat::code4 ? 4 : 2, kFields = 8 / kBits;
  constexpr int kWordsPerBlock = kBits, kBlocksPerSlice = 16 / kWordsPerBlock;  // 32 channels; 16 words
  constexpr int kHalves = Pair ? 2 : 1;
  const std::uint8_t* row[16 * kHalves];
  for (int r = 0; r < 16 * kHalves; ++r) {
    row[r] = rows.base + (r0 + static_cast<std::size_t>(r)) * rows.stride;
    if (h0 == 0) prefetch_row(row[r], rows.stride);
  }
  const std::size_t words = w.cols * kBits / 32, nb = w.cols / kInt8Block;
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1));
  __m512i sum[kHalves][NQ];
  for (auto& sh : sum) {
    for (auto& v : sh) v = _mm512_setzero_si512();
  }
  for (std::size_t j = 0; j < (Pair ? 1 : words / 16); ++j) {
    __m512i a[16], t[16];
    for (int r = 0; r < 16; ++r) {
      if constexpr (Pair) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r]));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[16 + r]));
        a[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      } else {
        a[r] = _mm512_loadu_si512(row[r] + 64 * j);
      }
    }
    transpose16(a, t);
    for (int b = 0; b < kBlocksPerSlice; ++b) {  // blocks of 32 channels: words kWordsPerBlock * b .. of the slice
      const int half = Pair ? b / (kBlocksPerSlice / 2) : 0;
      const std::size_t blk = Pair ? static_cast<std::size_t>(b % (kBlocksPerSlice / 2))
                                   : kBlocksPerSlice * j + static_cast<std::size_t>(b);
      __m512i part[NQ];
      for (auto& v : part) v = _mm512_setzero_si512();
      for (int c = 0; c < kWordsPerBlock; ++c) {
        const std::size_t k = kWordsPerBlock * blk + static_cast<std::size_t>(c);  // word of the row
        const __m512i x = t[kWordsPerBlock * b + c];
        for (int m = 0; m < kFields; ++m) {
          const __m512i f = _mm512_and_si512(m == 0 ? x : _mm512_srli_epi32(x, static_cast<unsigned>(kBits * m)), mask);
          for (int h = 0; h < NQ; ++h) {
            std::int32_t qw;
            std::memcpy(&qw, w.quads + ((h0 + static_cast<std::size_t>(h)) * words + k) * 4 * kFields + 4 * m, 4);
            part[h] = _mm512_dpbusd_epi32(part[h], f, _mm512_set1_epi32(qw));
          }
        }
      }
      for (int h = 0; h < NQ; ++h) {
        const std::int16_t m = w.mult[(h0 + static_cast<std::size_t>(h)) * nb + blk];
        sum[half][h] = _mm512_add_epi32(sum[half][h], _mm512_mullo_epi32(part[h], _mm512_set1_epi32(m)));
      }
    }
  }
  for (int half = 0; half < kHalves; ++half) {
    for (int h = 0; h < NQ; ++h) {
      const std::size_t hh = h0 + static_cast<std::size_t>(h);
      const __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(w.unit[hh]), _mm512_cvtepi32_ps(sum[half][h]),
                                       _mm512_set1_ps(bias ? bias[hh] : 0.0f));
      _mm512_storeu_ps(s + hh * ss + r0 + 16 * static_cast<std::size_t>(half), v);
    }
  }
}

// Rows in blocks of 16 (32 for rows of 32 bytes; score_rows16_vnni, heads 4, 2, 1 at a time);
// returns the rows done.
template <RowFormat F, bool Pair>
inline std::size_t score_rows_vnni(const Rows& rows, const Int8WeightsView& w, const float* bias, float* s,
                                   std::size_t ss) {
  constexpr std::size_t kRows = Pair ? 32 : 16;
  std::size_t r = 0;
  for (; r + kRows <= rows.n; r += kRows) {
    for (std::size_t h = 0; h < w.nq;) {
      const std::size_t left = w.nq - h;
      if (left >= 4) {
        score_rows16_vnni<F, 4, Pair>(rows, r, w, h, bias, s, ss);
        h += 4;
      } else if (left >= 2) {
        score_rows16_vnni<F, 2, Pair>(rows, r, w, h, bias, s, ss);
        h += 2;
      } else {
        score_rows16_vnni<F, 1, Pair>(rows, r, w, h, bias, s, ss);
        h += 1;
      }
    }
  }
  return r;
}

#endif

template <RowFormat F>
void score_format_int8(const Rows& rows, const Int8WeightsView& w, const float* bias, float* s, std::size_t ss) {
  for (std::size_t h = 0; h < w.nq;) {
    const std::size_t left = w.nq - h;
    if (left >= 8) {
      score_heads_int8<F, 8>(rows, w, h, bias, s, ss);
      h += 8;
    } else if (left >= 4) {
      score_heads_int8<F, 4>(rows, w, h, bias, s, ss);
      h += 4;
    } else if (left >= 2) {
      score_heads_int8<F, 2>(rows, w, h, bias, s, ss);
      h += 2;
    } else {
      score_heads_int8<F, 1>(rows, w, h, bias, s, ss);
      h += 1;
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// The rows the VNNI key loop takes (all but a tail), then the 256-bit loop for the rest.
template <RowFormat F>
inline void score_rows_vnni_then_rest(const Rows& rows, const Int8WeightsView& w, const float* bias, float* s,
                                      std::size_t ss) {
  const std::size_t bytes = rows.chunks * 8 * (F == RowFormat::code4 ? 4 : 2) / 8;
  std::size_t done = 0;
  if (bytes == 32) {
    done = score_rows_vnni<F, true>(rows, w, bias, s, ss);
  } else if (bytes % 64 == 0) {
    done = score_rows_vnni<F, false>(rows, w, bias, s, ss);
  }
  if (done == rows.n) return;
  const Rows rest{rows.format, rows.base + done * rows.stride, rows.stride, rows.n - done, rows.chunks};
  score_format_int8<F>(rest, w, bias, s + done, ss);
}
#endif

// Block j (32 codes) of rows a and b interleaved by byte, as two vectors of 16 code pairs
// (16-bit lanes: low byte row a, high byte row b). 4 bits: e lane i = channel 2i, o lane i =
// channel 2i + 1. 2 bits: e lanes i, 8 + i = channels 4i, 4i + 1; o: 4i + 2, 4i + 3.
template <RowFormat F>
[[gnu::always_inline]] inline void unpack_pair(const std::uint8_t* a, const std::uint8_t* b, __m256i& e, __m256i& o) {
  if constexpr (F == RowFormat::code4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(x, y)), _mm_unpackhi_epi8(x, y), 1);
    const __m256i m = _mm256_set1_epi8(0x0F);
    e = _mm256_and_si256(v, m);
    o = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
  } else {
    const __m128i u = _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(u), _mm_srli_epi16(u, 2), 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_srli_epi16(u, 4)), _mm_srli_epi16(u, 6), 1);
    const __m256i m = _mm256_set1_epi8(3);
    e = _mm256_and_si256(lo, m);
    o = _mm256_and_si256(hi, m);
  }
}

// The 32 sums of e and o (unpack_pair's lanes) in channel order, 8 per vector (16-bit).
template <RowFormat F>
[[gnu::always_inline]] inline void channel_order(__m256i e, __m256i o, __m128i (&x)[4]) {
  if constexpr (F == RowFormat::code4) {
    const __m256i lo = _mm256_unpacklo_epi16(e, o), hi = _mm256_unpackhi_epi16(e, o);
    x[0] = _mm256_castsi256_si128(lo);
    x[1] = _mm256_castsi256_si128(hi);
    x[2] = _mm256_extracti128_si256(lo, 1);
    x[3] = _mm256_extracti128_si256(hi, 1);
  } else {
    const __m128i e0 = _mm256_castsi256_si128(e), e1 = _mm256_extracti128_si256(e, 1);
    const __m128i o0 = _mm256_castsi256_si128(o), o1 = _mm256_extracti128_si256(o, 1);
    const __m128i a = _mm_unpacklo_epi16(e0, e1), b = _mm_unpacklo_epi16(o0, o1);
    const __m128i c = _mm_unpackhi_epi16(e0, e1), d = _mm_unpackhi_epi16(o0, o1);
    x[0] = _mm_unpacklo_epi32(a, b);
    x[1] = _mm_unpackhi_epi32(a, b);
    x[2] = _mm_unpacklo_epi32(c, d);
    x[3] = _mm_unpackhi_epi32(c, d);
  }
}

// Heads h0 .. h0+NQ, channel block j: 16-bit sums over the row pairs, then
// acc = fma(sigma, sum, acc) in channel order.
template <RowFormat F, int NQ>
[[gnu::always_inline]] inline void accumulate_block_int8(const Rows& rows, std::size_t j, std::size_t nq, std::size_t h0,
                                                         const std::uint32_t* quads, std::size_t ng, std::size_t g,
                                                         const float* sigma, float* acc, std::size_t as) {
  __m256i ae[NQ], ao[NQ];
  for (int h = 0; h < NQ; ++h) ae[h] = ao[h] = _mm256_setzero_si256();
  const std::size_t np = (rows.n + 1) / 2;
  for (std::size_t p = 0; p < np; ++p) {
    const std::uint8_t* a = rows.base + 2 * p * rows.stride + j * block_bytes<F>();
    const std::uint8_t* b = 2 * p + 1 < rows.n ? a + rows.stride : a;  // a missing row has coefficient 0
    __m256i e, o;
    unpack_pair<F>(a, b, e, o);
    const std::uint32_t* qw = quads + ((p / 2) * nq + h0) * ng + g;  // rows 2p, 2p + 1: one half of a quad
    const unsigned shift = 16 * (p % 2);
    for (int h = 0; h < NQ; ++h) {
      const __m256i c = _mm256_set1_epi16(static_cast<short>(qw[static_cast<std::size_t>(h) * ng] >> shift));
      ae[h] = _mm256_add_epi16(ae[h], _mm256_maddubs_epi16(e, c));
      ao[h] = _mm256_add_epi16(ao[h], _mm256_maddubs_epi16(o, c));
    }
  }
  for (int h = 0; h < NQ; ++h) {
    const std::size_t hh = h0 + static_cast<std::size_t>(h);
    __m128i x[4];
    channel_order<F>(ae[h], ao[h], x);
    const __m256 sg = _mm256_set1_ps(sigma[hh * ng + g]);
    float* out = acc + hh * as + j * kInt8Block;
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(x[k]));
      _mm256_storeu_ps(out + 8 * k, _mm256_fmadd_ps(sg, v, _mm256_loadu_ps(out + 8 * k)));
    }
  }
}

template <RowFormat F>
void accumulate_format_int8(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                            std::size_t group, const float* sigma, float* acc, std::size_t as) {
  // Two 16-bit accumulators per head: 4 heads fill AVX2's 16 registers, 8 AVX-512's 32.
  constexpr std::size_t kHeads = kIntAccs / 2;
  const std::size_t nb = rows.chunks * 8 / kInt8Block;
  for (std::size_t r = 0; r < rows.n; ++r) prefetch_row(rows.base + r * rows.stride, rows.stride);
  for (std::size_t j = 0; j < nb; ++j) {
    const std::size_t g = j * kInt8Block / group;
    for (std::size_t h = 0; h < nq;) {
      const std::size_t left = nq - h;
      if (kHeads >= 8 && left >= 8) {
        accumulate_block_int8<F, kHeads >= 8 ? 8 : 4>(rows, j, nq, h, quads, ng, g, sigma, acc, as);
        h += kHeads >= 8 ? 8 : 4;
      } else if (left >= 4) {
        accumulate_block_int8<F, 4>(rows, j, nq, h, quads, ng, g, sigma, acc, as);
        h += 4;
      } else if (left >= 2) {
        accumulate_block_int8<F, 2>(rows, j, nq, h, quads, ng, g, sigma, acc, as);
        h += 2;
      } else {
        accumulate_block_int8<F, 1>(rows, j, nq, h, quads, ng, g, sigma, acc, as);
        h += 1;
      }
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// 2- and 4-bit value rows with AVX-512 VNNI: each quad of rows (4k .. 4k+3) is transposed so
// that a 32-bit lane holds the 4 rows' codes of one channel, 16 consecutive channels per vector;
// then vpdpbusd against the quad's coefficients of a (head, group) broadcast does 64 products per
// instruction and leaves per-channel sums in channel order (one float multiply-add per 16
// channels and sub-tile). The transposed codes of a sub-tile (at most 16 rows x kVnniValueCols
// channels, 8 KB) stay in L1 for every head. Same integer sums as the plain loop, so same bits.
constexpr std::size_t kVnniValueCols = 512;

// The codes of a 128-channel slice as bytes, 4 channels (a channel quad q: channels 4q .. 4q+3
// of the slice) per 32-bit word, placed so that 128-bit lane L, word k of x holds quad 4k + L and
// of y quad 16 + 4k + L: interleave_quad then gathers word k of every lane into one vector.
// 4 bits (64 bytes): low and high nibbles interleaved, so lane L of e holds channels 32L ..
// 32L+15 and of f 32L+16 .. 32L+31; quad q sits in e at word 4 (q / 8) + q % 8 when q % 8 < 4,
// else in f (index 16 + ...), so x word 4L + k takes quad 4k + L from index px[4L + k], and y 8
// further.
[[gnu::always_inline]] inline void slice_quads4(__m512i v, __m512i& x, __m512i& y) {
  const __m512i px = _mm512_setr_epi32(0, 16, 4, 20, 1, 17, 5, 21, 2, 18, 6, 22, 3, 19, 7, 23);
  const __m512i py = _mm512_add_epi32(px, _mm512_set1_epi32(8)), low = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  const __m512i e = _mm512_unpacklo_epi8(lo, hi), f = _mm512_unpackhi_epi8(lo, hi);
  x = _mm512_permutex2var_epi32(e, px, f);
  y = _mm512_permutex2var_epi32(e, py, f);
}

// 2 bits (32 bytes at p): byte q holds quad q, so its bytes are put in x's order (byte 4L + k of
// each 16 = byte 4k + L), widened to a word each, and the word's 4 fields spread to its 4 bytes.
[[gnu::always_inline]] inline void slice_quads2(const std::uint8_t* p, __m512i& x, __m512i& y) {
  const __m256i b = group_bytes_by4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const auto spread = [](__m512i z) {  // field m (bits 2m, 2m+1) to bits 8m, 8m+1
    const __m512i u = _mm512_or_si512(_mm512_or_si512(z, _mm512_slli_epi32(z, 6)),
                                      _mm512_or_si512(_mm512_slli_epi32(z, 12), _mm512_slli_epi32(z, 18)));
    return _mm512_and_si512(u, _mm512_set1_epi32(0x03030303));
  };
  x = spread(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)));
  y = spread(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)));
}

// Rows' slice words x[0..3] (and y) -> out[k] lane i = the 4 rows' codes of channel 16k + i
// (out[4 + k]: channel 64 + 16k + i).
[[gnu::always_inline]] inline void interleave_quad(const __m512i (&x)[4], const __m512i (&y)[4], __m512i* out) {
  for (const __m512i* z : {x, y}) {
    const __m512i a = _mm512_unpacklo_epi8(z[0], z[1]), b = _mm512_unpackhi_epi8(z[0], z[1]);
    const __m512i c = _mm512_unpacklo_epi8(z[2], z[3]), d = _mm512_unpackhi_epi8(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi16(a, c);
    out[1] = _mm512_unpackhi_epi16(a, c);
    out[2] = _mm512_unpacklo_epi16(b, d);
    out[3] = _mm512_unpackhi_epi16(b, d);
    out += 4;
  }
}

// Channels 16v .. 16v+15 (v < 8) of the 4-bit 128-channel slices v4[0..3] (64 bytes each), as
// out[v]: lane i = the 4 slices' codes of channel 16v + i.
[[gnu::always_inline]] inline void transpose_quad(const __m512i (&v4)[4], __m512i* out) {
  __m512i x[4], y[4];
  for (int r = 0; r < 4; ++r) slice_quads4(v4[r], x[r], y[r]);
  interleave_quad(x, y, out);
}

// The sums of NK transposed row quads t[k * nv + v] for every head, four vectors (64 channels,
// at most two groups) at a time: independent vpdpbusd chains.
template <int NK>
[[gnu::always_inline]] inline void vnni_value_sums(const __m512i* t, std::size_t nv, std::size_t nq,
                                                   const std::uint32_t* quads, std::size_t ng, std::size_t group,
                                                   const float* sigma, float* acc, std::size_t as) {
  const std::size_t e = nq * ng;
  for (std::size_t h = 0; h < nq; ++h) {
    for (std::size_t v = 0; v < nv; v += 4) {
      const std::size_t j0 = h * ng + 16 * v / group, j1 = h * ng + 16 * (v + 2) / group;
      __m512i c0[NK], c1[NK], sum[4];
      for (int k = 0; k < NK; ++k) {
        c0[k] = _mm512_set1_epi32(static_cast<int>(quads[static_cast<std::size_t>(k) * e + j0]));
        c1[k] = _mm512_set1_epi32(static_cast<int>(quads[static_cast<std::size_t>(k) * e + j1]));
      }
      for (auto& x : sum) x = _mm512_setzero_si512();
      for (int k = 0; k < NK; ++k) {
        const __m512i* tk = t + static_cast<std::size_t>(k) * nv + v;
        sum[0] = _mm512_dpbusd_epi32(sum[0], tk[0], c0[k]);
        sum[1] = _mm512_dpbusd_epi32(sum[1], tk[1], c0[k]);
        sum[2] = _mm512_dpbusd_epi32(sum[2], tk[2], c1[k]);
        sum[3] = _mm512_dpbusd_epi32(sum[3], tk[3], c1[k]);
      }
      float* out = acc + h * as + 16 * v;
      for (int i = 0; i < 4; ++i) {
        const __m512 sg = _mm512_set1_ps(sigma[i < 2 ? j0 : j1]);
        _mm512_storeu_ps(out + 16 * i, _mm512_fmadd_ps(sg, _mm512_cvtepi32_ps(sum[i]), _mm512_loadu_ps(out + 16 * i)));
      }
    }
  }
}

// 2- or 4-bit rows, cols % 128 == 0, cols <= kVnniValueCols, group % 32 == 0 (a vector of 16
// channels lies in one group).
template <RowFormat F>
inline void accumulate_rows_vnni(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                                 std::size_t group, const float* sigma, float* acc, std::size_t as) {
  const std::size_t cols = rows.chunks * 8, nv = cols / 16, nk = (rows.n + 3) / 4;
  __m512i t[kInt8ValueRows / 4 * kVnniValueCols / 16];  // [nk][nv]
  for (std::size_t k = 0; k < nk; ++k) {
    const std::uint8_t* row[4];
    for (std::size_t i = 0; i < 4; ++i) {  // a missing row of the last quad: any row (its coefficient is 0)
      row[i] = rows.base + (4 * k + i < rows.n ? 4 * k + i : 4 * k) * rows.stride;
      prefetch_row(row[i], rows.stride);
    }
    for (std::size_t s = 0; s < cols / 128; ++s) {
      if constexpr (F == RowFormat::code4) {
        __m512i v4[4];
        for (int i = 0; i < 4; ++i) v4[i] = _mm512_loadu_si512(row[i] + 64 * s);
        transpose_quad(v4, t + k * nv + 8 * s);
      } else {
        __m512i x[4], y[4];
        for (int i = 0; i < 4; ++i) slice_quads2(row[i] + 32 * s, x[i], y[i]);
        interleave_quad(x, y, t + k * nv + 8 * s);
      }
    }
  }
  switch (nk) {
    case 1: return vnni_value_sums<1>(t, nv, nq, quads, ng, group, sigma, acc, as);
    case 2: return vnni_value_sums<2>(t, nv, nq, quads, ng, group, sigma, acc, as);
    case 3: return vnni_value_sums<3>(t, nv, nq, quads, ng, group, sigma, acc, as);
    default: return vnni_value_sums<4>(t, nv, nq, quads, ng, group, sigma, acc, as);
  }
}

// 64-channel rows (head_dim 64): rows 2j and 2j + 1 side by side as one 128-channel slice, so a
// quad of slices holds 8 rows (an octet); transposed vector v < 4 then holds channels 16v of the
// even rows 8o, 8o + 2, 8o + 4, 8o + 6 (one byte each), v >= 4 the same channels of the odd rows,
// each against its own coefficient word (the bytes of the two rows' quads picked with pext).
inline void accumulate_rows_vnni64(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                                   std::size_t group, const float* sigma, float* acc, std::size_t as) {
  const std::size_t no = (rows.n + 7) / 8, nk = (rows.n + 3) / 4, e = nq * ng;
  __m512i t[kInt8ValueRows / 8][8];
  for (std::size_t o = 0; o < no; ++o) {
    __m512i v4[4];
    for (std::size_t j = 0; j < 4; ++j) {  // a missing row: zero codes (its coefficient is 0 too)
      const std::size_t r = 8 * o + 2 * j;
      const auto half = [&](std::size_t i) {
        if (i >= rows.n) return _mm256_setzero_si256();
        prefetch_row(rows.base + i * rows.stride, rows.stride);
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.base + i * rows.stride));
      };
      v4[j] = _mm512_inserti64x4(_mm512_castsi256_si512(half(r)), half(r + 1), 1);
    }
    transpose_quad(v4, t[o]);
  }
  for (std::size_t h = 0; h < nq; ++h) {
    for (std::size_t v = 0; v < 4; ++v) {
      const std::size_t j = h * ng + 16 * v / group;
      __m512i sum = _mm512_setzero_si512();
      for (std::size_t o = 0; o < no; ++o) {
        const std::uint64_t next = 2 * o + 1 < nk ? quads[(2 * o + 1) * e + j] : 0;  // rows 8o+4 .. 8o+7
        const std::uint64_t c8 = quads[2 * o * e + j] | next << 32;
        const auto even = static_cast<int>(_pext_u64(c8, 0x00FF00FF00FF00FFull));
        const auto odd = static_cast<int>(_pext_u64(c8, 0xFF00FF00FF00FF00ull));
        sum = _mm512_dpbusd_epi32(sum, t[o][v], _mm512_set1_epi32(even));
        sum = _mm512_dpbusd_epi32(sum, t[o][v + 4], _mm512_set1_epi32(odd));
      }
      float* out = acc + h * as + 16 * v;
      _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_set1_ps(sigma[j]), _mm512_cvtepi32_ps(sum), _mm512_loadu_ps(out)));
    }
  }
}
#endif

}  // namespace

void score_rows_int8_simd(const Rows& rows, const Int8WeightsView& w, const float* bias, float* s, std::size_t ss) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (rows.format == RowFormat::code4) return score_rows_vnni_then_rest<RowFormat::code4>(rows, w, bias, s, ss);
  score_rows_vnni_then_rest<RowFormat::code2>(rows, w, bias, s, ss);
#else
  if (rows.format == RowFormat::code4) {
    score_format_int8<RowFormat::code4>(rows, w, bias, s, ss);
  } else {
    score_format_int8<RowFormat::code2>(rows, w, bias, s, ss);
  }
#endif
}

#ifdef __AVX512BW__
void quantize_weights_int8_simd(const float* w, RowFormat f, const Int8WeightsOut& out) {
  quantize_weights_avx512(w, f, out);
}

bool quantize_coefficients_int8_simd(const float* coef, std::size_t n, std::size_t e, std::uint32_t* quads,
                                     float* sigma) {
  return quantize_coefficients_avx512(coef, n, e, quads, sigma);
}
#endif

void accumulate_rows_int8_simd(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                               std::size_t group, const float* sigma, float* acc, std::size_t as) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const std::size_t cols = rows.chunks * 8;
  if (cols % 128 == 0 && cols <= kVnniValueCols) {
    if (rows.format == RowFormat::code4) {
      return accumulate_rows_vnni<RowFormat::code4>(rows, nq, quads, ng, group, sigma, acc, as);
    }
    return accumulate_rows_vnni<RowFormat::code2>(rows, nq, quads, ng, group, sigma, acc, as);
  }
  if (rows.format == RowFormat::code4 && cols == 64) return accumulate_rows_vnni64(rows, nq, quads, ng, group, sigma, acc, as);
#endif
  if (rows.format == RowFormat::code4) {
    accumulate_format_int8<RowFormat::code4>(rows, nq, quads, ng, group, sigma, acc, as);
  } else {
    accumulate_format_int8<RowFormat::code2>(rows, nq, quads, ng, group, sigma, acc, as);
  }
}

}  // namespace akv::attn::AKV_SIMD_NS
