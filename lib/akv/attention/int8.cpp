#include "akv/attention/int8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "akv/core/errors.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define AKV_INT8_AVX2 1
#define AKV_SIMD_NS avx2
#include "akv/attention/int8_simd.h"
#undef AKV_SIMD_NS
#endif

namespace akv::attn {

#ifdef AKV_ATTN_INT8_AVX512_TU
namespace avx512 {  // int8_avx512.cpp
void score_rows_int8_simd(const Rows& rows, const Int8WeightsView& w, const float* bias, float* s, std::size_t ss);
void quantize_weights_int8_simd(const float* w, RowFormat f, const Int8WeightsOut& out);
bool quantize_coefficients_int8_simd(const float* coef, std::size_t n, std::size_t e, std::uint32_t* quads,
                                     float* sigma);
void accumulate_rows_int8_simd(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                               std::size_t group, const float* sigma, float* acc, std::size_t as);
}  // namespace avx512
#endif

namespace {

// The AVX-512 integer loops also need VNNI.
bool avx512_int8() {
#ifdef AKV_ATTN_INT8_AVX512_TU
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return ok && active_isa() == Isa::avx512;
#else
  return false;
#endif
}

bool avx2_int8() {
#ifdef AKV_INT8_AVX2
  return active_isa() != Isa::generic;
#else
  return false;
#endif
}

[[maybe_unused]] Int8WeightsView view(const Int8Weights& w) {
  return {w.nq,         w.cols,         w.lanes.data(), w.mult16.data(),
          w.unit.data(), w.mult.data(), w.quads.empty() ? nullptr : w.quads.data()};
}

// Code c of a row (2 or 4 bits).
int code_at(RowFormat f, const std::uint8_t* row, std::size_t c) {
  const int b = format_bits(f);
  const std::size_t bit = c * static_cast<std::size_t>(b);
  return (row[bit / 8] >> (bit % 8)) & ((1 << b) - 1);
}

void check_int8_rows(const Rows& rows, std::size_t cols) {
  if (!int8_format(rows.format) || rows.chunks * 8 != cols || cols % kInt8Block != 0) {
    throw InvalidInput("int8 attention: 2- or 4-bit codes in rows of a multiple of 32 channels",
                       {"", "cols", std::to_string(rows.chunks * 8)});
  }
}

void score_rows_int8_scalar(const Rows& rows, const Int8Weights& w, const float* bias, float* s, std::size_t ss) {
  const std::size_t nb = w.cols / kInt8Block;
  for (std::size_t r = 0; r < rows.n; ++r) {
    const std::uint8_t* row = rows.base + r * rows.stride;
    for (std::size_t h = 0; h < w.nq; ++h) {
      std::int32_t sum = 0;
      for (std::size_t b = 0; b < nb; ++b) {
        std::int32_t block = 0;
        for (std::size_t c = b * kInt8Block; c < (b + 1) * kInt8Block; ++c) {
          block += w.w[h * w.cols + c] * code_at(rows.format, row, c);
        }
        sum += w.mult[h * nb + b] * block;
      }
      s[h * ss + r] = std::fma(w.unit[h], static_cast<float>(sum), bias ? bias[h] : 0.0f);
    }
  }
}

void accumulate_rows_int8_scalar(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                                 std::size_t group, const float* sigma, float* acc, std::size_t as) {
  const std::size_t cols = rows.chunks * 8, e = nq * ng;
  for (std::size_t h = 0; h < nq; ++h) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t g = c / group;
      std::int32_t sum = 0;
      for (std::size_t r = 0; r < rows.n; ++r) {
        const auto c8 = static_cast<std::int32_t>(coefficient_c8(quads, e, r, h * ng + g));
        sum += c8 * code_at(rows.format, rows.base + r * rows.stride, c);
      }
      acc[h * as + c] = std::fma(sigma[h * ng + g], static_cast<float>(sum), acc[h * as + c]);
    }
  }
}

}  // namespace

