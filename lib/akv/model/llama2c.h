#pragma once
// llama2.c checkpoints, legacy version 0: a header of 7 int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means an untied classifier
// follows), then f32 weights in llama2.c order: token embedding [vocab, dim], attention norms
// [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], FFN
// norms [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim], final norm
// [dim], two unused RoPE tables [seq_len, head_dim / 2] each, and the classifier when untied.
// RoPE on interleaved pairs, theta 10000, RMSNorm eps 1e-5.
#include <string>

#include "akv/model/model.h"

namespace akv {

// Throws IoError (cannot read), CorruptData (size does not match the header), InvalidInput
// (impossible header values), each naming the file and the field.
Model load_llama2c(const std::string& path);

}  // namespace akv
