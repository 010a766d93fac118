#pragma once
// q8_rows' vector kernel (internal): included by q8_dot.cpp (x86-64-v3: AVX2) inside namespace
// akv::AKV_Q8_NS. Per block of 32, the integer products of int8 codes (|w| <= 128, |x| <= 127:
// maddubs' 16-bit pair sums cannot saturate) summed exactly into eight 32-bit lanes, lanes 0-3
// holding codes 0-15 and lanes 4-7 codes 16-31; eight blocks' lanes reduced by horizontal adds
// into one register of the eight blocks' lo sums and one of their hi sums, so that lane l
// carries block k + l through q8_dot.h's f32 formula, the same operations in the same order as
// q8_rows_ref (this file builds without fused multiply-adds).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "akv/tensor/ggml_fields.h"

namespace akv::AKV_Q8_NS {
namespace {

inline __m256i q8_load32(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void q8_store32(std::int8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

inline float q8_hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s_l + s_{l+4}
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}


// The codes (q - 32) of blocks 4 half .. 4 half + 3 of a Q6_K super-block b (q6_k_block's
// layout): block k from the low (k < 2) or high nibbles of ql[l + 32 (k % 2)] and bits 2k, 2k + 1
// of qh[l].
inline void q6_k_half_codes(const std::uint8_t* b, int half, __m256i* q) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), off = _mm256_set1_epi8(32);
  const __m256i a = q8_load32(b + 64 * half), c = q8_load32(b + 64 * half + 32);
  const __m256i h = q8_load32(b + 128 + 32 * half);
  const __m256i lows[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(c, m4),
                           _mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(_mm256_srli_epi16(c, 4), m4)};
  const __m256i highs[4] = {_mm256_and_si256(h, m2), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2),
                            _mm256_and_si256(_mm256_srli_epi16(h, 4), m2), _mm256_and_si256(_mm256_srli_epi16(h, 6), m2)};
  for (int k = 0; k < 4; ++k) q[k] = _mm256_sub_epi8(_mm256_or_si256(lows[k], _mm256_slli_epi16(highs[k], 4)), off);
}

// Eight blocks' lane sums (q8_block_lanes of blocks k .. k + 7) through q8_dot.h's formula:
// lane l is t_{k + l}.
inline __m256 q8_group_terms(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4, __m256i v5, __m256i v6,
                             __m256i v7, __m256 a_lo, __m256 a_hi, __m256 c, __m256 dx, __m256 xs) {
  const __m256i t0 = _mm256_hadd_epi32(v0, v1), t1 = _mm256_hadd_epi32(v2, v3);
  const __m256i t2 = _mm256_hadd_epi32(v4, v5), t3 = _mm256_hadd_epi32(v6, v7);
  // u0 = [lo of blocks 0-3 | hi of blocks 0-3], u1 the same for blocks 4-7.
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(u0, u1, 0x20));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(u0, u1, 0x31));
  const __m256 s = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(a_lo, lo), _mm256_mul_ps(a_hi, hi)), _mm256_mul_ps(c, xs));
  return _mm256_mul_ps(dx, s);
}

// t_b of one block from its lane sums, in scalar code (the blocks after the last group of 8).
inline float q8_tail_term(__m256i lanes_v, float a_lo, float a_hi, float c, float dx, float xs) {
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), lanes_v);
  const auto lo = static_cast<float>((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
  const auto hi = static_cast<float>((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  return dx * ((a_lo * lo + a_hi * hi) - c * xs);
}

// Lane sums of signed codes w (-128..127) times x.
inline __m256i q8_block_lanes_s(__m256i w, const std::int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), _mm256_set1_epi16(1));
}

// Eight 32-bit sums of one block's products: lane l = codes 4l .. 4l + 3.
inline __m256i q8_block_lanes(const std::int8_t* w, const std::int8_t* x) {
  return q8_block_lanes_s(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), x);
}