bool int8_format(RowFormat f) { return f == RowFormat::code2 || f == RowFormat::code4; }

int int8_lane_channel(RowFormat f, int lane) {
  if (f == RowFormat::code4) return lane < 16 ? 2 * lane : 2 * (lane - 16) + 1;
  return 4 * (lane % 8) + lane / 8;
}

namespace {

constexpr float kLevels = kInt8Levels, kMaxMult = kInt8MaxMult;

// The roundings, one element at a time; the vector loops below do the same operations
// (multiply, round to nearest even, clamp), so both give the same codes.
inline float round_weight(float x, float inv) { return std::clamp(std::nearbyint(x * inv), -kLevels, kLevels); }
inline float round_coefficient(float x, float inv) { return std::clamp(std::nearbyint(x * inv), 0.0f, kLevels); }

void check_coefficient(float x) {
  if (!(x >= 0.0f && x <= std::numeric_limits<float>::max())) {
    throw InvalidInput("int8 attention: value coefficients must be finite and >= 0 (value scales >= 0)",
                       {"", "coefficient", std::to_string(x)});
  }
}

#ifdef AKV_INT8_AVX2
// max |x[i]| over 32 values.
float max_abs32(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x)), _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8)));
  const __m256 b = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 16)), _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 24)));
  __m256 m = _mm256_max_ps(a, b);
  m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
  return _mm256_cvtss_f32(m);
}

// Clamped, then converted with the default rounding (to nearest even): the bounds are integers,
// so this equals the plain loop's round-then-clamp (one operation fewer than rounding first:
// 2026-12-01, commit 6c83d70, AMD EPYC Zen 5, AVX2 loops, one core, 4 heads, head_dim 128: quantize_weights_int8 165 -> 148
// ns per key group, quantize_coefficients_int8 53 -> 48 ns per 16 rows).
inline __m256i round_epi32(__m256 x, __m256 inv, __m256 lo, __m256 hi) {
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, inv), lo), hi));
}

// One block of 32 weights: codes in channel order, in int8_lane_channel order and (4 bits) as
// quads.
void round_block(const float* x, float inv, RowFormat f, std::int8_t* natural, std::int8_t* lanes, std::int8_t* quads) {
  const __m256 v = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-kLevels), hi = _mm256_set1_ps(kLevels);
  const __m256i a = round_epi32(_mm256_loadu_ps(x), v, lo, hi), b = round_epi32(_mm256_loadu_ps(x + 8), v, lo, hi);
  const __m256i c = round_epi32(_mm256_loadu_ps(x + 16), v, lo, hi), d = round_epi32(_mm256_loadu_ps(x + 24), v, lo, hi);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i w = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d)), order);
  avx2::store_weight_block(w, f, natural, lanes, quads);
}

// Entries j .. j+k (k <= 8) of quantize_coefficients_int8 in one vector (lanes past k load 0
// and are not stored).
void round_coefficients(const float* coef, std::size_t n, std::size_t e, std::size_t j, std::size_t k,
                        std::uint32_t* quads, float* sigma) {
  const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(kLevels), big = _mm256_set1_ps(std::numeric_limits<float>::max());
  const auto load = [&](std::size_t r) { return _mm256_maskload_ps(coef + r * e + j, live); };
  __m256 cmax = lo, ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (std::size_t r = 0; r < n; ++r) {
    const __m256 x = load(r);
    ok = _mm256_and_ps(ok, _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, big, _CMP_LE_OQ)));
    cmax = _mm256_max_ps(cmax, x);
  }
  if (_mm256_movemask_ps(ok) != 0xFF) {
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = j; i < j + k; ++i) check_coefficient(coef[r * e + i]);
    }
  }
  _mm256_maskstore_ps(sigma + j, live, _mm256_div_ps(cmax, hi));
  const __m256 inv = _mm256_and_ps(_mm256_div_ps(hi, cmax), _mm256_cmp_ps(cmax, lo, _CMP_GT_OQ));
  for (std::size_t q = 0; q < (n + 3) / 4; ++q) {
    __m256i w = _mm256_setzero_si256();
    for (std::size_t i = 0; i < 4 && 4 * q + i < n; ++i) {
      w = _mm256_or_si256(w, _mm256_slli_epi32(round_epi32(load(4 * q + i), inv, lo, hi), static_cast<int>(8 * i)));
    }
    _mm256_maskstore_epi32(reinterpret_cast<int*>(quads + q * e + j), live, w);
  }
}

