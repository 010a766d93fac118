#pragma once
// The one place where rows of one tensor (keys or values) of one head become what a cache
// stores: dense rows, affine codes (KIVI family) with an f16 residual window and f16 outlier
// channels, or ggml blocks. The offline codec (kv/stored_head.h compress_head), the runtime
// caches (kv/runtime.h, kv/ggml_cache.h) and the attention benchmark all build through it, so a
// prompt fed at once stores what `akv compress` writes by construction.
//
// Affine rows enter the f16 residual window and are quantized as soon as quantized_rows()
// (quant/quant_params.h) says so: per-channel keys in whole groups, per-token rows one by one
// (or all at once when a whole prompt is appended). The f32 rows of the window wait here as the
// quantization source.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/kv/stored_tensor.h"
#include "akv/quant/quant_params.h"
#include "akv/tensor/rope.h"

namespace akv {

// The scale of an fp8 tensor whose largest magnitude is amax: amax / fp8_max, so the largest
// value maps to the format's largest finite one (1 when amax is 0 or not finite).
float fp8_scale_for(float amax, Fp8Format f);

// Keys quantized before RoPE are rotated back after dequantization with this table.
struct RopeContext {
  RopeLayout layout = RopeLayout::rotate_half;
  const RopeTable* table = nullptr;
};

class TensorBuilder;

// The builder of a head's key (key = true) or value tensor under its parameters p: nuq codes,
// the cache type of p.key.type / p.value.type (rotated by its own suffix, else as p.rotate says,
// kv/ggml_cache.h ggml_rotation), or affine codes of the quantizer (keys with
// outlier_count(p.outlier_fraction) f16 channels when quantized, pre-RoPE with p.pre_rope).
TensorBuilder head_tensor_builder(std::size_t head_dim, const QuantParams& p, bool key, const RopeContext* rope);

class TensorBuilder {
 public:
  // Dense rows only: f32 (the exact cache) or f16 (quantizer none, streaming eviction).
  TensorBuilder(std::size_t head_dim, DenseType dense);
  // Affine codes of `t` under p's rule and residual window (p.quantized(); otherwise dense f16
  // rows), with n_outlier channels in f16 (chosen over the first rows quantized). pre_rope: the
  // `src` rows of append() are keys before RoPE; with `rope` the builder also keeps the post-RoPE
  // f32 rows attention reads (dequantized rows rotated back), not counted as stored. rot: every
  // row (quantized or in the window) is stored rotated (QuantParams::rotation; not with
  // pre_rope).
  TensorBuilder(std::size_t head_dim, const TensorQuant& t, const QuantParams& p, std::size_t n_outlier,
                bool pre_rope, const RopeContext* rope, const Rotation& rot);
  // Every row as KVQuant's non-uniform codes under `table` (quant/nuq.h), at once; pre_rope and
  // rope as above.
  TensorBuilder(std::size_t head_dim, std::shared_ptr<const NuqTable> table, bool pre_rope, const RopeContext* rope);
  // Every row as ggml blocks of `type` (ggml's reference quantizer), at once, rotated by rot.
  // fp8 types store x / scale: the scale is set_scale's, or else fixed by the first rows
  // appended, fp8_scale_for(max |stored row value|) (later rows beyond it saturate).
  TensorBuilder(std::size_t head_dim, const GgmlTypeInfo& type, const Rotation& rot);
  // fp8: the tensor's scale, before the first row.
  void set_scale(float scale);
  // max |x| over the rows as this builder would store them (rotated), for a scale shared by
  // several tensors (method fp8 with scale=tensor).
  float stored_amax(const float* rows, std::size_t n) const;

  // Appends n rows: `src` [n, head_dim] is what gets quantized (pre-RoPE keys with pre_rope),
  // `post` [n, head_dim] what is stored dense and what attention reads; `pos` their positions
  // (RoPE after dequantization of pre-RoPE keys). A rotating builder rotates copies of them.
  void append(const float* src, const float* post, const std::int32_t* pos, std::size_t n);
  // Removes row i, moving the last row into its place (streaming eviction; dense rows only):
  // O(head_dim) instead of moving every later row.
  void swap_remove(std::size_t i);
  // Keeps rows `rows` (ascending) in order, drops the rest (decode-time compression; dense rows
  // only).
  void retain(const std::vector<std::size_t>& rows);

  std::size_t rows() const { return store_.rows(); }
  TensorView view() const;  // pre-RoPE keys: their post-RoPE f32 rows (needs `rope`)
  std::uint64_t bytes() const { return store_.bytes(); }
  const PackedTensor& stored() const { return store_; }
  // Codes hold pre-RoPE keys.
  bool pre_rope() const { return pre_rope_ && (store_.packed_rows() > 0 || store_.nuq_rows().rows > 0); }
  // The stored tensor (its pre_rope flag set as pre_rope() says), moved out: the builder is
  // spent.
  PackedTensor take();

 private:
  // Quantizes m rows `src` [m, head_dim] at positions `pos` into the packed part (their dense
  // rows, if any, are the caller's to drop).
  void quantize(const float* src, const std::int32_t* pos, std::size_t m);
  void quantize_ready();  // the window's rows due for quantization
  void append_rows(const float* src, const float* post, const std::int32_t* pos, std::size_t n);

  std::size_t d_;
  bool quantize_ = false;
  TensorQuant t_;
  QuantParams p_;
  std::size_t n_out_ = 0;
  bool pre_rope_ = false;
  const RopeContext* rope_ = nullptr;
  const GgmlTypeInfo* ggml_ = nullptr;
  std::shared_ptr<const NuqTable> nuq_;  // nuq: every row coded at once under this table
  bool scale_set_ = false;
  Rotation rot_;
  std::vector<float> rotated_;  // scratch: the rows of one append() rotated
  PackedTensor store_;
  std::vector<float> mirror_;   // pre-RoPE keys with rope: [rows, d] post-RoPE rows attention reads
  std::vector<float> pending_;  // [pending_front_ + rows - packed, d] quantization source of unquantized rows
  std::vector<std::int32_t> positions_;  // positions of the pending rows (from pending_front_ on)
  std::size_t pending_front_ = 0;        // rows at the front of pending_ already quantized
  std::vector<std::uint16_t> outliers_;  // outlier channels, fixed by the first rows quantized
};

}  // namespace akv
