#include "akv/attention/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "akv/core/errors.h"
#include "akv/tensor/fp8.h"
#include "akv/tensor/ggml_blocks.h"
#include "akv/tensor/half.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define AKV_ATTN_AVX2 1
#include <immintrin.h>
#define AKV_SIMD_NS avx2
#include "akv/attention/kernels_simd.h"
#undef AKV_SIMD_NS
#endif

namespace akv::attn {

#ifdef AKV_ATTN_AVX512_TU
namespace avx512 {  // kernels_avx512.cpp
void score_rows_simd(const Rows& rows, std::size_t nq, const float* w, std::size_t ws, const float* bias,
                     float* s, std::size_t ss, float* sq);
void accumulate_rows_simd(const Rows& rows, std::size_t nq, const float* coef, std::size_t ng,
                          std::size_t cpg, float* acc, std::size_t as);
void nibble_sums_simd(const float* table, std::size_t nq, std::size_t nibbles, const std::uint8_t* bits,
                      std::size_t stride, std::size_t n, float* out, std::size_t os);
}  // namespace avx512
#endif

RowFormat code_format(int bits) {
  switch (bits) {
    case 2: return RowFormat::code2;
    case 3: return RowFormat::code3;
    case 4: return RowFormat::code4;
    case 8: return RowFormat::code8;
    default: throw InvalidInput("unsupported bit width", {"", "bits", std::to_string(bits)});
  }
}

RowFormat level_format(int bits) {
  switch (bits) {
    case 2: return RowFormat::level2;
    case 3: return RowFormat::level3;
    case 4: return RowFormat::level4;
    default: throw InvalidInput("unsupported bit width for levels", {"", "bits", std::to_string(bits)});
  }
}

void level_table(const float* values, int bits, float* table) {
  const std::size_t n = std::size_t{1} << bits;
  for (std::size_t i = 0; i < 16; ++i) table[i] = values[i % n];
}

int format_bits(RowFormat f) {
  switch (f) {
    case RowFormat::code2: case RowFormat::level2: return 2;
    case RowFormat::code3: case RowFormat::level3: return 3;
    case RowFormat::code4: case RowFormat::level4: return 4;
    default: return 8;
  }
}

// The ggml types the loops read, with their row formats.
constexpr std::pair<std::uint32_t, RowFormat> kGgmlFormats[] = {
    {8, RowFormat::q8_0}, {2, RowFormat::q4_0}, {3, RowFormat::q4_1},
    {6, RowFormat::q5_0}, {7, RowFormat::q5_1}, {20, RowFormat::iq4_nl}};

std::optional<RowFormat> ggml_row_format(std::uint32_t id) {
  for (const auto& [type, f] : kGgmlFormats) {
    if (type == id) return f;
  }
  return std::nullopt;
}

namespace {

// ggml_row_format's inverse.
std::uint32_t ggml_row_type(RowFormat f) {
  for (const auto& [type, g] : kGgmlFormats) {
    if (g == f) return type;
  }
  throw std::logic_error("ggml_row_type: not a ggml row format");
}

bool is_level_format(RowFormat f) {
  return f == RowFormat::level2 || f == RowFormat::level3 || f == RowFormat::level4;
}

// Value c (< 8 * chunks) of a row, scalar (fallback loops and tails); levels: the level formats'
// table.
float value_at(RowFormat f, const std::uint8_t* row, std::size_t c, const float* levels) {
  switch (f) {
    case RowFormat::f32: {
      float v;
      std::memcpy(&v, row + 4 * c, 4);
      return v;
    }
    case RowFormat::f16: {
      std::uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return f16_to_f32_ref(h);
    }
    case RowFormat::e4m3: return fp8_decode(row[c], Fp8Format::e4m3);
    case RowFormat::e5m2: return fp8_decode(row[c], Fp8Format::e5m2);
    case RowFormat::q8_0:
    case RowFormat::q4_0:
    case RowFormat::q4_1:
    case RowFormat::q5_0:
    case RowFormat::q5_1:
    case RowFormat::iq4_nl: {  // the block's values as the tensor module decodes them
      const GgmlTypeInfo& t = *ggml_type_info(ggml_row_type(f));
      float block[32];
      ggml_dequantize(t, row + c / 32 * t.bytes, 32, block);
      return block[c % 32];
    }
    default: {
      const int b = format_bits(f);
      const std::size_t bit = c * static_cast<std::size_t>(b);
      const unsigned w = row[bit / 8] | (static_cast<unsigned>(row[bit / 8 + 1]) << 8);
      const unsigned code = (w >> (bit % 8)) & ((1u << b) - 1u);
      return is_level_format(f) ? levels[code] : static_cast<float>(code);
    }
  }
}

void score_rows_scalar(const Rows& rows, std::size_t nq, const float* w, std::size_t ws, const float* bias, float* s,
                       std::size_t ss, float* sq) {
  const std::size_t d = rows.chunks * 8;
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    for (std::size_t h = 0; h < nq; ++h) {
      float acc = 0.0f;
      for (std::size_t c = 0; c < d; ++c) acc += w[h * ws + c] * value_at(rows.format, row, c, rows.levels);
      s[h * ss + r] = acc + (bias ? bias[h] : 0.0f);
    }
    if (sq) {
      float acc = 0.0f;
      for (std::size_t c = 0; c < d; ++c) {
        const float x = value_at(rows.format, row, c, rows.levels);
        acc += x * x;
      }
      sq[r] = acc;
    }
  }
}

void accumulate_rows_scalar(const Rows& rows, std::size_t nq, const float* coef,
                                             std::size_t ng, std::size_t cpg, float* acc,
                                             std::size_t as) {
  const std::size_t d = rows.chunks * 8;
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    for (std::size_t h = 0; h < nq; ++h) {
      for (std::size_t c = 0; c < d; ++c) {
        acc[h * as + c] += coef[(r * nq + h) * ng + c / (8 * cpg)] * value_at(rows.format, row, c, rows.levels);
      }
    }
  }
}

