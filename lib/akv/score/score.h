#pragma once
// Token importance per KV head from a dump's queries (SnapKV, H2O, StreamingLLM).
//
// The observation window is the last W query positions of the dump (W <= n_query). For each query
// head and each window query i at position p_i (causal: tokens t <= p_i), a = softmax(q K^T / sqrt(d)).
//   snapkv:       score = mean over window queries of a, then 1-D pooling (max or avg, kernel k,
//                 same padding) over the tokens before the window (the window itself is kept).
//   h2o:          score = attention accumulated over all n_query queries of the dump.
//   streamingllm: score = token position (the most recent win); sinks are forced by the caller.
// GQA: the scores of the query heads of one KV group are reduced (mean or max) to one per token,
// before SnapKV's pooling (the official SnapKV / Ada-KV order).
// Every method also returns `mass`: the mean window attention of the group's query heads, a
// distribution over tokens (sums to 1) used to report retained attention mass.
#include <cstddef>
#include <string>
#include <vector>

#include "akv/tensor/kv_shape.h"
#include "akv/tensor/tensor.h"

namespace akv {

enum class ScoreMethod { snapkv, h2o, streamingllm };
enum class PoolKind { max, avg };
enum class GqaReduce { mean, max };
std::string score_method_name(ScoreMethod m);
std::string pool_name(PoolKind p);
std::string gqa_reduce_name(GqaReduce r);
ScoreMethod parse_score_method(const std::string& s);  // UsageError naming the value
PoolKind parse_pool(const std::string& s);
GqaReduce parse_gqa_reduce(const std::string& s);

struct ScoreOptions {
  ScoreMethod method = ScoreMethod::snapkv;
  std::size_t window = 32;  // W: last W query positions
  PoolKind pool = PoolKind::max;
  std::size_t kernel = 7;   // pooling kernel (odd, >= 1; 1 = no pooling)
  GqaReduce gqa_reduce = GqaReduce::mean;
};

// Scores of one KV head, over all n_tokens positions.
struct HeadScores {
  std::vector<double> score;  // [n_tokens] selection score (higher = keep)
  std::vector<double> mass;   // [n_tokens] mean window attention; sums to 1
};

// Throws InvalidInput when W is 0 or exceeds n_query, or the kernel is even / 0.
void validate_score_options(const ScoreOptions& o, const KvWindow& m);

// query: [n_heads, n_query, head_dim], key: [n_kv_heads, n_tokens, head_dim] (one layer).
// Scores of KV head h. Fast path (Eigen GEMM, f32 logits, f64 sums) and plain f64 reference.
HeadScores score_head(const Tensor3& query, const Tensor3& key, std::size_t h, const KvWindow& m,
                      const ScoreOptions& o);
// All KV heads of a layer: [n_kv_heads].
std::vector<HeadScores> score_layer(const Tensor3& query, const Tensor3& key, const KvWindow& m,
                                    const ScoreOptions& o);
std::vector<HeadScores> score_layer_ref(const Tensor3& query, const Tensor3& key,
                                        const KvWindow& m, const ScoreOptions& o);

// Pooling of x[0..n) with kernel k (odd), zero padding counted for avg (PyTorch
// avg_pool1d(count_include_pad=True)), padding ignored for max.
std::vector<double> pool1d(const std::vector<double>& x, std::size_t n, std::size_t k, PoolKind p);

}  // namespace akv
