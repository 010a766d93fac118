#pragma once
// The stored form of one tensor (keys or values) of one head, the one type the runtime caches,
// the offline codec and the cache file hold: packed quantized rows (attention/kv_view.h's
// layout) with f16 outlier channels, then dense f16 or f32 rows (the residual window); or, for
// llama.cpp's cache types, every row a run of ggml blocks. Rows become codes or blocks in one
// place, kv/tensor_builder.h; the cache file (kv/cache_file.h) reads them back through the
// append_* calls below.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "akv/attention/kv_view.h"
#include "akv/quant/affine.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv {

// Bytes stored per component; the sum is the honest size of a cache.
struct CacheBytes {
  std::uint64_t codes = 0, scales = 0, zeros = 0, residual = 0, outliers = 0, indices = 0;
  std::uint64_t total() const { return codes + scales + zeros + residual + outliers + indices; }
  CacheBytes& operator+=(const CacheBytes& o);
  // f(name, member) for every component, by its name in reports.
  template <typename F>
  static void components(F&& f) {
    f("codes", &CacheBytes::codes), f("scales", &CacheBytes::scales), f("zeros", &CacheBytes::zeros);
    f("residual", &CacheBytes::residual), f("outliers", &CacheBytes::outliers), f("indices", &CacheBytes::indices);
  }
};

// Growable storage of one tensor (keys or values) of one head: packed rows, then dense rows.
// Dense rows move into the packed part when quantized (quantize_front).
class PackedTensor {
 public:
  PackedTensor() = default;
  // head_dim channels; dense rows stored as `dense` (f16 rounds to nearest even).
  PackedTensor(std::size_t head_dim, DenseType dense);

  // Appends n dense rows [n, head_dim].
  void append_dense(const float* rows, std::size_t n);
  // Appends a quantized block of whole groups (channel axis: block.rows a multiple of the
  // group, unless no further rows will follow) covering the channels that are not outliers;
  // outliers: f16 values [block.rows, n_outliers] of the outlier channels. The first block
  // fixes bits, axis, group and outlier channels; later blocks must match.
  void append_packed(const QuantizedBlock& block, const std::vector<std::uint16_t>& outlier_channels,
                     const std::uint16_t* outliers);
  // Appends n rows [n, head_dim] as ggml blocks of `type` (ggml's reference quantizer; head_dim
  // a multiple of its block). A tensor holds ggml rows only, of one type; F16 rows are read as
  // dense f16 rows.
  void append_ggml(const GgmlTypeInfo& type, const float* rows, std::size_t n);
  // Appends n rows of ggml blocks of `type` as stored ([n, head_dim / block, type.bytes]).
  void append_ggml_blocks(const GgmlTypeInfo& type, const std::uint8_t* blocks, std::size_t n);
  // fp8 rows (tensor/fp8.h types): every row is stored as fp8(x / scale) and read as the code's
  // value times scale; one f32 scale per tensor, set before its first row (default 1).
  void set_ggml_scale(float scale) { ggml_scale_ = scale; }
  float ggml_scale() const { return ggml_scale_; }
  // Appends n rows [n, head_dim] as KVQuant's non-uniform codes under `table` (quant/nuq.h
  // nuq_encode; head_dim a multiple of 8). A tensor holds nuq rows only, of one table (the
  // first call sets it).
  // pos [n]: the rows' positions (sink rows are those below the table's sink), null = row indices.
  void append_nuq(std::shared_ptr<const NuqTable> table, const float* rows, std::size_t n,
                  const std::int32_t* pos = nullptr);
  // nuq rows as stored (the cache file).
  void set_nuq(std::shared_ptr<const NuqTable> table, NuqRows rows);
  const NuqTable* nuq_table() const { return nuq_table_.get(); }
  const NuqRows& nuq_rows() const { return nuq_; }
  // Removes the first n dense rows (after the caller quantized them into the packed part).
  void drop_dense_front(std::size_t n);
  // Removes dense row i by moving the last dense row into its place: O(head_dim), rows lose
  // their order (eviction from an unquantized cache, which tracks positions itself).
  void swap_remove_dense(std::size_t i);
  // Keeps dense rows `rows` (ascending indices) in their order and drops the others; only for a
  // tensor whose rows are all dense (InvalidInput otherwise).
  void retain_dense(const std::vector<std::size_t>& rows);

