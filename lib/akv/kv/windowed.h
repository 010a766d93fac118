#pragma once
// The cache of a model with sliding-window layers (Gemma 2 and 3's local layers, KvShape::layer_window):
// a local layer of window w keeps only the rows attention reads - after the token at position p is
// appended, positions p - w + 1 .. p - as dense rows in the method's row type (f32 for the exact
// cache, f16 for every method: local layers are left uncompressed, as engines keep them, and their
// bytes, bounded by the window, are counted). The method's own cache holds the global layers,
// renumbered 0, 1, ... in order, so its budgets, allocators and bytes are over the global layers
// only. Every KvPolicy call on a global layer goes to the method with the layer renumbered.
#include <cstdint>
#include <memory>
#include <vector>

#include "akv/kv/policy.h"
#include "akv/tensor/kv_shape.h"

namespace akv {

class WindowedCache : public KvPolicy {
 public:
  // `inner`: the method's cache over the global layers (those of shape.layer_window's zeros);
  // shape: the model's, with a window (or 0: global) per layer; `type`: the local layers' rows
  // (DenseType::f32 or f16).
  WindowedCache(std::unique_ptr<KvPolicy> inner, const KvShape& shape, DenseType type);

  void ingest_prompt(const PromptKv& prompt) override;
  void append(std::size_t layer, const float* key, const float* key_pre_rope, const float* value,
              std::size_t pos) override;
  KvView view(std::size_t layer, std::size_t kv_head) const override;
  bool wants_probs() const override { return inner_->wants_probs(); }
  void observe(std::size_t layer, std::size_t kv_head, const float* probs) override;
  void end_step() override { inner_->end_step(); }
  bool wants_queries() const override { return inner_->wants_queries(); }
  void take_query(std::size_t layer, std::size_t pos, const float* query) override;
  bool wants_inputs() const override { return inner_->wants_inputs(); }
  void take_input(std::size_t layer, std::size_t pos, const float* input, std::size_t dim) override;
  bool takes_prompt_layers() const override { return inner_->takes_prompt_layers(); }
  void ingest_prompt_layer(std::size_t layer, const LayerKv& kv) override;
  // The chunked prompt protocol (kv/chunk_cache.h wraps this cache): the local layers keep the
  // chunk's rows within their window, the method takes the global layers' chunk.
  void ingest_chunk(const PromptKv& chunk, std::size_t start, ChunkPlan plan) override;
  // The method's bytes plus the local layers' rows.
  std::uint64_t bytes() const override;
  std::uint64_t peak_bytes() const override;
  bool layer_local() const override { return inner_->layer_local(); }
  std::uint64_t layer_bytes(std::size_t layer) const override;
  std::optional<TierBytes> tier_bytes() const override { return inner_->tier_bytes(); }
  bool holds_windows() const override { return true; }

  // The method's cache over the global layers.
  const KvPolicy& inner() const { return *inner_; }

 private:
  struct Rows {
    std::vector<float> key, value;            // f32 rows [n, hd] (type f32)
    std::vector<std::uint16_t> key16, value16;  // f16 rows (type f16)
    std::vector<std::int32_t> position;
    std::size_t first = 0;  // rows before it have left the window
  };
  bool local(std::size_t layer) const { return shape_.layer_window[layer] != 0; }
  Rows& rows(std::size_t layer, std::size_t h) { return rows_[slot_[layer] * shape_.n_kv_heads + h]; }
  const Rows& rows(std::size_t layer, std::size_t h) const { return rows_[slot_[layer] * shape_.n_kv_heads + h]; }
  // Appends n rows [n, hd] at positions pos.. of a local layer's head, then drops what left the
  // window of position `newest`.
  void push(std::size_t layer, std::size_t h, const float* key, const float* value, std::size_t n, std::size_t pos,
            std::size_t newest);
  std::uint64_t local_bytes(std::size_t layer) const;
  // The prompt (or a chunk of it at positions start..): the local layers' window rows pushed, the
  // global layers' tensors handed to `to_inner` as the inner cache's PromptKv.
  template <class Inner>
  void split(const PromptKv& prompt, std::size_t start, Inner&& to_inner);

  std::unique_ptr<KvPolicy> inner_;
  KvShape shape_;
  std::vector<std::size_t> slot_;    // per layer: its index among the global layers or the local ones
  DenseType type_;
  std::vector<Rows> rows_;           // [local slot * n_kv_heads + head]
};

}  // namespace akv
