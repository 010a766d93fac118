#pragma once
// nuq's row decode (quant/nuq.h) sixteen values a step, compiled for AVX-512 F/VL/BW/DQ and picked at
// run time (core/isa.h); the same operations per value as the eight-wide loop, so the same bits.
#include <cstddef>
#include <cstdint>

namespace akv {

// Decodes values [0, m) of a row of n coded values (m the largest multiple of 16 <= n) and
// returns m: levels (16 floats, the first 2^bits used; bits 2, 3 or 4; nuq.cpp calls it for 2
// and 4) at the packed codes, times
// range plus offset (per_row: range[0], offset[0]; else per value), 0 where not finite, rounded
// through f16.
std::size_t nuq_decode_values_avx512(const float* levels16, int bits, const std::uint8_t* packed, const float* range,
                                     const float* offset, bool per_row, std::size_t n, float* o);

}  // namespace akv