// Lane sums of unsigned codes w (0..127) times x.
inline __m256i q8_block_lanes_u(__m256i w, const std::int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), _mm256_set1_epi16(1));
}


// One row (codes wq, per-block a_lo, a_hi, c) times one vector (codes xq, steps dx, sums xs).
float q8_dot(const std::int8_t* wq, const float* a_lo, const float* a_hi, const float* c, const std::int8_t* xq,
             const float* dx, const float* xs, std::size_t nb) {
  const std::size_t nb8 = nb - nb % 8;
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t k = 0; k < nb8; k += 8) {
    const std::int8_t* w = wq + k * 32;
    const std::int8_t* x = xq + k * 32;
    acc = _mm256_add_ps(acc, q8_group_terms(q8_block_lanes(w, x), q8_block_lanes(w + 32, x + 32), q8_block_lanes(w + 64, x + 64),
                                            q8_block_lanes(w + 96, x + 96), q8_block_lanes(w + 128, x + 128),
                                            q8_block_lanes(w + 160, x + 160), q8_block_lanes(w + 192, x + 192),
                                            q8_block_lanes(w + 224, x + 224), _mm256_loadu_ps(a_lo + k),
                                            _mm256_loadu_ps(a_hi + k), _mm256_loadu_ps(c + k), _mm256_loadu_ps(dx + k),
                                            _mm256_loadu_ps(xs + k)));
  }
  float r = q8_hsum8(acc);
  for (std::size_t k = nb8; k < nb; ++k) {
    r += q8_tail_term(q8_block_lanes(wq + k * 32, xq + k * 32), a_lo[k], a_hi[k], c[k], dx[k], xs[k]);
  }
  return r;
}

// Asks for the cache lines `bytes` of a super-block span, kQ8PrefetchBytes ahead: a decode
// step reads every weight once, from memory, rows after rows (past the end of the weight the
// prefetches are harmless: they do not fault).
constexpr std::size_t kQ8PrefetchBytes = 1024;
inline void q8_prefetch_ahead(const std::uint8_t* b, std::size_t bytes) {
  for (std::size_t off = 0; off < bytes; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(b + kQ8PrefetchBytes + off), _MM_HINT_T0);
  }
}


// One Q4_K row of nsb super-blocks times one vector, straight from the blocks: the codes unpacked
// in registers, the 8 scales and mins as q8_decode computes them (d sc, dmin m), eight per
// register: q8_dot's lanes and formula, so the same bits as decoding a tile first.
float q4_k_dot(const std::uint8_t* row, const std::int8_t* xq, const float* dx, const float* xs, std::size_t nsb) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t s = 0; s < nsb; ++s) {
    const std::uint8_t* b = row + s * 144;
    q8_prefetch_ahead(b, 144);
    std::uint32_t u[3];
    std::memcpy(u, b + 4, 12);
    const std::uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
    const std::uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const std::uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo))));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo))));
    const __m256 a = _mm256_mul_ps(_mm256_set1_ps(ggml::f16_at(b)), sc);
    const __m256 c = _mm256_mul_ps(_mm256_set1_ps(ggml::f16_at(b + 2)), mn);
    const std::int8_t* x = xq + s * 256;
    __m256i v[8];
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * k));
      v[2 * k] = q8_block_lanes_u(_mm256_and_si256(q, mask), x + 64 * k);
      v[2 * k + 1] = q8_block_lanes_u(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), x + 64 * k + 32);
    }
    acc = _mm256_add_ps(acc, q8_group_terms(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], a, a, c,
                                            _mm256_loadu_ps(dx + 8 * s), _mm256_loadu_ps(xs + 8 * s)));
  }
  return q8_hsum8(acc);
}

