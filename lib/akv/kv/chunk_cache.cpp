#include "akv/kv/chunk_cache.h"

#include <algorithm>
#include <stdexcept>

#include "akv/quant/rotation.h"

namespace akv {

ChunkCache::ChunkCache(std::unique_ptr<KvPolicy> inner, const KvShape& shape, ChunkPlan plan)
    : inner_(std::move(inner)), shape_(shape), plan_(plan), rows_(shape.n_layers * shape.n_kv_heads), query_(shape.n_layers) {}

void ChunkCache::ingest_prompt(const PromptKv&) {
  throw std::logic_error("ChunkCache takes the prompt chunk by chunk (append, end_chunk)");
}

void ChunkCache::append(std::size_t layer, const float* key, const float* key_pre_rope, const float* value,
                        std::size_t pos) {
  const std::size_t d = shape_.head_dim;
  if (layer == 0) {
    if (n_pending_ == 0) start_ = pos;
    if (pos != start_ + n_pending_) throw std::logic_error("ChunkCache: positions of a chunk in order");
    ++n_pending_;
  }
  for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) {
    Rows& r = rows(layer, h);
    const KvView inner = inner_->view(layer, h);
    if (r.key.empty()) r.position.assign(inner.position, inner.position + inner.n);
    r.key.insert(r.key.end(), key + h * d, key + (h + 1) * d);
    r.key_pre_rope.insert(r.key_pre_rope.end(), key_pre_rope + h * d, key_pre_rope + (h + 1) * d);
    r.value.insert(r.value.end(), value + h * d, value + (h + 1) * d);
    r.position.push_back(static_cast<std::int32_t>(pos));
    const Rotation& rk = inner.segments[0].key.rotation;
    const Rotation& rv = inner.segments[0].value.rotation;
    if (rk.active() || rv.active()) {
      r.key_shown.insert(r.key_shown.end(), key + h * d, key + (h + 1) * d);
      r.value_shown.insert(r.value_shown.end(), value + h * d, value + (h + 1) * d);
      if (rk.active()) rotate_rows(rk, r.key_shown.data() + r.key_shown.size() - d, 1, d);
      if (rv.active()) rotate_rows(rv, r.value_shown.data() + r.value_shown.size() - d, 1, d);
    }
  }
}

KvView ChunkCache::view(std::size_t layer, std::size_t kv_head) const {
  KvView v = inner_->view(layer, kv_head);
  const Rows& r = rows(layer, kv_head);
  if (r.key.empty()) return v;
  // The chunk's rows follow the method's: in the segment after its last non-empty one.
  std::size_t free = 0;
  for (std::size_t s = 0; s < kKvSegments; ++s) {
    if (v.segments[s].key.rows() > 0 || v.segments[s].value.rows() > 0) free = s + 1;
  }
  if (free == kKvSegments) throw std::logic_error("ChunkCache: the method's view leaves no segment for the chunk");
  const std::size_t n = r.key.size() / shape_.head_dim;
  const bool rotated = !r.key_shown.empty();
  HeadView chunk;
  chunk.key.dense = {DenseType::f32, rotated ? r.key_shown.data() : r.key.data(), n};
  chunk.value.dense = {DenseType::f32, rotated ? r.value_shown.data() : r.value.data(), n};
  chunk.key.rotation = v.segments[0].key.rotation;
  chunk.value.rotation = v.segments[0].value.rotation;
  v.segments[free] = chunk;
  v.position = r.position.data();
  v.n += n;
  return v;
}

void ChunkCache::take_query(std::size_t layer, std::size_t, const float* query) {
  const std::size_t nq = shape_.n_heads * shape_.head_dim;
  query_[layer].insert(query_[layer].end(), query, query + nq);
}

std::uint64_t ChunkCache::layer_bytes(std::size_t layer) const {
  std::uint64_t b = inner_->layer_bytes(layer);
  for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) b += 4 * (rows(layer, h).key.size() + rows(layer, h).value.size());
  return b;
}

std::uint64_t ChunkCache::bytes() const {
  std::uint64_t b = inner_->bytes();
  for (const Rows& r : rows_) b += 4 * (r.key.size() + r.value.size());
  return b;
}

void ChunkCache::end_chunk() {
  if (n_pending_ == 0) return;
  const std::size_t L = shape_.n_layers, H = shape_.n_kv_heads, d = shape_.head_dim, n = n_pending_;
  const bool queries = inner_->wants_queries();
  std::vector<Tensor3> query(L), key(L), key_pre(L), value(L);
  for (std::size_t l = 0; l < L; ++l) {
    if (queries) {
      if (query_[l].size() != n * shape_.n_heads * d) throw std::logic_error("ChunkCache: a query per chunk token");
      query[l] = Tensor3(shape_.n_heads, n, d);
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t h = 0; h < shape_.n_heads; ++h) {
          std::copy_n(query_[l].data() + (t * shape_.n_heads + h) * d, d, query[l].row(h, t));
        }
      }
    }
    key[l] = Tensor3(H, n, d);
    key_pre[l] = Tensor3(H, n, d);
    value[l] = Tensor3(H, n, d);
    for (std::size_t h = 0; h < H; ++h) {
      const Rows& r = rows(l, h);
      std::copy(r.key.begin(), r.key.end(), key[l].row(h, 0));
      std::copy(r.key_pre_rope.begin(), r.key_pre_rope.end(), key_pre[l].row(h, 0));
      std::copy(r.value.begin(), r.value.end(), value[l].row(h, 0));
    }
  }
  for (Rows& r : rows_) r = Rows{};
  for (auto& q : query_) q.clear();
  const std::size_t start = start_;
  n_pending_ = 0;
  inner_->ingest_chunk({&query, &key, &key_pre, &value, n, nullptr}, start, plan_);
}

}  // namespace akv
