#pragma once
// A Llama of random weights (normal, times `scale`; norms 1) for tests that run the model's
// plumbing: any shape, f32 weights, no file.
#include <cstdint>

#include "akv/core/rng.h"
#include "akv/model/model.h"

namespace akv::test {

// A small Llama shape for those tests: width 32, MLP 48, 4 query heads over 2 KV heads, rotate-half
// RoPE; the rest given.
inline ModelConfig small_config(std::size_t n_layers, std::size_t head_dim, std::size_t vocab, std::size_t seq_len) {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = n_layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = head_dim;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  c.rope_layout = RopeLayout::rotate_half;
  return c;
}

inline Model random_model(const ModelConfig& c, std::uint64_t seed, double scale) {
  ModelWeights w;
  Rng r(seed);
  auto mat = [&](std::size_t rows, std::size_t cols) {
    RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(scale * r.normal());
    return m;
  };
  const std::size_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  w.embedding = mat(c.vocab_size, c.dim);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm.assign(c.dim, 1.0f);
    lw.ffn_norm.assign(c.dim, 1.0f);
    lw.wq = mat(q, c.dim);
    lw.wk = mat(kv, c.dim);
    lw.wv = mat(kv, c.dim);
    lw.wo = mat(c.dim, q);
    lw.w1 = mat(c.hidden_dim, c.dim);
    lw.w2 = mat(c.dim, c.hidden_dim);
    lw.w3 = mat(c.hidden_dim, c.dim);
    w.layers.push_back(lw);
  }
  w.final_norm.assign(c.dim, 1.0f);
  return Model(c, w);
}

}  // namespace akv::test