#ifdef AKV_ATTN_AVX2

// exp(x) for x in [-87, 0]: Cephes expf (range reduction by ln 2 in two parts, degree-5
// polynomial), 2^n by exponent arithmetic.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// value_coefficients for groups g0..g0+3 (the lanes of a 128-bit vector) and heads h0..h0+HN:
// the f16 scales and zeros convert once per row for HN heads; the zero sums run as four partial
// sums over i % 4 in registers, added as (s0 + s1) + (s2 + s3).
template <int HN>
void value_coefficients4(const float* p, std::size_t ps, const std::uint16_t* scale, const std::uint16_t* zero,
                         std::size_t n, std::size_t nq, std::size_t ng, std::size_t g0, std::size_t h0, float* coef,
                         float* zsum) {
  __m128 z[HN][4];
  for (auto& zh : z) zh[0] = zh[1] = zh[2] = zh[3] = _mm_setzero_ps();
  const auto row = [&](std::size_t i, int part) {
    const std::size_t at = i * ng + g0;
    const __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scale + at)));
    const __m128 ze = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zero + at)));
    for (int h = 0; h < HN; ++h) {
      const std::size_t hh = h0 + static_cast<std::size_t>(h);
      const __m128 pi = _mm_set1_ps(p[hh * ps + i]);
      _mm_storeu_ps(coef + (i * nq + hh) * ng + g0, _mm_mul_ps(pi, sc));
      z[h][part] = _mm_fmadd_ps(pi, ze, z[h][part]);
    }
  };
  std::size_t i = 0;
  if (ng == 4) {
    // Four groups per row: two rows per 256-bit vector (their scales and zeros are adjacent),
    // lanes 0-3 row i, 4-7 row i + 1, so y[h][0] holds the partial sums of rows i % 4 == 0 and
    // 1, y[h][1] those of 2 and 3 (2026-12-01, commit e7585cf, AMD EPYC Zen 5, AVX2, 64 rows, one core: 0.74 -> 0.45 ns
    // per row for one head, 2.15 -> 1.2 for four).
    __m256 y[HN][2];
    for (auto& yh : y) yh[0] = yh[1] = _mm256_setzero_ps();
    const __m256i pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (; i + 4 <= n; i += 4) {
      for (int half = 0; half < 2; ++half) {
        const std::size_t r = i + 2 * static_cast<std::size_t>(half);
        const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + r * 4)));
        const __m256 ze = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zero + r * 4)));
        for (int h = 0; h < HN; ++h) {
          const std::size_t hh = h0 + static_cast<std::size_t>(h);
          const __m256 pr = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + hh * ps + r)))), pair);
          const __m256 c = _mm256_mul_ps(pr, sc);
          _mm_storeu_ps(coef + (r * nq + hh) * 4, _mm256_castps256_ps128(c));
          _mm_storeu_ps(coef + ((r + 1) * nq + hh) * 4, _mm256_extractf128_ps(c, 1));
          y[h][half] = _mm256_fmadd_ps(pr, ze, y[h][half]);
        }
      }
    }
    for (int h = 0; h < HN; ++h) {
      z[h][0] = _mm256_castps256_ps128(y[h][0]);
      z[h][1] = _mm256_extractf128_ps(y[h][0], 1);
      z[h][2] = _mm256_castps256_ps128(y[h][1]);
      z[h][3] = _mm256_extractf128_ps(y[h][1], 1);
    }
  }
  for (; i + 4 <= n; i += 4) {
    row(i, 0);
    row(i + 1, 1);
    row(i + 2, 2);
    row(i + 3, 3);
  }
  for (int part = 0; i < n; ++i, ++part) row(i, part);
  for (int h = 0; h < HN; ++h) {
    _mm_storeu_ps(zsum + (h0 + static_cast<std::size_t>(h)) * ng + g0,
                  _mm_add_ps(_mm_add_ps(z[h][0], z[h][1]), _mm_add_ps(z[h][2], z[h][3])));
  }
}