#endif

}  // namespace

void quantize_weights_int8(const float* w, std::size_t nq, std::size_t cols, RowFormat f, Int8Weights& out) {
  if (!int8_format(f) || cols % kInt8Block != 0) {
    throw InvalidInput("int8 attention: 2- or 4-bit codes in rows of a multiple of 32 channels",
                       {"", "cols", std::to_string(cols)});
  }
  const std::size_t nb = cols / kInt8Block;
  out.format = f;
  out.nq = nq;
  out.cols = cols;
  out.w.resize(nq * cols);
  out.lanes.resize(nq * cols);
  out.mult.resize(nq * nb);
  out.mult16.resize(nq * nb * 16);
  out.quads.resize(nq * cols);
  out.unit.resize(nq);
  std::vector<float>& bmax = out.block_max;
  bmax.resize(nb);
#ifdef AKV_ATTN_INT8_AVX512_TU
  if (avx512_int8() && kInt8VectorBlocks % nb == 0) {
    const Int8WeightsOut o{nq,          cols,           out.w.data(),    out.lanes.data(), out.mult.data(),
                           out.mult16.data(), out.quads.data(), out.unit.data()};
    return avx512::quantize_weights_int8_simd(w, f, o);
  }
#endif
  const bool vec = avx2_int8();
  for (std::size_t h = 0; h < nq; ++h) {
    const float* x = w + h * cols;
    float amax = 0.0f;
    for (std::size_t b = 0; b < nb; ++b) {
      const float* xb = x + b * kInt8Block;
      float m = 0.0f;
#ifdef AKV_INT8_AVX2
      if (vec) m = max_abs32(xb);
#endif
      if (!vec) {
        for (std::size_t c = 0; c < kInt8Block; ++c) m = std::max(m, std::fabs(xb[c]));
      }
      bmax[b] = m;
      amax = std::max(amax, m);
    }
    const float unit = amax / (kLevels * kMaxMult);
    out.unit[h] = unit;
    for (std::size_t b = 0; b < nb; ++b) {
      const float* xb = x + b * kInt8Block;
      const float m = unit > 0.0f ? std::clamp(std::ceil(bmax[b] / (kLevels * unit)), 1.0f, kMaxMult) : 1.0f;
      const float step = unit * m, inv = step > 0.0f ? 1.0f / step : 0.0f;
      const auto mi = static_cast<std::int16_t>(m);
      out.mult[h * nb + b] = mi;
      std::int16_t* m16 = out.mult16.data() + (b * nq + h) * 16;
      std::int8_t* natural = out.w.data() + h * cols + b * kInt8Block;
      std::int8_t* lanes = out.lanes.data() + (b * nq + h) * kInt8Block;
      std::int8_t* quads = out.quads.data() + h * cols + b * kInt8Block;
#ifdef AKV_INT8_AVX2
      if (vec) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(m16), _mm256_set1_epi16(mi));
        round_block(xb, inv, f, natural, lanes, quads);
        continue;
      }
#endif
      std::fill_n(m16, 16, mi);
      for (std::size_t c = 0; c < kInt8Block; ++c) natural[c] = static_cast<std::int8_t>(round_weight(xb[c], inv));
      for (int i = 0; i < static_cast<int>(kInt8Block); ++i) lanes[i] = natural[int8_lane_channel(f, i)];
      if (f == RowFormat::code4) {
        constexpr std::size_t kQuadOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // even channels of a chunk, then odd
        for (std::size_t c = 0; c < kInt8Block; ++c) quads[c] = natural[c - c % 8 + kQuadOrder[c % 8]];
      } else {
        for (std::size_t c = 0; c < kInt8Block; ++c) quads[c] = natural[c - c % 16 + 4 * (c % 4) + (c % 16) / 4];
      }
    }
  }
}

