#pragma once
// llama2.c checkpoints, legacy version 0: a header of 7 int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means an untied classifier
// follows), then f32 weights in llama2.c order: token embedding [vocab, dim], attention norms
// [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], FFN
// norms [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim], final norm
// [dim], two unused RoPE tables [seq_len, head_dim / 2] each, and the classifier when untied.
// RoPE on interleaved pairs, theta 10000, RMSNorm eps 1e-5.
#include <cstdint>
#include <string>

#include "akv/model/model.h"

namespace akv {

// Throws IoError (cannot read), CorruptData (size does not match the header, a non-finite
// weight: the tensor named by llama2.c's name), InvalidInput (impossible header values), each
// naming the file and the field. Each tensor is read from the file into its place.
Model load_llama2c(const std::string& path);

// What the header alone gives (checked as load_llama2c checks it, the file's size included; no
// weight is read): the model's shape and its weights' bytes as load_llama2c holds them (f32,
// without the two unused RoPE tables). akv plan --config X.bin.
struct Llama2cShape {
  ModelConfig config;
  std::uint64_t weight_bytes = 0;
};
Llama2cShape read_llama2c_shape(const std::string& path);

// Whether akv plan and akv info take `path` for a llama2.c checkpoint: a regular file named
// *.bin (the format has no magic; load_model takes any file that is not GGUF as one).
bool is_llama2c_path(const std::string& path);

}  // namespace akv