// The rows from i on of value_coefficients_row, row2 and row4 (H heads) by the plain loop's
// operations on the lanes zl[H (i % 4) + h], then each head's zero sum.
template <std::size_t H>
void finish_heads(const float* p, std::size_t ps, const std::uint16_t* scale, const std::uint16_t* zero,
                  std::size_t i, std::size_t n, float* coef, float* zl, float* zsum) {
  for (; i < n; ++i) {
    for (std::size_t h = 0; h < H; ++h) {
      const float pi = p[h * ps + i];
      coef[H * i + h] = pi * f16_value(scale[i]);
      zl[H * (i % 4) + h] = std::fma(pi, f16_value(zero[i]), zl[H * (i % 4) + h]);
    }
  }
  for (std::size_t h = 0; h < H; ++h) zsum[h] = (zl[h] + zl[H + h]) + (zl[2 * H + h] + zl[3 * H + h]);
}

// value_coefficients for one query head and one group per row (TurboQuant's value rows, KIVI
// with G = head_dim): the coefficients are then consecutive, four rows a vector and one store,
// where the heads' layout took a store per row (7% of a QJL 4-bit step at GQA 1, head_dim 128;
// turboquant_4bit_nc 0.589 -> 0.564 ms; AMD EPYC Zen 4, AVX-512, one core, 2026-12-06, b285b89).
// Lane i % 4 carries rows i % 4's zero sum: the plain loop's bits.
inline void value_coefficients_row(const float* p, const std::uint16_t* scale, const std::uint16_t* zero,
                                   std::size_t n, float* coef, float* zsum) {
  __m128 z = _mm_setzero_ps();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    long long s4, z4;  // 4 halves each
    std::memcpy(&s4, scale + i, 8);
    std::memcpy(&z4, zero + i, 8);
    const __m128 pr = _mm_loadu_ps(p + i);
    _mm_storeu_ps(coef + i, _mm_mul_ps(pr, _mm_cvtph_ps(_mm_set1_epi64x(s4))));
    z = _mm_fmadd_ps(pr, _mm_cvtph_ps(_mm_set1_epi64x(z4)), z);
  }
  alignas(16) float zl[4];
  _mm_store_ps(zl, z);
  finish_heads<1>(p, 0, scale, zero, i, n, coef, zl, zsum);
}

