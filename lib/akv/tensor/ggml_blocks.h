#pragma once
// ggml's tensor types as GGUF files store them (docs/model.md, "GGUF"): block formats and their
// dequantization to f32, element by element as ggml's reference dequantizers (and gguf-py's)
// compute it: one f32 product, then one f32 addition or subtraction (no fused multiply-add; this
// file builds with -ffp-contract=off). Checked bit for bit against gguf-py (llama.cpp's Python
// package) on random blocks: data/golden/ggml-dequant.json, tests/unit/test_gguf.cpp.
//
//   type  id  block bytes  layout of one block
//   F32    0    1     4
//   F16    1    1     2
//   Q4_0   2   32    18    f16 d; 16 bytes: element j low nibble, j + 16 high; x = (q - 8) d
//   Q4_1   3   32    20    f16 d, f16 m; nibbles as Q4_0; x = q d + m
//   Q5_0   6   32    22    f16 d; u32 qh (bit j = 5th bit of element j); nibbles; x = (q - 16) d
//   Q5_1   7   32    24    f16 d, f16 m; qh; nibbles; x = q d + m
//   Q8_0   8   32    34    f16 d; 32 int8; x = q d
//   Q4_K  12  256   144    f16 d, f16 dmin; 12 bytes of 6-bit scales and mins for 8 groups of 32;
//                          128 bytes: per 64 elements, 32 bytes low nibbles then high nibbles;
//                          x = (d sc) q - (dmin m)
//   Q5_K  13  256   176    as Q4_K plus 32 bytes qh (bit i of byte l: element 32 i + l)
//   Q6_K  14  256   210    128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales, f16 d;
//                          x = (d sc) (q - 32)
//   IQ4_NL 20  32    18    f16 d; nibbles as Q4_0; x = d kvalues[q], kvalues the 16 non-uniform
//                          levels -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113
//   BF16  30    1     2
// and, for KV caches only (never in a GGUF file), the 8-bit floats of tensor/fp8.h, one byte per
// element, found by name: FP8_E4M3, FP8_E5M2 (a cache stores them with a scale beside the rows),
// and TurboQuant's rows (tensor/turboquant.h: one block per row of head_dim values, TQ3NC_128...).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "akv/tensor/fp8.h"

namespace akv {

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl).
inline constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

// Ids of the fp8 cache types (beyond ggml's id range).
inline constexpr std::uint32_t kFp8E4m3Id = 0x10000, kFp8E5m2Id = 0x10001;

struct GgmlTypeInfo {
  std::uint32_t id = 0;
  const char* name = "";
  std::size_t block = 1;  // elements per block
  std::size_t bytes = 4;  // bytes per block
};

// The type's layout, or nullptr when akv cannot read it.
const GgmlTypeInfo* ggml_type_info(std::uint32_t id);
// The layout of a type by its name ("Q4_K", "FP8_E4M3"), or nullptr.
const GgmlTypeInfo* ggml_type_info_by_name(const std::string& name);
// The fp8 format of an fp8 cache type, nullopt for ggml's types.
std::optional<Fp8Format> fp8_format_of(const GgmlTypeInfo& type);
// "Q4_K", or "type 23" for an id akv does not know.
std::string ggml_type_name(std::uint32_t id);
// Comma-separated names of every type akv reads (for error messages and docs).
std::string ggml_supported_types();

// Index of the first element of n whose block holds a non-finite value, or n when there is none.
// For block types it reads only the f16 scale fields: with finite scales every value is finite
// (codes and sub-scales are small integers).
std::size_t ggml_first_nonfinite(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n);

// Dequantizes n elements (n a multiple of the type's block) from `src` into `dst`.
void ggml_dequantize(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n, float* dst);
// The same with a tensor scale: fp8 values times `scale` (tensor/fp8.h fp8_decode_rows); ggml's
// types take scale 1 only (std::logic_error otherwise).
void ggml_dequantize_scaled(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n, float scale, float* dst);

}  // namespace akv
