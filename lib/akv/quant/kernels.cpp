#include "akv/quant/kernels.h"

#include <algorithm>
#include <cmath>

#include "akv/quant/affine.h"
#include "akv/tensor/half.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define AKV_QUANT_AVX2 1
#include <immintrin.h>
#endif

namespace akv::kernels {
namespace {

inline std::uint8_t encode1(float x, float zero, float inv, float max_code) {
  const float q = std::nearbyint((x - zero) * inv);
  return static_cast<std::uint8_t>(std::clamp(q, 0.0f, max_code));
}

#ifdef AKV_QUANT_AVX2
inline __m256 f16_nearest8(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// max_ps returns its second operand when the first is NaN: NaN -> 0, as encode_kivi_one.
inline __m256i encode_kivi8(__m256 x, __m256 zero, __m256 scale, __m256 max_code) {
  __m256 q = f16_nearest8(_mm256_div_ps(f16_nearest8(_mm256_sub_ps(x, zero)), scale));
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), max_code);
  q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_cvttps_epi32(q);
}

inline __m256i encode8(__m256 x, __m256 zero, __m256 inv, __m256 max_code) {
  __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(x, zero), inv),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), max_code);
  return _mm256_cvttps_epi32(q);
}

// Four vectors of 8 int32 codes (each < 256) -> 32 bytes in order.
inline void store32(__m256i a, __m256i b, __m256i c, __m256i d, std::uint8_t* out) {
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i bytes = _mm256_packus_epi16(ab, cd);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(bytes, order));
}

inline __m256 load_codes8(const std::uint8_t* c) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
#endif

}  // namespace

void minmax_columns(const float* x, std::size_t rows, std::size_t cols, float* lo, float* hi) {
  std::copy_n(x, cols, lo);
  std::copy_n(x, cols, hi);
  for (std::size_t r = 1; r < rows; ++r) {
    const float* row = x + r * cols;
    std::size_t c = 0;
#ifdef AKV_QUANT_AVX2
    for (; c + 8 <= cols; c += 8) {
      const __m256 v = _mm256_loadu_ps(row + c);
      _mm256_storeu_ps(lo + c, _mm256_min_ps(v, _mm256_loadu_ps(lo + c)));
      _mm256_storeu_ps(hi + c, _mm256_max_ps(v, _mm256_loadu_ps(hi + c)));
    }
#endif
    for (; c < cols; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
}

void minmax_range(const float* x, std::size_t n, float* lo, float* hi) {
  float l = x[0], h = x[0];
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  if (n >= 8) {
    __m256 vl = _mm256_loadu_ps(x), vh = vl;
    for (i = 8; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      vl = _mm256_min_ps(v, vl);
      vh = _mm256_max_ps(v, vh);
    }
    alignas(32) float bl[8], bh[8];
    _mm256_store_ps(bl, vl);
    _mm256_store_ps(bh, vh);
    l = bl[0];
    h = bh[0];
    for (int k = 1; k < 8; ++k) {
      l = std::min(l, bl[k]);
      h = std::max(h, bh[k]);
    }
  }
#endif
  for (; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
  }
  *lo = l;
  *hi = h;
}

void group_params_many(const float* lo, const float* hi, std::size_t n, int bits, float* zero,
                       float* inv, std::uint16_t* scale_bits, std::uint16_t* zero_bits) {
  const float levels = static_cast<float>((1 << bits) - 1);
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  // F16C conversion with a directed rounding mode is exactly f16_round_down / f16_round_up.
  const __m256 vlevels = _mm256_set1_ps(levels);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 l = _mm256_loadu_ps(lo + i), h = _mm256_loadu_ps(hi + i);
    const __m128i zh = _mm256_cvtps_ph(l, _MM_FROUND_TO_NEG_INF);
    const __m256 z = _mm256_cvtph_ps(zh);
    const __m256 hup = _mm256_cvtph_ps(_mm256_cvtps_ph(h, _MM_FROUND_TO_POS_INF));
    const __m128i sh =
        _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(h, z), vlevels), _MM_FROUND_TO_POS_INF);
    const __m256 s = _mm256_cvtph_ps(sh);
    const __m256 finite = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, z), inf, _CMP_LT_OQ),
                      _mm256_cmp_ps(_mm256_andnot_ps(sign, hup), inf, _CMP_LT_OQ)),
        _mm256_cmp_ps(s, inf, _CMP_LT_OQ));
    if (_mm256_movemask_ps(finite) != 0xff) break;  // the scalar loop throws with the details
    const __m256 positive = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ);
    const __m256 r = _mm256_and_ps(positive, _mm256_div_ps(_mm256_set1_ps(1.0f), s));
    _mm256_storeu_ps(zero + i, z);
    _mm256_storeu_ps(inv + i, r);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scale_bits + i), sh);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(zero_bits + i), zh);
  }
#endif
  for (; i < n; ++i) {
    const GroupParams p = group_params(lo[i], hi[i], bits);
    zero[i] = p.zero;
    inv[i] = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
    scale_bits[i] = f32_to_f16_ref(p.scale);
    zero_bits[i] = f32_to_f16_ref(p.zero);
  }
}