// value_coefficients_row for two query heads (GQA 2): the coefficients of 4 rows x 2 heads are 8
// consecutive floats, one vector and one store (value_coefficients_narrow stored each alone); lane
// 2r + h carries head h's zero sum of rows i % 4 == r, the plain loop's bits.
inline void value_coefficients_row2(const float* p, std::size_t ps, const std::uint16_t* scale,
                                    const std::uint16_t* zero, std::size_t n, float* coef, float* zsum) {
  __m256 z = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    long long s4, z4;  // 4 halves each, then each twice (one per head)
    std::memcpy(&s4, scale + i, 8);
    std::memcpy(&z4, zero + i, 8);
    const __m128i s2 = _mm_cvtsi64_si128(s4), z2 = _mm_cvtsi64_si128(z4);
    const __m256 sc = _mm256_cvtph_ps(_mm_unpacklo_epi16(s2, s2)), ze = _mm256_cvtph_ps(_mm_unpacklo_epi16(z2, z2));
    const __m128 a = _mm_loadu_ps(p + i), b = _mm_loadu_ps(p + ps + i);
    const __m256 pr = _mm256_set_m128(_mm_unpackhi_ps(a, b), _mm_unpacklo_ps(a, b));  // p0[i] p1[i] p0[i+1] ...
    _mm256_storeu_ps(coef + 2 * i, _mm256_mul_ps(pr, sc));
    z = _mm256_fmadd_ps(pr, ze, z);
  }
  alignas(32) float zl[8];
  _mm256_store_ps(zl, z);
  finish_heads<2>(p, ps, scale, zero, i, n, coef, zl, zsum);
}

// value_coefficients_row for four query heads (GQA 4): 2 rows x 4 heads of coefficients are 8
// consecutive floats (the heads' probabilities of 4 rows transposed, then two vectors and two
// stores); lane 4 (r % 2) + h of z[r / 2] carries head h's zero sum of rows i % 4 == r, the plain
// loop's bits.
inline void value_coefficients_row4(const float* p, std::size_t ps, const std::uint16_t* scale,
                                    const std::uint16_t* zero, std::size_t n, float* coef, float* zsum) {
  __m256 z[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256i first = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), second = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    long long s4, z4;  // 4 halves each
    std::memcpy(&s4, scale + i, 8);
    std::memcpy(&z4, zero + i, 8);
    const __m256 sc = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(s4)));
    const __m256 ze = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(z4)));
    __m128 r0 = _mm_loadu_ps(p + i), r1 = _mm_loadu_ps(p + ps + i);
    __m128 r2 = _mm_loadu_ps(p + 2 * ps + i), r3 = _mm_loadu_ps(p + 3 * ps + i);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // r_k: row i + k's four heads
    const __m256 p01 = _mm256_set_m128(r1, r0), p23 = _mm256_set_m128(r3, r2);
    _mm256_storeu_ps(coef + 4 * i, _mm256_mul_ps(p01, _mm256_permutevar8x32_ps(sc, first)));
    _mm256_storeu_ps(coef + 4 * i + 8, _mm256_mul_ps(p23, _mm256_permutevar8x32_ps(sc, second)));
    z[0] = _mm256_fmadd_ps(p01, _mm256_permutevar8x32_ps(ze, first), z[0]);
    z[1] = _mm256_fmadd_ps(p23, _mm256_permutevar8x32_ps(ze, second), z[1]);
  }
  alignas(32) float zl[16];
  _mm256_store_ps(zl, z[0]);
  _mm256_store_ps(zl + 8, z[1]);
  finish_heads<4>(p, ps, scale, zero, i, n, coef, zl, zsum);
}