// One Q6_K row of nsb super-blocks times one vector, as q4_k_dot (codes q - 32, two scales per
// block: the even and odd int8 scales times d).
float q6_k_dot(const std::uint8_t* row, const std::int8_t* xq, const float* dx, const float* xs, std::size_t nsb) {
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t s = 0; s < nsb; ++s) {
    const std::uint8_t* b = row + s * 210;
    q8_prefetch_ahead(b, 210);
    const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)), split);
    const __m256 d = _mm256_set1_ps(ggml::f16_at(b + 208));
    const __m256 a_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    const __m256 a_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    const std::int8_t* x = xq + s * 256;
    __m256i v[8];
    for (int half = 0; half < 2; ++half) {
      __m256i q[4];
      q6_k_half_codes(b, half, q);
      for (int k = 0; k < 4; ++k) v[4 * half + k] = q8_block_lanes_s(q[k], x + 128 * half + 32 * k);
    }
    acc = _mm256_add_ps(acc, q8_group_terms(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], a_lo, a_hi,
                                            _mm256_setzero_ps(), _mm256_loadu_ps(dx + 8 * s), _mm256_loadu_ps(xs + 8 * s)));
  }
  return q8_hsum8(acc);
}

}  // namespace

// Codes of one 32-value block of Q4_0 (qs: its 16 bytes of nibbles; element j low nibble of
// byte j, j + 16 high nibble): q - 8.
inline void q4_0_codes_simd(const std::uint8_t* qs, std::int8_t* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  q8_store32(out, _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8)));
}

// Codes of the 8 blocks of a Q4_K super-block (qs: its 128 bytes; block 2c from the low nibbles
// of bytes 32c .. 32c + 31, block 2c + 1 from their high nibbles).
inline void q4_k_codes_simd(const std::uint8_t* qs, std::int8_t* out) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = q8_load32(qs + 32 * c);
    q8_store32(out + 64 * c, _mm256_and_si256(v, mask));
    q8_store32(out + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
  }
}

// Codes of the 8 blocks of a Q6_K super-block (q6_k_half_codes of each half of 128 values).
inline void q6_k_codes_simd(const std::uint8_t* b, std::int8_t* out) {
  for (int half = 0; half < 2; ++half) {
    __m256i q[4];
    q6_k_half_codes(b, half, q);
    for (int k = 0; k < 4; ++k) q8_store32(out + 128 * half + 32 * k, q[k]);
  }
}

