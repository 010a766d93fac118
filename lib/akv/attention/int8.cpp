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
void accumulate_rows_int8_simd(const Rows& rows, std::size_t nq, const std::uint16_t* pairs, std::size_t ng,
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

int format_bits(RowFormat f) { return f == RowFormat::code2 ? 2 : 4; }

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

void accumulate_rows_int8_scalar(const Rows& rows, std::size_t nq, const std::uint16_t* pairs, std::size_t ng,
                                 std::size_t group, const float* sigma, float* acc, std::size_t as) {
  const std::size_t cols = rows.chunks * 8;
  for (std::size_t h = 0; h < nq; ++h) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t g = c / group;
      std::int32_t sum = 0;
      for (std::size_t r = 0; r < rows.n; ++r) {
        const int c8 = (pairs[((r / 2) * nq + h) * ng + g] >> (8 * (r % 2))) & 0xFF;
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

constexpr float kLevels = 127.0f, kMaxMult = 256.0f;

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
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(natural), w);
  __m256i l;
  if (f == RowFormat::code4) {  // even bytes then odd bytes of each half, then halves interleaved by 8 bytes
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    l = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
    const __m256i quad = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                          0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quads), _mm256_shuffle_epi8(w, quad));
  } else {  // bytes 4i + k grouped by k in each half, then the halves' groups interleaved
    const __m256i split = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                           0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    l = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(w, split), order);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), l);
}

// Entries j .. j+k (k <= 8) of quantize_coefficients_int8 in one vector (lanes past k load 0
// and are not stored).
void round_coefficients(const float* coef, std::size_t n, std::size_t e, std::size_t j, std::size_t k,
                        std::uint16_t* pairs, float* sigma) {
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
  const std::size_t np = (n + 1) / 2;
  for (std::size_t p = 0; p < np; ++p) {
    const __m256i a = round_epi32(load(2 * p), inv, lo, hi);
    const __m256i b = 2 * p + 1 < n ? round_epi32(load(2 * p + 1), inv, lo, hi) : _mm256_setzero_si256();
    const __m256i w = _mm256_or_si256(a, _mm256_slli_epi32(b, 8));
    const __m128i packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08));
    if (k == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + p * e + j), packed);
    } else {
      alignas(16) std::uint16_t t[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), packed);
      std::copy(t, t + k, pairs + p * e + j);
    }
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
  out.quads.resize(f == RowFormat::code4 ? nq * cols : 0);
  out.unit.resize(nq);
  const bool vec = avx2_int8();
  std::vector<float>& bmax = out.block_max;
  bmax.resize(nb);
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
      std::int8_t* quads = f == RowFormat::code4 ? out.quads.data() + h * cols + b * kInt8Block : nullptr;
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
      if (quads) {
        constexpr std::size_t kQuadOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // even channels of a chunk, then odd
        for (std::size_t c = 0; c < kInt8Block; ++c) quads[c] = natural[c - c % 8 + kQuadOrder[c % 8]];
      }
    }
  }
}

void quantize_coefficients_int8(const float* coef, std::size_t n, std::size_t nq, std::size_t ng,
                                std::vector<std::uint16_t>& pairs, std::vector<float>& sigma) {
  if (n > kInt8ValueRows) {
    throw InvalidInput("int8 attention: too many rows in a value sub-tile", {"", "rows", std::to_string(n)});
  }
  const std::size_t np = (n + 1) / 2, e = nq * ng;  // entries (head, group) per row
  pairs.resize(np * e);
  sigma.resize(e);
  std::size_t j = 0;
#ifdef AKV_INT8_AVX2
  if (avx2_int8()) {
    for (; j < e; j += 8) round_coefficients(coef, n, e, j, std::min<std::size_t>(8, e - j), pairs.data(), sigma.data());
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
    for (std::size_t p = 0; p < np; ++p) {
      const auto a = static_cast<unsigned>(round_coefficient(coef[2 * p * e + j], inv));
      const auto b = 2 * p + 1 < n ? static_cast<unsigned>(round_coefficient(coef[(2 * p + 1) * e + j], inv)) : 0u;
      pairs[p * e + j] = static_cast<std::uint16_t>(a | b << 8);
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

void accumulate_rows_int8(const Rows& rows, std::size_t nq, const std::uint16_t* pairs, std::size_t ng,
                          std::size_t group, const float* sigma, float* acc, std::size_t as) {
  check_int8_rows(rows, rows.chunks * 8);
  if (rows.n > kInt8ValueRows || group == 0 || group % kInt8Block != 0) {
    throw InvalidInput("int8 attention: value sub-tile of at most 16 rows, groups a multiple of 32 channels",
                       {"", "rows/group", std::to_string(rows.n) + "/" + std::to_string(group)});
  }
#ifdef AKV_ATTN_INT8_AVX512_TU
  if (avx512_int8()) return avx512::accumulate_rows_int8_simd(rows, nq, pairs, ng, group, sigma, acc, as);
#endif
#ifdef AKV_INT8_AVX2
  if (avx2_int8()) return avx2::accumulate_rows_int8_simd(rows, nq, pairs, ng, group, sigma, acc, as);
#endif
  accumulate_rows_int8_scalar(rows, nq, pairs, ng, group, sigma, acc, as);
}

}  // namespace akv::attn