// value_coefficients for one or two groups per row (head_dim 64 with G = 32 or 64, head_dim 128
// with G = 128): the f16 scales and zeros of 4 rows convert once for every head; lane i % 4 (of
// each group) carries the zero sum of rows i % 4 as the plain loop does, so the bits are the
// plain loop's (2026-12-01, AMD EPYC Zen 5, head_dim 64 with 4 query heads per KV head: the
// plain loop took 23% of a q4 decode step).
template <int NG>
void value_coefficients_narrow(const float* p, std::size_t ps, const std::uint16_t* scale, const std::uint16_t* zero,
                               std::size_t n, std::size_t nq, float* coef, float* zsum) {
  if (NG == 1 && nq == 1) return value_coefficients_row(p, scale, zero, n, coef, zsum);
  if (NG == 1 && nq == 2) return value_coefficients_row2(p, ps, scale, zero, n, coef, zsum);
  if (NG == 1 && nq == 4) return value_coefficients_row4(p, ps, scale, zero, n, coef, zsum);
  constexpr std::size_t kHeads = 16;
  float zl[kHeads][4 * NG];  // zero sums per head: lane (i % 4) * NG + g
  for (std::size_t h0 = 0; h0 < nq; h0 += kHeads) {
    const std::size_t hn = std::min(kHeads, nq - h0);
    __m256 z[kHeads];
    for (auto& v : z) v = _mm256_setzero_ps();
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      // Lanes (r, g) = row i + r, group g (NG = 2); lanes r and 4 + r repeat it (NG = 1).
      __m256 sc, ze;
      __m256i dup;
      if constexpr (NG == 2) {
        sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + 2 * i)));
        ze = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zero + 2 * i)));
        dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
      } else {
        long long s4, z4;  // 4 halves each
        std::memcpy(&s4, scale + i, 8);
        std::memcpy(&z4, zero + i, 8);
        sc = _mm256_cvtph_ps(_mm_set1_epi64x(s4));
        ze = _mm256_cvtph_ps(_mm_set1_epi64x(z4));
        dup = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
      }
      for (std::size_t h = 0; h < hn; ++h) {
        const std::size_t hh = h0 + h;
        const __m256 pr = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p + hh * ps + i)), dup);
        const __m256 c = _mm256_mul_ps(pr, sc);
        if constexpr (NG == 2) {
          const __m128 lo = _mm256_castps256_ps128(c), hi = _mm256_extractf128_ps(c, 1);
          _mm_storel_pi(reinterpret_cast<__m64*>(coef + (i * nq + hh) * 2), lo);
          _mm_storeh_pi(reinterpret_cast<__m64*>(coef + ((i + 1) * nq + hh) * 2), lo);
          _mm_storel_pi(reinterpret_cast<__m64*>(coef + ((i + 2) * nq + hh) * 2), hi);
          _mm_storeh_pi(reinterpret_cast<__m64*>(coef + ((i + 3) * nq + hh) * 2), hi);
        } else {
          const __m128 lo = _mm256_castps256_ps128(c);
          _mm_store_ss(coef + i * nq + hh, lo);
          _mm_store_ss(coef + (i + 1) * nq + hh, _mm_movehdup_ps(lo));
          _mm_store_ss(coef + (i + 2) * nq + hh, _mm_movehl_ps(lo, lo));
          _mm_store_ss(coef + (i + 3) * nq + hh, _mm_shuffle_ps(lo, lo, 0xFF));
        }
        z[h] = _mm256_fmadd_ps(pr, ze, z[h]);
      }
    }
    for (std::size_t h = 0; h < hn; ++h) {
      alignas(32) float l[8];
      _mm256_store_ps(l, z[h]);
      std::copy(l, l + 4 * NG, zl[h]);
    }
    for (std::size_t t = i; t < n; ++t) {  // the last rows: the plain loop's operations on the same lanes
      for (std::size_t h = 0; h < hn; ++h) {
        const std::size_t hh = h0 + h;
        const float pi = p[hh * ps + t];
        for (std::size_t g = 0; g < NG; ++g) {
          coef[(t * nq + hh) * NG + g] = pi * f16_value(scale[t * NG + g]);
          float& zt = zl[h][(t % 4) * NG + g];
          zt = std::fma(pi, f16_value(zero[t * NG + g]), zt);
        }
      }
    }
    for (std::size_t h = 0; h < hn; ++h) {
      for (std::size_t g = 0; g < NG; ++g) {
        const float* zh = zl[h];
        zsum[(h0 + h) * NG + g] = (zh[g] + zh[NG + g]) + (zh[2 * NG + g] + zh[3 * NG + g]);
      }
    }
  }
}

