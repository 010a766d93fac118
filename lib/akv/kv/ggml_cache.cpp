#include "akv/kv/ggml_cache.h"

#include <string_view>
#include <vector>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/tensor/ggml_quant.h"

namespace akv {
namespace {

// One KV head of one layer: the blocks as stored (attention reads them: GgmlRowsView).
struct HeadStore {
  std::vector<std::uint8_t> key_blocks, value_blocks;
  std::vector<std::int32_t> position;
};

class GgmlCachePolicy : public KvPolicy {
 public:
  GgmlCachePolicy(const GgmlCacheParams& p, const KvGeometry& g, int threads)
      : k_(ggml_cache_type(p.key, "", "k")), v_(ggml_cache_type(p.value, "", "v")), g_(g), threads_(threads),
        heads_(g.n_layers * g.n_kv_heads) {
    check_ggml_head_dim(k_, g.head_dim, "", "ggml k=" + p.key + ": head_dim");
    check_ggml_head_dim(v_, g.head_dim, "", "ggml v=" + p.value + ": head_dim");
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
    KvView v;
    v.n = s.position.size();
    v.position = s.position.data();
    tensor_view(k_, s.key_blocks, v.n, v.segments[0].key);
    tensor_view(v_, s.value_blocks, v.n, v.segments[0].value);
    return v;
  }

  std::uint64_t bytes() const override {
    std::uint64_t b = 0;
    for (std::size_t l = 0; l < g_.n_layers; ++l) b += layer_bytes(l);
    return b;
  }

  bool layer_local() const override { return true; }

  std::uint64_t layer_bytes(std::size_t layer) const override {
    std::uint64_t b = 0;
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      const HeadStore& s = heads_[layer * g_.n_kv_heads + h];
      b += s.key_blocks.size() + s.value_blocks.size();
    }
    return b;
  }

 private:
  // F16 rows are dense f16 rows (the f16 loops read them, as method none's); block types are
  // read through the f32 loops a dequantized tile at a time (decode_attention.h).
  static void tensor_view(const GgmlTypeInfo& type, const std::vector<std::uint8_t>& blocks, std::size_t n,
                          TensorView& t) {
    if (std::string_view(type.name) == "F16") {
      t.dense = {DenseType::f16, blocks.data(), n};
    } else {
      t.ggml = {&type, blocks.data(), n};
    }
  }
  // Quantizes one row to `type`'s blocks, appended to `blocks`.
  void store(const GgmlTypeInfo& type, const float* x, std::vector<std::uint8_t>& blocks) const {
    const std::size_t hd = g_.head_dim, at = blocks.size();
    blocks.resize(at + hd / type.block * type.bytes);
    ggml_quantize(type, x, hd, blocks.data() + at);
  }
  void add(HeadStore& s, const float* key, const float* value, std::size_t pos) const {
    store(k_, key, s.key_blocks);
    store(v_, value, s.value_blocks);
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