// q8_quantize of one block of 32 (q8_dot.h): the same maximum, step, reciprocal, products and
// ties-to-even rounding as the plain loop, eight values per register.
inline void q8_quantize_block_simd(const float* v, std::int8_t* q, float* d_out, float* sum_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 idv = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(x[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  // packs work within 128-bit halves: [c0 lo, c1 lo, c0 hi, c1 hi] -> put back in order.
  const __m256i p01 = _mm256_packs_epi32(c[0], c[1]), p23 = _mm256_packs_epi32(c[2], c[3]);
  const __m256i p = _mm256_packs_epi16(p01, p23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  *d_out = d;
  *sum_out = static_cast<float>(_mm_cvtsi128_si32(t));
}

// One Q8_0 (kQ4 false) or Q4_0 row of nb blocks of 32 times one vector, straight from the
// blocks: codes loaded (Q8_0) or unpacked (Q4_0: q - 8) in registers, the eight blocks' f16
// scales converted together; q8_dot's lanes and formula (a_lo = a_hi = d, c = 0).
template <bool kQ4>
float small_dot(const std::uint8_t* row, const std::int8_t* xq, const float* dx, const float* xs, std::size_t nb) {
  constexpr std::size_t kBytes = kQ4 ? 18 : 34;
  const auto codes = [](const std::uint8_t* b) {
    if constexpr (kQ4) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
      const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
      return _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
    } else {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    }
  };
  const auto f16_bits = [](const std::uint8_t* b) {
    std::uint16_t h;
    std::memcpy(&h, b, 2);
    return static_cast<short>(h);
  };
  const std::size_t nb8 = nb - nb % 8;
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t k = 0; k < nb8; k += 8) {
    const std::uint8_t* b = row + k * kBytes;
    q8_prefetch_ahead(b, 8 * kBytes);
    const std::int8_t* x = xq + k * 32;
    const __m256 d = _mm256_cvtph_ps(_mm_setr_epi16(f16_bits(b), f16_bits(b + kBytes), f16_bits(b + 2 * kBytes),
                                                    f16_bits(b + 3 * kBytes), f16_bits(b + 4 * kBytes), f16_bits(b + 5 * kBytes),
                                                    f16_bits(b + 6 * kBytes), f16_bits(b + 7 * kBytes)));
    acc = _mm256_add_ps(acc, q8_group_terms(q8_block_lanes_s(codes(b), x), q8_block_lanes_s(codes(b + kBytes), x + 32),
                                            q8_block_lanes_s(codes(b + 2 * kBytes), x + 64),
                                            q8_block_lanes_s(codes(b + 3 * kBytes), x + 96),
                                            q8_block_lanes_s(codes(b + 4 * kBytes), x + 128),
                                            q8_block_lanes_s(codes(b + 5 * kBytes), x + 160),
                                            q8_block_lanes_s(codes(b + 6 * kBytes), x + 192),
                                            q8_block_lanes_s(codes(b + 7 * kBytes), x + 224), d, d, _mm256_setzero_ps(),
                                            _mm256_loadu_ps(dx + k), _mm256_loadu_ps(xs + k)));
  }
  float r = q8_hsum8(acc);
  for (std::size_t k = nb8; k < nb; ++k) {
    const std::uint8_t* b = row + k * kBytes;
    const float d = ggml::f16_at(b);
    r += q8_tail_term(q8_block_lanes_s(codes(b), xq + k * 32), d, d, 0.0f, dx[k], xs[k]);
  }
  return r;
}

// Rows of a Q4_0, Q8_0, Q4_K or Q6_K weight straight from their blocks (row stride row_bytes), times every
// vector of x; false for other types.
inline bool q8_rows_fused_simd(std::uint32_t type, const std::uint8_t* src, std::size_t rows, std::size_t row_bytes,
                               const Q8Vectors& x, float* y, std::size_t ldy) {
  if (type != 2 && type != 8 && type != 12 && type != 14) return false;
  const std::size_t nb = x.cols / 32, nsb = x.cols / 256;
  for (std::size_t b = 0; b < x.batch; ++b) {
    const std::int8_t* xq = x.q.data() + b * x.cols;
    const float* dx = x.d.data() + b * nb;
    const float* xs = x.sum.data() + b * nb;
    for (std::size_t o = 0; o < rows; ++o) {
      const std::uint8_t* row = src + o * row_bytes;
      switch (type) {
        case 2: y[b * ldy + o] = small_dot<true>(row, xq, dx, xs, nb); break;
        case 8: y[b * ldy + o] = small_dot<false>(row, xq, dx, xs, nb); break;
        case 12: y[b * ldy + o] = q4_k_dot(row, xq, dx, xs, nsb); break;
        default: y[b * ldy + o] = q6_k_dot(row, xq, dx, xs, nsb); break;
      }
    }
  }
  return true;
}

inline void q8_rows_simd(const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy) {
  const std::size_t nb = w.cols / 32;
  for (std::size_t b = 0; b < x.batch; ++b) {
    const std::int8_t* xq = x.q.data() + b * x.cols;
    const float* dx = x.d.data() + b * nb;
    const float* xs = x.sum.data() + b * nb;
    for (std::size_t o = 0; o < w.rows; ++o) {
      y[b * ldy + o] = q8_dot(w.q.data() + o * w.cols, w.a_lo.data() + o * nb, w.a_hi.data() + o * nb,
                              w.c.data() + o * nb, xq, dx, xs, nb);
    }
  }
}

}  // namespace akv::AKV_Q8_NS
