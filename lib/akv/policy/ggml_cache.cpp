#include "akv/policy/ggml_cache.h"

#include <vector>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/tensor/ggml_quant.h"

namespace akv {
namespace {

// One KV head of one layer: the blocks as stored and their dequantized rows.
struct HeadStore {
  std::vector<std::uint8_t> key_blocks, value_blocks;
  std::vector<float> key, value;  // [n, hd] dequantized
  std::vector<std::int32_t> position;
};

class GgmlCachePolicy : public KvPolicy {
 public:
  GgmlCachePolicy(const GgmlCacheParams& p, const KvGeometry& g, int threads)
      : k_(ggml_cache_type(p.key, "", "k")), v_(ggml_cache_type(p.value, "", "v")), g_(g), threads_(threads),
        heads_(g.n_layers * g.n_kv_heads) {
    for (const GgmlTypeInfo* t : {&k_, &v_}) {
      if (g.head_dim % t->block != 0) {
        throw InvalidInput("head_dim must be a multiple of the cache type's block (" + std::to_string(t->block) + ")",
                           {"", std::string("ggml ") + (t == &k_ ? "k=" + p.key : "v=" + p.value) + ": head_dim",
                            std::to_string(g.head_dim)});
      }
    }
  }

  void ingest_prompt(const PromptKv& prompt) override {
    parallel_for(heads_.size(), threads_, [&](std::size_t i) {
      const std::size_t l = i / g_.n_kv_heads, h = i % g_.n_kv_heads;
      const Tensor3& key = (*prompt.key)[l];
      const Tensor3& value = (*prompt.value)[l];
      for (std::size_t t = 0; t < prompt.n_tokens; ++t) add(heads_[i], key.row(h, t), value.row(h, t), t);
    });
  }

  void append(std::size_t layer, const float* key, const float*, const float* value, std::size_t pos) override {
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      add(heads_[layer * g_.n_kv_heads + h], key + h * g_.head_dim, value + h * g_.head_dim, pos);
    }
  }

  KvView view(std::size_t layer, std::size_t kv_head) const override {
    const HeadStore& s = heads_[layer * g_.n_kv_heads + kv_head];
    return dense_kv_view(s.key.data(), s.value.data(), s.position.data(), s.position.size());
  }

  std::uint64_t bytes() const override {
    std::uint64_t b = 0;
    for (const HeadStore& s : heads_) b += s.key_blocks.size() + s.value_blocks.size();
    return b;
  }

 private:
  // Quantizes one row to `type`'s blocks (appended to `blocks`), its dequantized values to `rows`.
  void store(const GgmlTypeInfo& type, const float* x, std::vector<std::uint8_t>& blocks, std::vector<float>& rows) const {
    const std::size_t hd = g_.head_dim, at = blocks.size(), n = rows.size();
    blocks.resize(at + hd / type.block * type.bytes);
    ggml_quantize(type, x, hd, blocks.data() + at);
    rows.resize(n + hd);
    ggml_dequantize(type, blocks.data() + at, hd, rows.data() + n);
  }
  void add(HeadStore& s, const float* key, const float* value, std::size_t pos) const {
    store(k_, key, s.key_blocks, s.key);
    store(v_, value, s.value_blocks, s.value);
    s.position.push_back(static_cast<std::int32_t>(pos));
  }

  const GgmlTypeInfo& k_;
  const GgmlTypeInfo& v_;
  KvGeometry g_;
  int threads_;
  std::vector<HeadStore> heads_;
};

}  // namespace

std::unique_ptr<KvPolicy> make_ggml_policy(const GgmlCacheParams& p, const KvGeometry& g, int threads) {
  return std::make_unique<GgmlCachePolicy>(p, g, threads);
}

}  // namespace akv
