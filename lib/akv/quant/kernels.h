#pragma once
// Internal row kernels of the affine quantizer's fast path: AVX2 + F16C + FMA when compiled for
// x86-64-v3, portable scalar loops otherwise. Each kernel computes exactly what the scalar
// reference computes (same operations in the same order per element), so results are bitwise
// identical; tests/unit/test_quant.cpp compares them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "akv/tensor/half.h"

namespace akv::kernels {

// lo[c] = min over rows of x[r*cols + c], hi likewise (rows >= 1).
void minmax_columns(const float* x, std::size_t rows, std::size_t cols, float* lo, float* hi);
// Min and max of x[0..n) (n >= 1).
void minmax_range(const float* x, std::size_t n, float* lo, float* hi);

// Group parameters for n groups from their ranges (see group_params): zero and 1/scale as f32
// (inverse 0 for scale 0) and the f16 bits of scale and zero. Throws like group_params.
void group_params_many(const float* lo, const float* hi, std::size_t n, int bits, float* zero,
                       float* inv, std::uint16_t* scale_bits, std::uint16_t* zero_bits);

// The kivi rule's parameters (see group_params_kivi): zero and scale as f32 and their f16 bits.
void group_params_kivi_many(const float* lo, const float* hi, std::size_t n, int bits, float* zero,
                            float* scale, std::uint16_t* scale_bits, std::uint16_t* zero_bits);

// codes[i] of x[i] against zero[i] and s[i] by the bounded rule (s = 1 / scale):
// clamp(round_half_even((x[i] - zero[i]) * s[i]), 0, max_code); with `kivi`, the kivi rule's codes
// of f16 inputs (s = scale): round_half_even(clamp(f16(f16(x[i] - zero[i]) / s[i]), 0, max_code)),
// 0 where that is NaN (scale 0).
void encode_per_element(bool kivi, const float* x, const float* zero, const float* s, std::size_t n,
                        float max_code, std::uint8_t* codes);
// Same with one zero and s for the whole range.
void encode_broadcast(bool kivi, const float* x, float zero, float s, std::size_t n, float max_code,
                      std::uint8_t* codes);
// The same rule for one value (the scalar reference and the vector loops' tails).
inline std::uint8_t encode_kivi_one(float x, float zero, float scale, float max_code) {
  const float q = f16_nearest(f16_nearest(x - zero) / scale);
  if (!(q > 0.0f)) return 0;
  return static_cast<std::uint8_t>(std::nearbyint(std::min(q, max_code)));
}

// out[i] = fma(code[i], scale[i], zero[i]) / with one scale and zero.
void decode_per_element(const std::uint8_t* codes, const float* scale, const float* zero,
                        std::size_t n, float* out);
void decode_broadcast(const std::uint8_t* codes, float scale, float zero, std::size_t n,
                      float* out);

}  // namespace akv::kernels