#endif  // AKV_ATTN_AVX2

}  // namespace

void score_rows(const Rows& rows, std::size_t nq, const float* w, std::size_t ws, const float* bias,
                float* s, std::size_t ss, float* sq) {
#ifdef AKV_ATTN_AVX512_TU
  if (active_isa() == Isa::avx512) return avx512::score_rows_simd(rows, nq, w, ws, bias, s, ss, sq);
#endif
#ifdef AKV_ATTN_AVX2
  if (active_isa() == Isa::avx2) return avx2::score_rows_simd(rows, nq, w, ws, bias, s, ss, sq);
#endif
  score_rows_scalar(rows, nq, w, ws, bias, s, ss, sq);
}

void accumulate_rows(const Rows& rows, std::size_t nq, const float* coef, std::size_t ng,
                     std::size_t cpg, float* acc, std::size_t as) {
#ifdef AKV_ATTN_AVX512_TU
  if (active_isa() == Isa::avx512) return avx512::accumulate_rows_simd(rows, nq, coef, ng, cpg, acc, as);
#endif
#ifdef AKV_ATTN_AVX2
  if (active_isa() == Isa::avx2) return avx2::accumulate_rows_simd(rows, nq, coef, ng, cpg, acc, as);
#endif
  accumulate_rows_scalar(rows, nq, coef, ng, cpg, acc, as);
}

void value_coefficients(const float* p, std::size_t ps, const std::uint16_t* scale, const std::uint16_t* zero,
                        std::size_t n, std::size_t nq, std::size_t ng, float* coef, float* zsum) {
  std::size_t g0 = 0;
#ifdef AKV_ATTN_AVX2
  if (active_isa() != Isa::generic && ng <= 2) {
    return ng == 1 ? value_coefficients_narrow<1>(p, ps, scale, zero, n, nq, coef, zsum)
                   : value_coefficients_narrow<2>(p, ps, scale, zero, n, nq, coef, zsum);
  }
  if (active_isa() != Isa::generic) {
    for (; g0 + 4 <= ng; g0 += 4) {
      std::size_t h0 = 0;
      for (; h0 + 2 <= nq; h0 += 2) value_coefficients4<2>(p, ps, scale, zero, n, nq, ng, g0, h0, coef, zsum);
      for (; h0 < nq; ++h0) value_coefficients4<1>(p, ps, scale, zero, n, nq, ng, g0, h0, coef, zsum);
    }
  }
#endif
  for (std::size_t g = g0; g < ng; ++g) {
    for (std::size_t h = 0; h < nq; ++h) {
      const float* ph = p + h * ps;
      float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (std::size_t i = 0; i < n; ++i) {
        const float pi = ph[i];
        coef[(i * nq + h) * ng + g] = pi * f16_value(scale[i * ng + g]);
        z[i % 4] = std::fma(pi, f16_value(zero[i * ng + g]), z[i % 4]);
      }
      zsum[h * ng + g] = (z[0] + z[1]) + (z[2] + z[3]);
    }
  }
}

void key_weights(const float* q, std::size_t nq, std::size_t cols, const std::uint16_t* scale,
                 const std::uint16_t* zero, float* w, float* bias) {
#ifdef AKV_ATTN_AVX2
  if (active_isa() != Isa::generic) {
    // Two heads at a time, four accumulators each (chunk k into k % 4): with one, each head's
    // sum was a chain of cols / 8 dependent FMAs (2026-12-01, commit 5305fab, AMD EPYC Zen 5, AVX2, head_dim 128, one
    // head: 19 ns per call, about as long as 4 FMA latencies per chunk).
    for (std::size_t h0 = 0; h0 < nq; h0 += 2) {
      const std::size_t hn = std::min<std::size_t>(2, nq - h0);
      __m256 b[2][4];
      for (auto& bh : b) bh[0] = bh[1] = bh[2] = bh[3] = _mm256_setzero_ps();
      const auto chunk = [&](std::size_t c, int j) {
        const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + c)));
        const __m256 ze = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zero + c)));
        for (std::size_t h = 0; h < hn; ++h) {
          const __m256 qc = _mm256_loadu_ps(q + (h0 + h) * cols + c);
          _mm256_storeu_ps(w + (h0 + h) * cols + c, _mm256_mul_ps(qc, sc));
          b[h][j] = _mm256_fmadd_ps(qc, ze, b[h][j]);
        }
      };
      std::size_t c = 0;
      for (; c + 32 <= cols; c += 32) {
        chunk(c, 0);
        chunk(c + 8, 1);
        chunk(c + 16, 2);
        chunk(c + 24, 3);
      }
      for (int j = 0; c < cols; c += 8, ++j) chunk(c, j);
      for (std::size_t h = 0; h < hn; ++h) {
        alignas(32) float l[8];
        _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(b[h][0], b[h][1]), _mm256_add_ps(b[h][2], b[h][3])));
        bias[h0 + h] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      }
    }
    return;
  }
