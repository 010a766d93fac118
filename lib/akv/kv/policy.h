#pragma once
// The narrow interface between the model's attention and a KV-cache method (full, quantized,
// evicted...). One method ingests the prompt, one appends a decoded token; attention reads rows
// through view(), as the packed/dense segments the fused decode attention reads
// (attention/decode_attention.h). Implementations: kv/runtime.h.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "akv/attention/kv_view.h"
#include "akv/score/critical.h"
#include "akv/score/kvzip.h"
#include "akv/tensor/tensor.h"

namespace akv {

// One kind of a prompt's tensors, a tensor per layer, without a copy: every layer of a model's
// (from its vector) or some of them (subset: a windowed model's global layers). False when not
// given (made from nullptr, or a subset of such).
class LayerTensors {
 public:
  LayerTensors() = default;
  LayerTensors(const std::vector<Tensor3>* all) : given_(all != nullptr) {  // NOLINT: implicit, as the pointer it stands for
    if (all) {
      for (const Tensor3& t : *all) layers_.push_back(&t);
    }
  }
  // Layers[i] of this list as its layer i.
  LayerTensors subset(const std::vector<std::size_t>& layers) const {
    LayerTensors out;
    out.given_ = given_;
    if (given_) {
      for (const std::size_t l : layers) out.layers_.push_back(layers_[l]);
    }
    return out;
  }
  const Tensor3& operator[](std::size_t l) const { return *layers_[l]; }
  std::size_t size() const { return layers_.size(); }
  explicit operator bool() const { return given_; }

