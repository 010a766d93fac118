#include "akv/tensor/half.h"

#include <bit>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace akv {

std::uint16_t f32_to_f16_ref(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t exp = (u >> 23) & 0xffu;
  std::uint32_t mant = u & 0x7fffffu;
  if (exp == 0xffu) {  // Inf stays Inf; NaN is quieted, keeping the top payload bits.
    if (mant == 0) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | (mant >> 13));
  }
  const int e = static_cast<int>(exp) - 127 + 15;  // biased f16 exponent
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // f16 subnormal or zero
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach Inf: correct
  return static_cast<std::uint16_t>(h);
}

float f16_to_f32_ref(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      std::uint32_t e = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {  // Inf; NaN is quieted (as F16C does), payload kept
    u = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(u);
}

std::uint16_t f32_to_bf16_ref(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

float bf16_to_f32_ref(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

void f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16_ref(src[i]);
}

void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32_ref(src[i]);
}

void f32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_ref(src[i]);
}

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32_ref(src[i]);
}

namespace {
// The next f16 bit pattern toward +Inf (dir > 0) or -Inf (dir < 0) from a finite h.
std::uint16_t f16_step(std::uint16_t h, int dir) {
  const bool negative = (h & 0x8000u) != 0;
  if ((h & 0x7fffu) == 0) return dir > 0 ? 0x0001 : 0x8001;  // from +-0
  const bool away_from_zero = (dir > 0) != negative;
  return static_cast<std::uint16_t>(away_from_zero ? h + 1 : h - 1);
}
}  // namespace

float f16_round_down(float x) {
  std::uint16_t h = f32_to_f16_ref(x);
  if (f16_to_f32_ref(h) > x) h = f16_step(h, -1);
  return f16_to_f32_ref(h);
}

float f16_round_up(float x) {
  std::uint16_t h = f32_to_f16_ref(x);
  if (f16_to_f32_ref(h) < x) h = f16_step(h, +1);
  return f16_to_f32_ref(h);
}

void round_through_f16(float* x, std::size_t n) {
  constexpr std::size_t kBlock = 256;
  std::uint16_t tmp[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    std::size_t m = n - i < kBlock ? n - i : kBlock;
    f32_to_f16(x + i, tmp, m);
    f16_to_f32(tmp, x + i, m);
  }
}

}  // namespace akv
