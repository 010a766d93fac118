#include "akv/kv/attend.h"

#include <cmath>
#include <vector>

#include "akv/attention/decode_attention.h"

namespace akv {

void attend_layer(KvPolicy& cache, std::size_t layer, const float* q, std::size_t n_heads, std::size_t n_kv_heads,
                  std::size_t head_dim, float* out, int threads, bool reference, AttentionMode mode) {
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
  const DecodeAttentionArgs a{q, n_heads, head_dim, views.data(), n_kv_heads,
                              1.0f / std::sqrt(static_cast<float>(head_dim)), out, want ? ptr.data() : nullptr,
                              kKvSegments};
  if (reference) {
    decode_attention_ref(a);
    return;
  }
  DecodeAttentionOptions o;
  o.threads = threads;
  o.mode = mode;
  decode_attention(a, o);
  for (std::size_t h = 0; h < probs.size(); ++h) cache.observe(layer, h / g, probs[h].data());
}

}  // namespace akv
