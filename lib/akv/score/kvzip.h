#pragma once
// KVzip (arXiv 2505.23416; kvpress's KVzipPress): a KV pair's importance is the most attention it
// receives while the model reconstructs its own context. The context is cut into chunks; for each,
// the model reads "repeat the previous context" followed by the chunk again (eval/kvzip.h runs
// that prefill) and each repeat query attends, in one softmax, to the first min(sinks, start)
// tokens, the chunk's tokens and the repeat tokens up to itself. A chunk token's score is its
// largest probability over the repeat queries and the query heads of its KV group. It reads no
// question: the reconstruction asks for everything.
#include <cstddef>
#include <vector>

#include "akv/tensor/kv_shape.h"
#include "akv/tensor/tensor.h"

namespace akv {

// Scores of every token of a context: [layer][kv head][token].
using TokenScores = std::vector<std::vector<std::vector<double>>>;

// KVzip+ (kvpress's kvzip_plus_normalization): before the maxima, each repeat query's
// probabilities are divided by the norm of its attention input and each chunk token's multiplied
// by the L2 norm of its value through the query head's slice of W_o.
struct KvzipPlus {
  const std::vector<double>* input_norm = nullptr;           // [n]: every row of the prefill
  const std::vector<std::vector<double>>* out_norm = nullptr;  // [n_heads][end - start]: the chunk's tokens
};

// One layer of a reconstruction prefill over context + repeat (positions 0 ..): query [n_heads,
// n, hd], key [n_kv_heads, n, hd], the context the first n_ctx rows, the repeat the rest. Writes
// scores[h][t] (sized [n_kv_heads][>= end]) for t in [start, end), the chunk. Fast path: f32
// logits (Eigen GEMM) and f64 softmax; reference: f64 dot products. `plus`: KVzip+'s weights.
void kvzip_chunk_scores(const Tensor3& query, const Tensor3& key, const KvShape& s, std::size_t n_ctx,
                        std::size_t start, std::size_t end, std::size_t sinks, std::vector<std::vector<double>>& scores,
                        const KvzipPlus& plus = {});
void kvzip_chunk_scores_ref(const Tensor3& query, const Tensor3& key, const KvShape& s, std::size_t n_ctx,
                            std::size_t start, std::size_t end, std::size_t sinks,
                            std::vector<std::vector<double>>& scores, const KvzipPlus& plus = {});

}  // namespace akv
