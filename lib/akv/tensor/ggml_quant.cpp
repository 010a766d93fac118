#include "akv/tensor/ggml_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"

namespace akv {
namespace {

void put_f16(std::uint8_t* p, float v) {
  const std::uint16_t h = f32_to_f16_ref(v);  // round to nearest even, as F16C and numpy
  p[0] = static_cast<std::uint8_t>(h & 0xFF);
  p[1] = static_cast<std::uint8_t>(h >> 8);
}

// Codes of a 32-value block after its f16 fields (at p): for 5-bit codes first the u32 qh (bit j =
// bit 4 of code j, little-endian), then 16 bytes with code j in the low nibble and j + 16 in the high.
void pack(const int* q, std::uint8_t* p, bool five) {
  std::uint32_t qh = 0;
  std::uint8_t* qs = p + (five ? 4 : 0);
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= static_cast<std::uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<std::uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if (five) {
    for (int k = 0; k < 4; ++k) p[k] = static_cast<std::uint8_t>(qh >> (8 * k));
  }
}

void q8_0(const float* x, std::uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(x[j] * id)));
}

// Q4_0 (levels 16) and Q5_0 (levels 32): symmetric around the value of largest magnitude.
void q_0(const float* x, std::uint8_t* b, int levels) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / static_cast<float>(-levels / 2), id = d != 0.0f ? 1.0f / d : 0.0f;
  const float offset = static_cast<float>(levels / 2) + 0.5f;
  put_f16(b, d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::min(levels - 1, static_cast<int>(static_cast<std::int8_t>(std::fma(x[j], id, offset))));
  pack(q, b + 2, levels == 32);
}

// Q4_1 (levels 16) and Q5_1 (levels 32): from the block's minimum.
void q_1(const float* x, std::uint8_t* b, int levels) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / static_cast<float>(levels - 1), id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  put_f16(b + 2, min);
  int q[32];
  for (int j = 0; j < 32; ++j) {
    const float scaled = (x[j] - min) * id;  // rounded before the addition (no contraction here)
    q[j] = std::min(levels - 1, static_cast<int>(static_cast<std::int8_t>(scaled + 0.5f)));
  }
  pack(q, b + 4, levels == 32);
}

// The level nearest to x (ties to the upper one; below or above every level: the end level).
int nearest_iq4nl(float x) {
  const std::int8_t* v = kIq4nlValues;
  if (x <= static_cast<float>(v[0])) return 0;
  if (x >= static_cast<float>(v[15])) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < static_cast<float>(v[mid])) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  const float below = x - static_cast<float>(v[hi - 1]), above = static_cast<float>(v[hi]) - x;
  return below < above ? hi - 1 : hi;
}

// IQ4_NL: codes from the scale max / -127 (max: the value of largest magnitude, first on ties),
// then the scale refitted by weighted least squares (weights x^2) over those codes. A block with
// max|x| < 1e-15 gets scale 0 and keeps the codes of the block before it (`last`), as ggml's
// reference does.
void iq4_nl(const float* x, std::uint8_t* b, std::uint8_t* last) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  float d = 0.0f;
  if (amax >= 1e-15f) {
    const float id = 1.0f / (max / static_cast<float>(kIq4nlValues[0]));
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float scaled = id * x[j];
      const int l = nearest_iq4nl(scaled);
      last[j] = static_cast<std::uint8_t>(l);
      const float q = static_cast<float>(kIq4nlValues[l]);
      const float wq = x[j] * x[j] * q;  // separate statements: each product rounded (no contraction)
      const float wqx = wq * x[j];
      const float wqq = wq * q;
      sumqx += wqx;
      sumq2 += wqq;
    }
    d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
  }
  put_f16(b, d);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<std::uint8_t>(last[j] | (last[j + 16] << 4));
}

}  // namespace

bool ggml_can_quantize(const GgmlTypeInfo& type) {
  if (fp8_format_of(type) || tq_type_of(type)) return true;
  switch (type.id) {
    case 1: case 2: case 3: case 6: case 7: case 8: case 20: return true;
    default: return false;
  }
}

void ggml_quantize(const GgmlTypeInfo& type, const float* x, std::size_t n, std::uint8_t* dst) {
  if (!ggml_can_quantize(type) || n % type.block != 0) throw std::logic_error("ggml_quantize: unsupported type or size");
  if (type.id == 1) {
    for (std::size_t i = 0; i < n; ++i) put_f16(dst + 2 * i, x[i]);
    return;
  }
  if (const auto f = fp8_format_of(type)) {
    fp8_encode_rows(x, n, 1.0f, *f, dst);
    return;
  }
  if (const auto t = tq_type_of(type)) {
    tq_encode_rows(*t, x, n / t->head_dim, dst);
    return;
  }
  std::uint8_t last[32] = {};  // IQ4_NL: codes of the previous block
  for (std::size_t i = 0; i < n / 32; ++i) {
    const float* xb = x + 32 * i;
    std::uint8_t* b = dst + type.bytes * i;
    switch (type.id) {
      case 2: q_0(xb, b, 16); break;
      case 3: q_1(xb, b, 16); break;
      case 6: q_0(xb, b, 32); break;
      case 7: q_1(xb, b, 32); break;
      case 20: iq4_nl(xb, b, last); break;
      default: q8_0(xb, b); break;
    }
  }
}

}  // namespace akv
