#pragma once
// 8-bit floating point as KV caches store it (OCP 8-bit floating point, as vLLM's and
// PyTorch's float8_e4m3fn / float8_e5m2):
//   e4m3  sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN;
//         largest finite 448 (0x7E), smallest subnormal 2^-9 (0x01)
//   e5m2  sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 infinity,
//         S.11111.xx NaN; largest finite 57344 (0x7B), smallest subnormal 2^-16 (0x01)
// f32 -> fp8 rounds to nearest, ties to even, and saturates finite values beyond the largest
// finite one to it (vLLM clamps to the format's maximum before converting); NaN stays NaN
// (0x7F / 0x7E | sign), infinities saturate as well (a cache has no use for them). Decoding is
// exact. Tested against the nearest of all 256 decoded values (brute force) and the OCP table.
#include <cstddef>
#include <cstdint>
#include <string>

namespace akv {

enum class Fp8Format { e4m3, e5m2 };

// "e4m3" / "e5m2".
const char* fp8_format_name(Fp8Format f);
// The largest finite value: 448 (e4m3), 57344 (e5m2).
float fp8_max(Fp8Format f);

std::uint8_t fp8_encode(float x, Fp8Format f);
float fp8_decode(std::uint8_t code, Fp8Format f);

// Array forms: dst[i] = fp8_encode(src[i] / scale) (an f32 division, as vLLM's scaled
// conversion; the same codes by bit arithmetic on the f32, where fp8_encode is the plain
// reference through ilogb and a double division), dst[i] = fp8_decode(src[i]) * scale (an f32
// product).
void fp8_encode_rows(const float* src, std::size_t n, float scale, Fp8Format f, std::uint8_t* dst);
void fp8_decode_rows(const std::uint8_t* src, std::size_t n, float scale, Fp8Format f, float* dst);

}  // namespace akv
