#include "akv/attention/kv_view.h"

#include <algorithm>
#include <cmath>

#include "akv/core/checked.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

// Code i of a little-endian b-bit stream.
unsigned code_at(const std::uint8_t* stream, std::size_t i, int bits) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  const unsigned w = stream[bit / 8] | (static_cast<unsigned>(stream[bit / 8 + 1]) << 8);
  return (w >> (bit % 8)) & ((1u << bits) - 1u);
}

// dequantize_rows's rows as stored (rotated ones not rotated back).
void dequantize_stored_rows(const TensorView& t, std::size_t head_dim, std::size_t r0, std::size_t r1,
                            float* out) {
  if (const GgmlTypeInfo* type = t.ggml.type) {
    const std::size_t row_bytes = head_dim / type->block * type->bytes;
    ggml_dequantize_scaled(*type, t.ggml.blocks + r0 * row_bytes, (r1 - r0) * head_dim, t.ggml.scale, out);
    return;
  }
  if (t.nuq.table) {
    nuq_decode(t.nuq, head_dim, r0, r1, out);
    return;
  }
  const PackedView& p = t.packed;
  const std::size_t per_row = p.cols ? ceil_div(p.cols, p.group) : 0;
  for (std::size_t r = r0; r < r1; ++r, out += head_dim) {
    if (r < p.rows) {
      for (std::size_t c = 0, a = 0, o = 0; c < head_dim; ++c) {
        if (o < p.n_outliers && p.outlier_channel[o] == c) {
          out[c] = f16_to_f32_ref(p.outlier_value[r * p.n_outliers + o]);
          ++o;
          continue;
        }
        const std::size_t g = p.axis == QuantAxis::channel ? (r / p.group) * p.cols + a
                                                           : r * per_row + a / p.group;
        const float code = static_cast<float>(code_at(p.codes, r * p.cols + a, p.bits));
        out[c] = std::fma(code, f16_to_f32_ref(p.scale[g]), f16_to_f32_ref(p.zero[g]));
        ++a;
      }
    } else {
      const std::size_t i = (r - p.rows) * head_dim;
      if (t.dense.type == DenseType::f32) {
        const float* src = static_cast<const float*>(t.dense.data) + i;
        std::copy(src, src + head_dim, out);
      } else {
        const std::uint16_t* src = static_cast<const std::uint16_t*>(t.dense.data) + i;
        for (std::size_t c = 0; c < head_dim; ++c) out[c] = f16_to_f32_ref(src[c]);
      }
    }
  }
}

}  // namespace

void dequantize_rows(const TensorView& t, std::size_t head_dim, std::size_t r0, std::size_t r1,
                     float* out) {
  dequantize_stored_rows(t, head_dim, r0, r1, out);
  unrotate_rows(t.rotation, out, r1 - r0, head_dim);
}

}  // namespace akv
