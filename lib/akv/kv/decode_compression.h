#pragma once
// Decode-time compression (kvpress's DecodingPress; EvictionParams::every / target): every N
// decoded tokens the runtime cache of an eviction method (kv/runtime.h) cuts each KV head of
// each layer back to `target` rows. One layer's cut: each head's rows are scored as the method
// scores a prompt (snapkv over the head's last n_query decode queries - the queries of its newest
// rows, which the window keeps - or knorm, keydiff, lagkv from keys and values alone, or qfilter
// from the keys and the layer's calibrated filters); forced
// rows are kept (positions below `sinks`, the newest `window` rows); the layer's budget of
// target - sinks - window selectable rows per head is spread by the method's allocator (uniform
// or adakv, alloc/alloc.h); each head keeps its best-scored selectable rows (ties: the older row)
// and the forced ones, in their order.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/method/eviction_params.h"
#include "akv/tensor/kv_shape.h"

namespace akv {

// One KV head's rows, chronological: keys after RoPE and values [n, head_dim] f32 (values only for
// scores that read them, score_reads_values; else nullptr), positions.
struct HeadRows {
  const float* key = nullptr;
  const float* value = nullptr;
  const std::int32_t* position = nullptr;
  std::size_t n = 0;
};

// The rows each head of one layer keeps (ascending indices). `query`: the layer's last n_query
// decode queries [n_query][n_heads * head_dim], oldest first (n_query >= 1, each head holding at
// least n_query rows); `heads`: shape.n_kv_heads of them. `qfilters`: the layer's Q-Filters
// [n_kv_heads][head_dim] when e scores with qfilter (score/qfilter.h), else unused.
std::vector<std::vector<std::size_t>> decode_cut(const std::vector<HeadRows>& heads, const float* query,
                                                 std::size_t n_query, const KvShape& shape, const EvictionParams& e,
                                                 const std::vector<std::vector<double>>* qfilters = nullptr);

}  // namespace akv