 private:
  std::vector<const Tensor3*> layers_;
  bool given_ = false;
};

// The prompt's tensors, per layer: queries [n_heads, n, hd]; keys after and before RoPE and
// values [n_kv_heads, n, hd]. Positions 0..n-1. `scores`: what the model computed for a method
// whose scores it alone can compute (kvzip, eval/kvzip.h), else nullptr.
struct PromptKv {
  LayerTensors query;
  LayerTensors key;
  LayerTensors key_pre_rope;
  LayerTensors value;
  std::size_t n_tokens = 0;
  const TokenScores* scores = nullptr;
  OutProjSource out_proj = {};  // each layer's W_o (CriticalKV), when the model is at hand
};

// One layer of a prompt [n_kv_heads, n, hd]: keys after RoPE, keys before RoPE (nullptr when
// not at hand: only pre-RoPE quantization reads them) and values; `query`, for a cache that
// plans eviction a layer at a time, the layer's queries [n_heads, r, hd] at the last r
// positions (r >= prompt_query_rows of its method, kv/runtime.h); `scores`, for such a cache
// whose score the model computes (kvzap, from the layer's attention inputs), the layer's
// [n_kv_heads][n] (the layer of PromptKv::scores).
struct LayerKv {
  const Tensor3* key = nullptr;
  const Tensor3* key_pre_rope = nullptr;
  const Tensor3* value = nullptr;
  const Tensor3* query = nullptr;
  const std::vector<std::vector<double>>* scores = nullptr;
};

// How one-shot eviction compresses a chunk of the prompt (KvPolicy::ingest_chunk): the chunk
// alone to budget x its tokens (kvpress's ChunkPress), or the whole cache, earlier chunks' kept
// rows and the chunk's, back to budget x the tokens so far (chunked:N:replan, eval/lanes.h).
enum class ChunkPlan { alone, whole };

struct PromptPlan;  // kv/prompt_plan.h
struct HeadCache;   // kv/stored_head.h

// What attention reads for one (layer, KV head): n rows (keys after RoPE) as up to
// kKvSegments consecutive views (one per storage tier; unused ones empty), and the token
// position of each row in that order. Within a segment rows are chronological.
constexpr std::size_t kKvSegments = 3;
struct KvView {
  std::array<HeadView, kKvSegments> segments{};
  const std::int32_t* position = nullptr;  // [n]
  std::size_t n = 0;
};

// A view of n dense f32 rows (keys [n, hd] after RoPE, values [n, hd]).
inline KvView dense_kv_view(const float* key, const float* value, const std::int32_t* position,
                            std::size_t n) {
  KvView v;
  v.segments[0].key.dense = {DenseType::f32, key, n};
  v.segments[0].value.dense = {DenseType::f32, value, n};
  v.position = position;
  v.n = n;
  return v;
}

// Bytes per storage tier (tiered caches): device = hot + warm, host = cold.
struct TierBytes {
  std::uint64_t hot = 0, warm = 0, cold = 0;
  std::size_t hot_tokens = 0, warm_tokens = 0, cold_tokens = 0;
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
  // Whether observe() uses the attention probabilities (the model computes them only then).
  virtual bool wants_probs() const { return false; }
  // The attention probabilities of one query head over view(layer, kv_head) rows (n of them),
  // reported after each decode step's attention; streaming eviction (H2O) scores with them.
  virtual void observe(std::size_t layer, std::size_t kv_head, const float* probs) {
    (void)layer, (void)kv_head, (void)probs;
  }
  // Called after every layer of a decode step has attended: streaming eviction happens here.
  virtual void end_step() {}
  // Whether the model hands each decoded token's queries to take_query (before its attention).
  virtual bool wants_queries() const { return false; }
  // One token's queries of one layer at `pos` [n_heads, hd], after RoPE.
  virtual void take_query(std::size_t layer, std::size_t pos, const float* query) {
    (void)layer, (void)pos, (void)query;
  }
  // Whether the model hands each decoded token's attention input to take_input (before append).
  virtual bool wants_inputs() const { return false; }
  // One token's attention input of one layer at `pos` [dim]: the RMS-normed hidden state the
  // layer's Q/K/V projections read (what kvzap's surrogate scores).
  virtual void take_input(std::size_t layer, std::size_t pos, const float* input, std::size_t dim) {
    (void)layer, (void)pos, (void)input, (void)dim;
  }
  // Whether the cache takes the prompt a layer at a time (ingest_prompt_layer for every layer,
  // in order, instead of ingest_prompt; the same cache results): caches that decide nothing over
  // the whole prompt (quantizers, ggml types) and one-shot eviction whose allocator splits each
  // layer's budget on its own (allocates_per_layer, alloc/eviction.h), so a prefill can drop each layer
  // once stored.
  virtual bool takes_prompt_layers() const { return false; }
  // One layer of the prompt [n_kv_heads, n, hd] (keys after RoPE, before RoPE, values; queries
  // for eviction) at positions 0..n-1. logic_error for a cache that does not take layers.
  virtual void ingest_prompt_layer(std::size_t layer, const LayerKv& kv);
  // Takes the prompt's tokens at positions start .. start + chunk.n_tokens - 1 (the chunked
  // prompt protocol, eval/lanes.h; chunks in order, start 0 first, before any append) and
  // compresses them as the method does. Default: the first chunk as ingest_prompt, later ones
  // appended row by row as decoded tokens (caches whose layer_local() is true; logic_error
  // otherwise). One-shot eviction (kv/runtime.h) plans each chunk alone (ChunkPlan::alone) or
  // keeps the chunk's rows and cuts the whole cache back (ChunkPlan::whole).
  virtual void ingest_chunk(const PromptKv& chunk, std::size_t start, ChunkPlan plan);
  // Bytes the cache stores now (codes, scales, zeros, f16 rows, outliers, indices).
  virtual std::uint64_t bytes() const = 0;
  // The most bytes() has been since the cache was made, where the cache sees it: caches that
  // shrink inside a step (streaming eviction, decode-time compression) count the step's rows
  // before they evict; the others report bytes() (callers sample it after each step).
  virtual std::uint64_t peak_bytes() const { return bytes(); }
  // Whether a row appended stays as appended, after the rows already held, until the step ends
  // (no quantization, eviction or reordering on append): then a lane of several known tokens may
  // append them all and attend together (attend_layer_block), each to the rows up to its own.
  // The chunked prompt protocol's cache (kv/chunk_cache.h).
  virtual bool appends_in_place() const { return false; }
  // Whether each layer's rows depend only on that layer's own appends, and observe() and
  // end_step() do nothing: then a model may run several known tokens of a sequence layer by
  // layer (Model::decode_lanes) and the cache ends up as after one step at a time.
  virtual bool layer_local() const { return false; }
  // The part of bytes() that one layer stores (caches whose layer_local() is true; bytes() is
  // the sum over layers).
  virtual std::uint64_t layer_bytes(std::size_t layer) const {
    (void)layer;
    throw std::logic_error("layer_bytes of a cache that is not layer-local");
  }
  // Per-tier bytes and tokens summed over layers and heads (tiered caches only).
  virtual std::optional<TierBytes> tier_bytes() const { return std::nullopt; }
  // Whether the cache keeps each sliding-window layer to its window (kv/windowed.h): a model with
  // such layers decodes only through one.
  virtual bool holds_windows() const { return false; }

  // akv compress (kv/compress.h) feeds a dump through the method's own cache (make_stored_cache
  // in kv/runtime.h), a layer at a time: the prompt's plan is made once over the dump; each
  // layer's rows are stored as ingest_prompt stores them (the plan's kept positions and per-head
  // parameters) and taken out as the cache file's heads, which releases them. The tiered cache
  // is simulated over the dump's positions instead (kv/tiered.h TieredStream): it throws.
  virtual void ingest_layer(std::size_t layer, const LayerKv& kv, const PromptPlan& plan);
  virtual HeadCache take_head(std::size_t layer, std::size_t head);
};

// The attention input of one layer: every KV head's kKvSegments views, in head order (the
// `heads` argument of decode_attention with segments = kKvSegments), and each head's row count.
inline void layer_views(const KvPolicy& cache, std::size_t layer, std::size_t n_kv_heads,
                        std::vector<HeadView>& views, std::vector<std::size_t>& rows) {
  views.clear();
  rows.clear();
  for (std::size_t h = 0; h < n_kv_heads; ++h) {
    const KvView v = cache.view(layer, h);
    views.insert(views.end(), v.segments.begin(), v.segments.end());
    rows.push_back(v.n);
  }
}

}  // namespace akv