  // Blocks in the middle (the tiered cache moves whole blocks between tiers). A packed block
  // goes in before packed row `row`, or packed rows [row, row + n) come out; both ends must sit
  // on group and byte boundaries and the tensor must have no outlier channels. Dense f16 rows
  // [n, head_dim] (f16 bits) go in before dense row `row`, or come out. InvalidInput otherwise.
  void insert_packed(std::size_t row, const QuantizedBlock& block);
  void erase_packed(std::size_t row, std::size_t n);
  void insert_dense_f16(std::size_t row, const std::uint16_t* rows, std::size_t n);
  void erase_dense(std::size_t row, std::size_t n);
  // The packed rows as one quantized block (quant/affine.h layout), without outliers.
  QuantizedBlock packed_block() const;

  std::size_t packed_rows() const { return view_.rows; }
  std::size_t dense_rows() const { return dense_rows_; }
  std::size_t ggml_rows() const { return ggml_rows_; }
  std::size_t rows() const { return view_.rows + dense_rows_ + ggml_rows_ + nuq_.rows; }
  std::size_t head_dim() const { return d_; }
  DenseType dense_type() const { return type_; }
  // The packed codes' bytes (without the padding behind them), scales and zeros (f16 bits).
  const std::uint8_t* codes() const { return codes_.data(); }
  std::size_t code_bytes() const { return (code_bits_ + 7) / 8; }
  const std::vector<std::uint16_t>& scales() const { return scale_; }
  const std::vector<std::uint16_t>& zeros() const { return zero_; }
  const PackedView& packed_params() const { return view_; }  // bits, axis, group, cols, rows
  const std::vector<std::uint16_t>& outlier_channels() const { return outlier_channel_; }
  const std::vector<std::uint16_t>& outlier_values() const { return outlier_value_; }  // [packed rows, n]
  const GgmlTypeInfo* ggml_type() const { return ggml_type_; }
  const std::vector<std::uint8_t>& ggml_blocks() const { return ggml_blocks_; }  // [rows, blocks per row, bytes]
  const float* dense_f32(std::size_t row) const;  // f32 storage only
  const std::uint16_t* dense_f16(std::size_t row) const;  // f16 storage only
  // Keys quantized before RoPE: the packed rows and outliers hold pre-RoPE keys (rotated after
  // dequantization); the dense rows are always post-RoPE.
  bool pre_rope() const { return pre_rope_; }
  void set_pre_rope(bool pre_rope) { pre_rope_ = pre_rope; }
  // Every row is stored rotated (quant/rotation.h): R x for a row x the caller gave.
  const Rotation& rotation() const { return rotation_; }
  void set_rotation(const Rotation& r) { rotation_ = r; }
  // Bytes the cache format stores per component: packed codes and ggml blocks, scales (fp8: the
  // tensor's f32 scale), zeros, outlier values and channel indices, dense rows (f16: 2 bytes, f32:
  // 4 bytes per value). nuq rows: codes; scales = the table (levels, key thresholds) and values'
  // per-row offset and range; residual = the sink rows; outliers and indices = the sparse
  // outliers, their channels and per-row counts (NuqRows).
  CacheBytes stored_bytes() const;
  std::uint64_t bytes() const { return stored_bytes().total(); }
  TensorView view() const;

 private:
  // fp8 rows [n] written at byte `at` of ggml_blocks_: clears ggml_finite_ if one holds an Inf or
  // NaN code.
  void note_fp8_rows(const GgmlTypeInfo& type, std::size_t at, std::size_t n);
  void take_parameters(const QuantizedBlock& b);  // bits, axis, group, cols of the first block
  std::size_t d_ = 0;
  DenseType type_ = DenseType::f32;
  bool pre_rope_ = false;
  Rotation rotation_;
  PackedView view_;  // parameters; pointers refreshed by view()
  std::size_t code_bits_ = 0;  // bits used in codes_
  std::vector<std::uint8_t> codes_;
  std::vector<std::uint16_t> scale_, zero_, outlier_channel_, outlier_value_;
  // Dense rows live at [front_, front_ + dense_rows_) of dense32_ / dense16_: rows dropped from
  // the front (quantized) stay until they are as many as the live ones, then one move compacts
  // them, so a row quantized per decode step costs O(1) amortized instead of moving the window.
  template <typename T>
  void compact(std::vector<T>& rows);
  std::vector<float> dense32_;
  std::vector<std::uint16_t> dense16_;
  std::size_t front_ = 0;
  std::size_t dense_rows_ = 0;
  const GgmlTypeInfo* ggml_type_ = nullptr;
  float ggml_scale_ = 1.0f;
  bool ggml_finite_ = true;  // fp8 rows: no Inf or NaN code among them (GgmlRowsView::finite)
  std::vector<std::uint8_t> ggml_blocks_;
  std::size_t ggml_rows_ = 0;
  std::shared_ptr<const NuqTable> nuq_table_;
  NuqRows nuq_;
};

}  // namespace akv
