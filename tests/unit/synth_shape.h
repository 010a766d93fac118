#pragma once
// The shape of a small synthetic dump for unit tests: 2 layers of n_heads query heads.
#include <cstddef>

#include "akv/synth/synth.h"

namespace akv::test {

inline SynthOptions synth_shape(std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim, std::size_t n_tokens,
                                std::size_t window, int threads) {
  SynthOptions so;
  so.n_layers = 2;
  so.n_heads = n_heads;
  so.n_kv_heads = n_kv_heads;
  so.head_dim = head_dim;
  so.n_tokens = n_tokens;
  so.window = window;
  so.threads = threads;
  return so;
}

}  // namespace akv::test