#endif
  for (std::size_t h = 0; h < nq; ++h) {
    const float* qh = q + h * cols;
    float l[32] = {};
    for (std::size_t c = 0; c < cols; ++c) {
      w[h * cols + c] = qh[c] * f16_value(scale[c]);
      l[c % 32] = std::fma(qh[c], f16_value(zero[c]), l[c % 32]);
    }
    float t[8];
    for (int i = 0; i < 8; ++i) t[i] = (l[i] + l[8 + i]) + (l[16 + i] + l[24 + i]);
    bias[h] = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
}

void nibble_sums(const float* table, std::size_t nq, std::size_t nibbles, const std::uint8_t* bits,
                 std::size_t stride, std::size_t n, float* out, std::size_t os) {
  if (nibbles == 0 || nibbles % 2 != 0) throw std::invalid_argument("nibble_sums: an even number of nibbles");
#ifdef AKV_ATTN_AVX512_TU
  if (active_isa() == Isa::avx512) return avx512::nibble_sums_simd(table, nq, nibbles, bits, stride, n, out, os);
#endif
#ifdef AKV_ATTN_AVX2
  if (active_isa() == Isa::avx2) return avx2::nibble_sums_simd(table, nq, nibbles, bits, stride, n, out, os);
#endif
  for (std::size_t h = 0; h < nq; ++h) {
    const float* t = table + h * 16 * nibbles;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t* row = bits + i * stride;
      float s = 0.0f;
      for (std::size_t j = 0; j < nibbles; ++j) s += t[16 * j + ((row[j / 2] >> (4 * (j % 2))) & 15u)];
      out[h * os + i] = s;
    }
  }
}

float max_value(const float* x, std::size_t n) {
  float m = x[0];
  std::size_t i = 0;
#ifdef AKV_ATTN_AVX2
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
    alignas(32) float b[8];
    _mm256_store_ps(b, v);
    for (float y : b) m = std::max(m, y);
  }
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

namespace {

template <bool Flush>
float exp_shifted_t(const float* x, float shift, std::size_t n, float* out) {
  std::size_t i = 0;
  float sum = 0.0f;
#ifdef AKV_ATTN_AVX2
  const __m256 m = _mm256_set1_ps(shift);
  __m256 vs = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    if constexpr (Flush) e = _mm256_and_ps(e, _mm256_cmp_ps(e, _mm256_set1_ps(kMinWeight), _CMP_GE_OQ));
    _mm256_storeu_ps(out + i, e);
    vs = _mm256_add_ps(vs, e);
  }
  sum = avx2::hsum(vs);  // the vector loops' horizontal sum (kernels_simd.h)
#endif
  for (; i < n; ++i) {
    out[i] = std::exp(x[i] - shift);
    if (Flush && out[i] < kMinWeight) out[i] = 0.0f;
    sum += out[i];
  }
  return sum;
}

}  // namespace

float exp_shifted(const float* x, float shift, std::size_t n, float* out) { return exp_shifted_t<false>(x, shift, n, out); }

float exp_weights(const float* x, float shift, std::size_t n, float* out) { return exp_shifted_t<true>(x, shift, n, out); }

}  // namespace akv::attn
