#pragma once
// The narrow interface between the model's attention and a KV-cache method (full, quantized,
// evicted...). One method ingests the prompt, one appends a decoded token; attention reads rows
// through view(). Implementations: cache/kv_runtime.h.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/tensor/tensor.h"

namespace akv {

// The prompt's tensors, per layer: queries [n_heads, n, hd]; keys after and before RoPE and
// values [n_kv_heads, n, hd]. Positions 0..n-1.
struct PromptKv {
  const std::vector<Tensor3>* query = nullptr;
  const std::vector<Tensor3>* key = nullptr;
  const std::vector<Tensor3>* key_pre_rope = nullptr;
  const std::vector<Tensor3>* value = nullptr;
  std::size_t n_tokens = 0;
};

// What attention reads for one (layer, KV head): n rows in chronological order, f32.
struct KvView {
  const float* key = nullptr;            // [n, head_dim], after RoPE
  const float* value = nullptr;          // [n, head_dim]
  const std::int32_t* position = nullptr;  // [n] token positions
  std::size_t n = 0;
};

class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  // Takes the prompt (once, before any append): stores, compresses and/or evicts it.
  virtual void ingest_prompt(const PromptKv& prompt) = 0;
  // Appends one decoded token of one layer at `pos`: key, key_pre_rope, value [n_kv_heads, hd].
  virtual void append(std::size_t layer, const float* key, const float* key_pre_rope,
                      const float* value, std::size_t pos) = 0;
  // The rows attention reads now.
  virtual KvView view(std::size_t layer, std::size_t kv_head) const = 0;
  // The attention probabilities of one query head over view(layer, kv_head) rows (n of them),
  // reported after each decode step's attention; streaming eviction (H2O) scores with them.
  virtual void observe(std::size_t layer, std::size_t kv_head, const float* probs) {
    (void)layer, (void)kv_head, (void)probs;
  }
  // Called after every layer of a decode step has attended: streaming eviction happens here.
  virtual void end_step() {}
  // Bytes the cache stores now (codes, scales, zeros, f16 rows, outliers, indices).
  virtual std::uint64_t bytes() const = 0;
};

}  // namespace akv
