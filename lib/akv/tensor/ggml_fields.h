#pragma once
// Fields of ggml blocks (internal to the tensor module: ggml_blocks.cpp's dequantizers and
// q8_dot.cpp's decoders read the same bytes the same way; layouts in ggml_blocks.h).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "akv/tensor/half.h"

namespace akv::ggml {

// Every helper here is static: units built for different instruction sets (the AVX-512 ones)
// include them, and each keeps its own copy (as half.h's f16_value).

// A block's f16 field (half.h f16_value: F16C where the unit is built with it).
static inline float f16_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_value(h);
}

static inline std::uint32_t u32_at(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 6-bit scale and min of group g (0..7) of a Q4_K / Q5_K super-block (q: its 12 scale bytes).
static inline void scale_min_k4(std::size_t g, const std::uint8_t* q, int& sc, int& m) {
  if (g < 4) {
    sc = q[g] & 63;
    m = q[g + 4] & 63;
  } else {
    sc = (q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4);
    m = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
  }
}

// The fields of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL block of type `id`: scale d, min m (0
// without), the 5th bits qh (0 without), the 16 bytes of nibbles (element j low nibble of byte j,
// j + 16 high nibble) and the code offset (8, 16, or 0 with a min).
struct SmallBlock {
  float d = 0, m = 0;
  std::uint32_t qh = 0;
  const std::uint8_t* qs = nullptr;
  int offset = 0;
  bool has_min = false, five = false;
};

static inline SmallBlock small_block_fields(std::uint32_t id, const std::uint8_t* b) {
  SmallBlock f;
  f.d = f16_at(b);
  f.has_min = id == 3 || id == 7;
  f.five = id == 6 || id == 7;
  f.m = f.has_min ? f16_at(b + 2) : 0.0f;
  const std::uint8_t* rest = b + (f.has_min ? 4 : 2);
  f.qh = f.five ? u32_at(rest) : 0;
  f.qs = rest + (f.five ? 4 : 0);
  f.offset = f.has_min ? 0 : (f.five ? 16 : 8);
  return f;
}

}  // namespace akv::ggml