void quantize_coefficients_int8(const float* coef, std::size_t n, std::size_t nq, std::size_t ng,
                                std::vector<std::uint32_t>& quads, std::vector<float>& sigma) {
  if (n > kInt8ValueRows) {
    throw InvalidInput("int8 attention: too many rows in a value sub-tile", {"", "rows", std::to_string(n)});
  }
  const std::size_t nk = (n + 3) / 4, e = nq * ng;  // row quads, entries (head, group) per row
  quads.resize(nk * e);
  sigma.resize(e);
  std::size_t j = 0;
#ifdef AKV_ATTN_INT8_AVX512_TU
  // A refused coefficient: the loops below throw for it.
  if (avx512_int8() && avx512::quantize_coefficients_int8_simd(coef, n, e, quads.data(), sigma.data())) return;
#endif
#ifdef AKV_INT8_AVX2
  if (avx2_int8()) {
    for (; j < e; j += 8) round_coefficients(coef, n, e, j, std::min<std::size_t>(8, e - j), quads.data(), sigma.data());
  }
#endif
  for (; j < e; ++j) {
    float cmax = 0.0f;
    for (std::size_t r = 0; r < n; ++r) {
      check_coefficient(coef[r * e + j]);
      cmax = std::max(cmax, coef[r * e + j]);
    }
    sigma[j] = cmax / kLevels;
    const float inv = cmax > 0.0f ? kLevels / cmax : 0.0f;
    for (std::size_t q = 0; q < nk; ++q) {
      std::uint32_t w = 0;
      for (std::size_t i = 0; i < 4 && 4 * q + i < n; ++i) {
        w |= static_cast<std::uint32_t>(round_coefficient(coef[(4 * q + i) * e + j], inv)) << (8 * i);
      }
      quads[q * e + j] = w;
    }
  }
}

void score_rows_int8(const Rows& rows, const Int8Weights& w, const float* bias, float* s, std::size_t ss) {
  check_int8_rows(rows, w.cols);
#ifdef AKV_ATTN_INT8_AVX512_TU
  if (avx512_int8()) return avx512::score_rows_int8_simd(rows, view(w), bias, s, ss);
#endif
#ifdef AKV_INT8_AVX2
  if (avx2_int8()) return avx2::score_rows_int8_simd(rows, view(w), bias, s, ss);
#endif
  score_rows_int8_scalar(rows, w, bias, s, ss);
}

void accumulate_rows_int8(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                          std::size_t group, const float* sigma, float* acc, std::size_t as) {
  check_int8_rows(rows, rows.chunks * 8);
  if (rows.n > kInt8ValueRows || group == 0 || group % kInt8Block != 0) {
    throw InvalidInput("int8 attention: value sub-tile of at most 16 rows, groups a multiple of 32 channels",
                       {"", "rows/group", std::to_string(rows.n) + "/" + std::to_string(group)});
  }
#ifdef AKV_ATTN_INT8_AVX512_TU
  if (avx512_int8()) return avx512::accumulate_rows_int8_simd(rows, nq, quads, ng, group, sigma, acc, as);
#endif
#ifdef AKV_INT8_AVX2
  if (avx2_int8()) return avx2::accumulate_rows_int8_simd(rows, nq, quads, ng, group, sigma, acc, as);
#endif
  accumulate_rows_int8_scalar(rows, nq, quads, ng, group, sigma, acc, as);
}

}  // namespace akv::attn
