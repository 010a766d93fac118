#include "akv/kv/windowed.h"

#include <algorithm>
#include <stdexcept>

#include "akv/tensor/half.h"

namespace akv {

WindowedCache::WindowedCache(std::unique_ptr<KvPolicy> inner, const KvShape& shape, DenseType type)
    : inner_(std::move(inner)), shape_(shape), type_(type) {
  if (shape_.layer_window.size() != shape_.n_layers) throw std::logic_error("WindowedCache: a window per layer");
  std::size_t globals = 0, locals = 0;
  for (const std::size_t w : shape_.layer_window) slot_.push_back(w ? locals++ : globals++);
  rows_.resize(locals * shape_.n_kv_heads);
}

void WindowedCache::push(std::size_t layer, std::size_t h, const float* key, const float* value, std::size_t n,
                         std::size_t pos, std::size_t newest) {
  Rows& r = rows(layer, h);
  const std::size_t hd = shape_.head_dim, w = shape_.layer_window[layer];
  if (type_ == DenseType::f32) {
    r.key.insert(r.key.end(), key, key + n * hd);
    r.value.insert(r.value.end(), value, value + n * hd);
  } else {
    const std::size_t at = r.key16.size();
    r.key16.resize(at + n * hd);
    r.value16.resize(at + n * hd);
    f32_to_f16(key, r.key16.data() + at, n * hd);
    f32_to_f16(value, r.value16.data() + at, n * hd);
  }
  for (std::size_t i = 0; i < n; ++i) r.position.push_back(static_cast<std::int32_t>(pos + i));
  while (r.first < r.position.size() && static_cast<std::size_t>(r.position[r.first]) + w <= newest) ++r.first;
  if (r.first >= std::max<std::size_t>(w, 64)) {  // compact once the dropped rows outnumber a window
    const auto drop = static_cast<std::ptrdiff_t>(r.first);
    const auto elems = static_cast<std::ptrdiff_t>(r.first * hd);
    if (type_ == DenseType::f32) {
      r.key.erase(r.key.begin(), r.key.begin() + elems);
      r.value.erase(r.value.begin(), r.value.begin() + elems);
    } else {
      r.key16.erase(r.key16.begin(), r.key16.begin() + elems);
      r.value16.erase(r.value16.begin(), r.value16.begin() + elems);
    }
    r.position.erase(r.position.begin(), r.position.begin() + drop);
    r.first = 0;
  }
}

void WindowedCache::ingest_prompt(const PromptKv& prompt) {
  split(prompt, 0, [&](const PromptKv& inner) { inner_->ingest_prompt(inner); });
}

void WindowedCache::ingest_chunk(const PromptKv& chunk, std::size_t start, ChunkPlan plan) {
  split(chunk, start, [&](const PromptKv& inner) { inner_->ingest_chunk(inner, start, plan); });
}

template <class Inner>
void WindowedCache::split(const PromptKv& prompt, std::size_t start, Inner&& to_inner) {
  const std::size_t n = prompt.n_tokens;
  TokenScores scores;
  std::vector<std::size_t> global_of;  // inner layer -> model layer
  for (std::size_t l = 0; l < shape_.n_layers; ++l) {
    if (local(l)) {
      const std::size_t keep = std::min(n, shape_.layer_window[l]);
      for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) {
        push(l, h, prompt.key[l].row(h, n - keep), prompt.value[l].row(h, n - keep), keep, start + n - keep,
             start + n - 1);
      }
      continue;
    }
    global_of.push_back(l);
    if (prompt.scores) scores.push_back((*prompt.scores)[l]);
  }
  PromptKv inner = prompt;  // the global layers' tensors, not copied
  inner.query = prompt.query.subset(global_of);
  inner.key = prompt.key.subset(global_of);
  inner.key_pre_rope = prompt.key_pre_rope.subset(global_of);
  inner.value = prompt.value.subset(global_of);
  inner.scores = prompt.scores ? &scores : nullptr;
  if (prompt.out_proj) {
    inner.out_proj = [src = prompt.out_proj, global_of](std::size_t l, RowMatrix& wo) { src(global_of[l], wo); };
  }
  to_inner(inner);
}

void WindowedCache::ingest_prompt_layer(std::size_t layer, const LayerKv& kv) {
  if (!local(layer)) {
    inner_->ingest_prompt_layer(slot_[layer], kv);
    return;
  }
  const std::size_t n = kv.key->dim1(), keep = std::min(n, shape_.layer_window[layer]);
  for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) {
    push(layer, h, kv.key->row(h, n - keep), kv.value->row(h, n - keep), keep, n - keep, n - 1);
  }
}

void WindowedCache::append(std::size_t layer, const float* key, const float* key_pre_rope, const float* value,
                           std::size_t pos) {
  if (!local(layer)) {
    inner_->append(slot_[layer], key, key_pre_rope, value, pos);
    return;
  }
  const std::size_t hd = shape_.head_dim;
  for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) push(layer, h, key + h * hd, value + h * hd, 1, pos, pos);
}

KvView WindowedCache::view(std::size_t layer, std::size_t kv_head) const {
  if (!local(layer)) return inner_->view(slot_[layer], kv_head);
  const Rows& r = rows(layer, kv_head);
  const std::size_t hd = shape_.head_dim, n = r.position.size() - r.first;
  KvView v;
  if (type_ == DenseType::f32) {
    v = dense_kv_view(r.key.data() + r.first * hd, r.value.data() + r.first * hd, r.position.data() + r.first, n);
  } else {
    v.segments[0].key.dense = {DenseType::f16, r.key16.data() + r.first * hd, n};
    v.segments[0].value.dense = {DenseType::f16, r.value16.data() + r.first * hd, n};
    v.position = r.position.data() + r.first;
    v.n = n;
  }
  return v;
}

void WindowedCache::observe(std::size_t layer, std::size_t kv_head, const float* probs) {
  if (!local(layer)) inner_->observe(slot_[layer], kv_head, probs);
}

void WindowedCache::take_query(std::size_t layer, std::size_t pos, const float* query) {
  if (!local(layer)) inner_->take_query(slot_[layer], pos, query);
}

void WindowedCache::take_input(std::size_t layer, std::size_t pos, const float* input, std::size_t dim) {
  if (!local(layer)) inner_->take_input(slot_[layer], pos, input, dim);
}

std::uint64_t WindowedCache::local_bytes(std::size_t layer) const {
  const std::uint64_t elem = type_ == DenseType::f32 ? 4 : 2;
  std::uint64_t rows_held = 0;
  for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) rows_held += rows(layer, h).position.size() - rows(layer, h).first;
  return rows_held * 2 * shape_.head_dim * elem;
}

std::uint64_t WindowedCache::bytes() const {
  std::uint64_t b = inner_->bytes();
  for (std::size_t l = 0; l < shape_.n_layers; ++l) {
    if (local(l)) b += local_bytes(l);
  }
  return b;
}

std::uint64_t WindowedCache::peak_bytes() const {
  return inner_->peak_bytes() + (bytes() - inner_->bytes());
}

std::uint64_t WindowedCache::layer_bytes(std::size_t layer) const {
  return local(layer) ? local_bytes(layer) : inner_->layer_bytes(slot_[layer]);
}

}  // namespace akv
