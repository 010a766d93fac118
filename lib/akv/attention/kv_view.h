#pragma once
// What decode attention reads for one KV head: keys and values, each a packed quantized part
// (the oldest rows) followed by a dense part (f16 or f32 rows: the residual window, the hot
// tier, or the whole cache). Rows are in chronological order; keys are post-RoPE.
//
// The packed part uses the quantizer's layout (quant/affine.h): codes in row-major element
// order as one little-endian bit stream (row r starts at bit r * cols * bits), scale/zero f16
// per group in group order (channel axis: [row / G][col]; token axis: [row][col / G]). Optional
// f16 outlier channels sit beside the codes: the codes then cover the other `cols` channels in
// ascending order. kv/stored_tensor.h's PackedTensor owns such storage and grows it row by row.
// Alternatively every row of a tensor is a run of ggml blocks (llama.cpp's cache types, method
// ggml): GgmlRowsView; or every row is KVQuant's non-uniform codes (method nuq): NuqView
// (quant/nuq.h).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/quant/affine.h"
#include "akv/quant/nuq.h"
#include "akv/quant/rotation.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv {

struct PackedView {
  int bits = 4;
  QuantAxis axis = QuantAxis::channel;
  std::size_t group = 32;
  std::size_t rows = 0, cols = 0;               // cols: quantized channels
  const std::uint8_t* codes = nullptr;          // readable kCodePadding bytes past the stream
  const std::uint16_t* scale = nullptr;         // f16 bits, group order
  const std::uint16_t* zero = nullptr;          // f16 bits
  std::size_t n_outliers = 0;                   // head_dim = cols + n_outliers
  const std::uint16_t* outlier_channel = nullptr;  // [n_outliers] ascending channel indices
  const std::uint16_t* outlier_value = nullptr;    // [rows, n_outliers] f16 bits
};

enum class DenseType { f32, f16 };

struct DenseView {
  DenseType type = DenseType::f32;
  const void* data = nullptr;  // [rows, head_dim] f32 or f16 bits
  std::size_t rows = 0;
};

// Rows of ggml blocks: row r is head_dim / type->block blocks at blocks + r * row bytes. fp8
// rows (one byte per element) are read as the code's value times `scale` (1 for ggml's types).
// `finite`: fp8 rows known to hold no Inf or NaN code (their writer checked each row as it came);
// false: not known, and attention scans each tile of e4m3 rows for NaN codes.
struct GgmlRowsView {
  const GgmlTypeInfo* type = nullptr;
  const std::uint8_t* blocks = nullptr;
  std::size_t rows = 0;
  float scale = 1.0f;
  bool finite = false;
};

struct TensorView {
  PackedView packed;  // rows [0, packed.rows)
  DenseView dense;    // rows [packed.rows, packed.rows + dense.rows)
  GgmlRowsView ggml;  // when ggml.type is set: every row (packed and dense are then empty)
  NuqView nuq;        // when nuq.table is set: every row (packed and dense are then empty)
  // Every row (packed, dense or ggml) is stored rotated: R x (quant/rotation.h).
  Rotation rotation;
  std::size_t rows() const { return ggml.type ? ggml.rows : nuq.table ? nuq.rows : packed.rows + dense.rows; }
};

// One KV head as attention reads it. key.rows() == value.rows(); the split points may differ
// (keys quantize in whole groups of tokens, values token by token).
struct HeadView {
  TensorView key, value;
  std::size_t rows() const { return key.rows(); }
};

// Bytes that must be readable past the end of a packed code stream (vector loads).
constexpr std::size_t kCodePadding = 8;

// Dequantizes rows [r0, r1) of a tensor view into out [r1 - r0, head_dim] with the quantizer's
// decode (x^ = fma(code, scale, zero); f16 rows widened exactly; nuq: nuq_decode), rotated back (R^T x^) when the
// view is rotated.
void dequantize_rows(const TensorView& t, std::size_t head_dim, std::size_t r0, std::size_t r1,
                     float* out);

}  // namespace akv
