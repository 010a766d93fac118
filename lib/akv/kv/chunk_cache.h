#pragma once
// The chunked prompt protocol's cache (--prefill-mode chunked:N, eval/lanes.h): wraps a method's
// cache while a chunk of prompt tokens runs through the model (Model::decode_lanes with the
// chunk as known tokens). The chunk's rows are held here in f32 beside the method's rows, which
// do not change during the chunk, so each chunk query attends to the compressed earlier chunks
// and exactly to the chunk's rows up to its own (appended before its attention). end_chunk()
// hands the chunk - its queries, keys before and after RoPE and values - to the method
// (KvPolicy::ingest_chunk), which compresses it. Rows of a rotated method (quant/rotation.h) are
// shown to attention rotated as the method's own rows are.
#include <cstdint>
#include <memory>
#include <vector>

#include "akv/kv/policy.h"
#include "akv/tensor/kv_shape.h"

namespace akv {

class ChunkCache : public KvPolicy {
 public:
  // `plan`: how end_chunk has the method compress each chunk (KvPolicy::ingest_chunk).
  ChunkCache(std::unique_ptr<KvPolicy> inner, const KvShape& shape, ChunkPlan plan = ChunkPlan::alone);

  // The prompt comes in chunks: logic_error.
  void ingest_prompt(const PromptKv& prompt) override;
  void append(std::size_t layer, const float* key, const float* key_pre_rope, const float* value,
              std::size_t pos) override;
  KvView view(std::size_t layer, std::size_t kv_head) const override;
  bool wants_queries() const override { return inner_->wants_queries(); }
  void take_query(std::size_t layer, std::size_t pos, const float* query) override;
  // The method's bytes plus the chunk's rows as held here (f32 keys and values).
  std::uint64_t bytes() const override;
  bool layer_local() const override { return true; }
  // The chunk's rows are held here in f32, after the method's (which do not change during it).
  bool appends_in_place() const override { return true; }
  // A windowed method cache (kv/windowed.h) keeps the local layers' windows between chunks; the
  // chunk's queries attend within them (attend_layer_block's window).
  bool holds_windows() const override { return inner_->holds_windows(); }
  std::uint64_t layer_bytes(std::size_t layer) const override;

  // Tokens of the chunk held now.
  std::size_t pending() const { return n_pending_; }
  // The KV bytes resident now: the method's and the chunk's (f32 keys and values): bytes().
  // Hands the held chunk to the method (nothing when none is held) and empties it.
  void end_chunk();
  // The method's cache (after the last end_chunk).
  std::unique_ptr<KvPolicy> release() { return std::move(inner_); }

 private:
  struct Rows {
    std::vector<float> key, key_pre_rope, value;  // [tokens, hd], as appended
    std::vector<float> key_shown, value_shown;    // rotated copies for attention (rotated methods)
    std::vector<std::int32_t> position;           // the method's positions, then the chunk's
  };
  Rows& rows(std::size_t layer, std::size_t kv_head) { return rows_[layer * shape_.n_kv_heads + kv_head]; }
  const Rows& rows(std::size_t layer, std::size_t kv_head) const { return rows_[layer * shape_.n_kv_heads + kv_head]; }

  std::unique_ptr<KvPolicy> inner_;
  KvShape shape_;
  ChunkPlan plan_;
  std::vector<Rows> rows_;                   // [layer * n_kv_heads + head]
  std::vector<std::vector<float>> query_;    // [layer]: [tokens, n_heads * hd]
  std::size_t start_ = 0, n_pending_ = 0;    // the chunk's first position and its tokens
};

}  // namespace akv
