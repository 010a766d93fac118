#include "akv/kv/attend.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "akv/attention/decode_attention.h"

namespace akv {

void attend_layer(KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_heads, std::size_t n_kv_heads,
                  std::size_t head_dim, float* out, int threads, bool reference, AttentionMode mode, float softcap) {
  std::vector<HeadView> views;
  std::vector<std::size_t> rows;
  layer_views(cache, layer, n_kv_heads, views, rows);
  const bool want = cache.wants_probs();
  const std::size_t g = n_heads / n_kv_heads;
  std::vector<std::vector<float>> probs(want ? n_heads : 0);
  std::vector<float*> ptr(probs.size());
  for (std::size_t h = 0; h < probs.size(); ++h) {
    probs[h].resize(rows[h / g]);
    ptr[h] = probs[h].data();
  }
  DecodeAttentionArgs a{q, n_heads, head_dim, views.data(), n_kv_heads,
                        1.0f / std::sqrt(static_cast<float>(head_dim)), out, want ? ptr.data() : nullptr,
                        kKvSegments};
  a.softcap = softcap;
  if (reference) {
    decode_attention_ref(a);
    return;
  }
  decode_attention(a, {.threads = threads, .mode = mode});
  for (std::size_t h = 0; h < probs.size(); ++h) cache.observe(layer, h / g, probs[h].data());
}

void attend_layer_block(const KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_tokens,
                        std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim, float* out, int threads,
                        AttentionMode mode, float softcap, std::size_t window) {
  std::vector<HeadView> views;
  std::vector<std::size_t> rows;
  layer_views(cache, layer, n_kv_heads, views, rows);
  const std::size_t g = n_heads / n_kv_heads, d = head_dim, nq = n_tokens * g;  // query heads per KV head
  // Query head (kv, j, i): token j's head kv * g + i.
  std::vector<float> query(n_kv_heads * nq * d), result(query.size());
  std::vector<std::size_t> visible(n_kv_heads * nq), first(window ? n_kv_heads * nq : 0);
  for (std::size_t kv = 0; kv < n_kv_heads; ++kv) {
    if (rows[kv] < n_tokens) throw std::logic_error("attend_layer_block: the block's rows in the cache");
    const std::int32_t* pos = window ? cache.view(layer, kv).position : nullptr;
    for (std::size_t j = 0; j < n_tokens; ++j) {
      const std::size_t own = rows[kv] - (n_tokens - 1 - j);  // rows up to and with token j's
      // The window's first row: the first at a position > p - window.
      const std::size_t from = window ? static_cast<std::size_t>(
          std::upper_bound(pos, pos + own, static_cast<std::int64_t>(pos[own - 1]) - static_cast<std::int64_t>(window),
                           [](std::int64_t x, std::int32_t p) { return x < p; }) - pos) : 0;
      for (std::size_t i = 0; i < g; ++i) {
        const std::size_t at = (kv * n_tokens + j) * g + i;
        std::copy_n(q + (j * n_heads + kv * g + i) * d, d, query.data() + at * d);
        visible[at] = own;
        if (window) first[at] = from;
      }
    }
  }
  DecodeAttentionArgs a{query.data(), n_kv_heads * nq, d, views.data(), n_kv_heads,
                        1.0f / std::sqrt(static_cast<float>(d)), result.data(), nullptr, kKvSegments};
  a.visible = visible.data();
  if (window) a.first = first.data();
  a.softcap = softcap;
  decode_attention(a, {.threads = threads, .mode = mode});
  for (std::size_t kv = 0; kv < n_kv_heads; ++kv) {
    for (std::size_t j = 0; j < n_tokens; ++j) {
      for (std::size_t i = 0; i < g; ++i) {
        std::copy_n(result.data() + ((kv * n_tokens + j) * g + i) * d, d, out + (j * n_heads + kv * g + i) * d);
      }
    }
  }
}

}  // namespace akv
