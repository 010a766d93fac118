#pragma once
// IEEE binary16 (f16) and bfloat16 conversions, round to nearest even.
// Scalar reference (`*_ref`) and fast array paths (F16C when compiled for x86-64-v3) that must
// agree bit for bit on every input, NaN payloads included (tested exhaustively for f16 -> f32).
#include <cstddef>
#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace akv {

std::uint16_t f32_to_f16_ref(float x);
float f16_to_f32_ref(std::uint16_t h);
std::uint16_t f32_to_bf16_ref(float x);
float bf16_to_f32_ref(std::uint16_t h);

// One f16 value as f32, exact: F16C's conversion where the translation unit is built with it
// (bit for bit f16_to_f32_ref). Static: each unit keeps its own copy, compiled for its own
// instruction set (an AVX-512 unit's copy never serves another unit).
static inline float f16_value(std::uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32_ref(h);
#endif
}

// Whether an f16 (bits) is Inf or NaN: its exponent bits all set (no conversion needed).
inline bool f16_nonfinite(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u; }

// Array conversions: dst[i] = convert(src[i]) for i < n.
void f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n);
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);

// Directed f16 rounding of finite x: the largest f16 <= x / the smallest f16 >= x (as f32).
// Values beyond the f16 range give -Inf / +Inf.
float f16_round_down(float x);
float f16_round_up(float x);

// x rounded to the nearest f16, as f32 (what storing one value as f16 does to it).
inline float f16_nearest(float x) { return f16_to_f32_ref(f32_to_f16_ref(x)); }

// Rounds every element through f16 and back (what storing as f16 does to a value).
void round_through_f16(float* x, std::size_t n);

}  // namespace akv