void group_params_kivi_many(const float* lo, const float* hi, std::size_t n, int bits, float* zero,
                            float* scale, std::uint16_t* scale_bits, std::uint16_t* zero_bits) {
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  const __m256 vlevels = _mm256_set1_ps(static_cast<float>((1 << bits) - 1));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (; i + 8 <= n; i += 8) {
    const __m256 l = _mm256_loadu_ps(lo + i), h = _mm256_loadu_ps(hi + i);
    const __m256 range = f16_nearest8(_mm256_sub_ps(h, l));
    const __m256 finite = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, l), inf, _CMP_LT_OQ),
                      _mm256_cmp_ps(_mm256_andnot_ps(sign, h), inf, _CMP_LT_OQ)),
        _mm256_cmp_ps(range, inf, _CMP_LT_OQ));
    if (_mm256_movemask_ps(finite) != 0xff) break;  // the scalar loop throws with the details
    const __m128i sh = _mm256_cvtps_ph(_mm256_div_ps(range, vlevels), kNearest);
    _mm256_storeu_ps(zero + i, l);
    _mm256_storeu_ps(scale + i, _mm256_cvtph_ps(sh));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scale_bits + i), sh);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(zero_bits + i), _mm256_cvtps_ph(l, kNearest));
  }
#endif
  for (; i < n; ++i) {
    const GroupParams p = group_params_kivi(lo[i], hi[i], bits);
    zero[i] = p.zero;
    scale[i] = p.scale;
    scale_bits[i] = f32_to_f16_ref(p.scale);
    zero_bits[i] = f32_to_f16_ref(p.zero);
  }
}

namespace {

// The two rules' element encoders (scalar, and 8 lanes under AVX2); `s` is 1/scale (bounded) or
// scale (kivi).
struct BoundedEncoder {
  static std::uint8_t one(float x, float zero, float s, float max_code) { return encode1(x, zero, s, max_code); }
#ifdef AKV_QUANT_AVX2
  static __m256i eight(__m256 x, __m256 zero, __m256 s, __m256 max_code) { return encode8(x, zero, s, max_code); }
#endif
};
struct KiviEncoder {
  static std::uint8_t one(float x, float zero, float s, float max_code) { return encode_kivi_one(x, zero, s, max_code); }
#ifdef AKV_QUANT_AVX2
  static __m256i eight(__m256 x, __m256 zero, __m256 s, __m256 max_code) { return encode_kivi8(x, zero, s, max_code); }
#endif
};

template <class E>
void encode_rows(const float* x, const float* zero, const float* s, std::size_t n, float max_code,
                 std::uint8_t* codes) {
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  const __m256 m = _mm256_set1_ps(max_code);
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const std::size_t j = i + 8 * static_cast<std::size_t>(k);
      v[k] = E::eight(_mm256_loadu_ps(x + j), _mm256_loadu_ps(zero + j), _mm256_loadu_ps(s + j), m);
    }
    store32(v[0], v[1], v[2], v[3], codes + i);
  }
#endif
  for (; i < n; ++i) codes[i] = E::one(x[i], zero[i], s[i], max_code);
}

template <class E>
void encode_range(const float* x, float zero, float s, std::size_t n, float max_code, std::uint8_t* codes) {
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  const __m256 m = _mm256_set1_ps(max_code);
  const __m256 z = _mm256_set1_ps(zero), r = _mm256_set1_ps(s);
  for (; i + 32 <= n; i += 32) {
    store32(E::eight(_mm256_loadu_ps(x + i), z, r, m), E::eight(_mm256_loadu_ps(x + i + 8), z, r, m),
            E::eight(_mm256_loadu_ps(x + i + 16), z, r, m), E::eight(_mm256_loadu_ps(x + i + 24), z, r, m),
            codes + i);
  }
#endif
  for (; i < n; ++i) codes[i] = E::one(x[i], zero, s, max_code);
}

}  // namespace

void encode_per_element(bool kivi, const float* x, const float* zero, const float* s, std::size_t n,
                        float max_code, std::uint8_t* codes) {
  (kivi ? encode_rows<KiviEncoder> : encode_rows<BoundedEncoder>)(x, zero, s, n, max_code, codes);
}

void encode_broadcast(bool kivi, const float* x, float zero, float s, std::size_t n, float max_code,
                      std::uint8_t* codes) {
  (kivi ? encode_range<KiviEncoder> : encode_range<BoundedEncoder>)(x, zero, s, n, max_code, codes);
}

void decode_per_element(const std::uint8_t* codes, const float* scale, const float* zero,
                        std::size_t n, float* out) {
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(load_codes8(codes + i), _mm256_loadu_ps(scale + i),
                                              _mm256_loadu_ps(zero + i)));
  }
#endif
  for (; i < n; ++i) out[i] = std::fma(static_cast<float>(codes[i]), scale[i], zero[i]);
}

void decode_broadcast(const std::uint8_t* codes, float scale, float zero, std::size_t n,
                      float* out) {
  std::size_t i = 0;
#ifdef AKV_QUANT_AVX2
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(load_codes8(codes + i), s, z));
  }
#endif
  for (; i < n; ++i) out[i] = std::fma(static_cast<float>(codes[i]), scale, zero);
}

}  // namespace akv::kernels
