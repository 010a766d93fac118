#pragma once
// ggml's reference quantizers for the types llama.cpp's KV cache uses (-ctk / -ctv): F16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, writing the block layouts of ggml_blocks.h byte for byte. Per block of
// 32 values (f16 fields rounded to nearest even):
//   Q8_0  d = max|x| / 127, q = roundf(x / d) (half away from zero; x times f32 1/d)
//   Q4_0  m = the value of largest magnitude (first on ties), d = m / -8,
//         q = min(15, trunc(fma(x, 1/d, 8.5)))
//   Q5_0  d = m / -16, q = min(31, trunc(fma(x, 1/d, 16.5))), bit 4 of q into qh
//   Q4_1  d = (max - min) / 15, q = min(15, trunc((x - min) (1/d) + 0.5)), m = min
//   Q5_1  d = (max - min) / 31, q = min(31, trunc((x - min) (1/d) + 0.5)), m = min
//   IQ4_NL m as Q4_0, codes l = the level of kIq4nlValues nearest to x (127 / -m) (ties up),
//         then d = sum w q x / sum w q^2 over those levels q, w = x^2 (sums in element order,
//         each product rounded); a block with max|x| < 1e-15 gets d = 0 and repeats the previous
//         block's codes (the first block's: 0)
// (1/d is 0 when d is 0.) Q4_0 and Q5_0 use one fused multiply-add, as x86 builds of ggml
// compile its reference (gguf-py reproduces that in f64); Q4_1 and Q5_1 round the product first.
// The fp8 cache types (tensor/fp8.h) and TurboQuant's row types (tensor/turboquant.h) quantize
// by their own rules.
// Checked byte for byte against gguf-py's quantizers: data/golden/ggml-quantize.json,
// tests/unit/test_gguf.cpp.
#include <cstddef>
#include <cstdint>

#include "akv/tensor/ggml_blocks.h"

namespace akv {

// Whether akv can quantize to the type (the list above).
bool ggml_can_quantize(const GgmlTypeInfo& type);
// Quantizes n values (a multiple of the type's block) into n / block blocks at dst.
void ggml_quantize(const GgmlTypeInfo& type, const float* x, std::size_t n, std::uint8_t* dst);

}  // namespace akv
