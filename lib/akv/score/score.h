#pragma once
// Token importance per KV head from a dump's queries (SnapKV, H2O, StreamingLLM, TOVA) or
// without them (key norm, KeyDiff, Expected Attention: kvpress's query-free scorers).
//
// The observation window is the last W query positions of the dump (W <= n_query). For each query
// head and each window query i at position p_i (causal: tokens t <= p_i), a = softmax(q K^T / sqrt(d)).
//   snapkv:       score = mean over window queries of a, then 1-D pooling (max or avg, kernel k,
//                 same padding) over the tokens before the window (the window itself is kept).
//   h2o:          score = attention accumulated over all n_query queries of the dump.
//   streamingllm: score = token position (the most recent win); sinks are forced by the caller.
//   knorm:        score = -|k_t| (kvpress KnormPress).
//   keydiff:      score = -cos(k_t, a), a = mean over every token of k_t / |k_t| (KeyDiffPress).
//   tova:         score = window attention averaged over every query head of the layer, the same
//                 for each KV head (TOVAPress; TOVA's window is the last query).
//   lagkv:        LagKV (kvpress LagKVPress): tokens after the sinks in partitions of `lag`; each
//                 token of a partition scored by the std over channels of its key (and value)
//                 min-max scaled by the next partition, softmaxed over the partition, key and
//                 value averaged, then ranked within the partition (rank / lag); the last full
//                 partition and the rest score 1; sequences shorter than sinks + 2 lag score by
//                 position.
//   expected-attention: kvpress's ExpectedAttentionPress (score/expected_attention.h): the
//                 softmax over the tokens after the sinks of E[q] k / sqrt(d) + k^T Cov[q] k / 2d,
//                 q a Gaussian fitted to the queries after the sinks (RoPE undone), rotated by the
//                 mean RoPE of the next `future` positions; group mean; times |v_t|.
//   kvzip:        the most attention a token receives while the model reconstructs its context
//                 (score/kvzip.h): computed by the model (eval/kvzip.h) and handed to the planner;
//                 score_head leaves the scores 0 and fills only the mass.
//   kvzap:        W h_t + b, h_t the token's attention input, a linear surrogate of log KVzip+
//                 fitted by `akv calibrate` (score/kvzap.h): computed from the attention inputs
//                 (the model's, or a dump's /layers/L/attn_input) and handed to the planner;
//                 score_head leaves the scores 0 and fills only the mass.
//   qfilter:      -(f . k_t), f the KV head's Q-Filter fitted on calibration queries by `akv
//                 calibrate` (score/qfilter.h); read from ScoreOptions::qfilters by the planner:
//                 score_head leaves the scores 0 and fills only the mass.
// GQA: the scores of the query heads of one KV group are reduced (mean or max) to one per token,
// before SnapKV's pooling (the official SnapKV / Ada-KV order).
// Every method also returns `mass`: the mean window attention of the group's query heads, a
// distribution over tokens (sums to 1) used to report retained attention mass; with a window of 0
// (the query-free scorers) it is the last query's.
#include <cstddef>
#include <string>
#include <vector>

#include "akv/tensor/kv_shape.h"
#include "akv/tensor/tensor.h"

namespace akv {

enum class ScoreMethod { snapkv, h2o, streamingllm, knorm, keydiff, tova, lagkv, expected_attention, kvzip, kvzap,
                         qfilter };
enum class PoolKind { max, avg };
enum class GqaReduce { mean, max };
std::string score_method_name(ScoreMethod m);
std::string pool_name(PoolKind p);
std::string gqa_reduce_name(GqaReduce r);
ScoreMethod parse_score_method(const std::string& s);  // InvalidInput naming the value
std::string score_method_list(const char* separator);  // every score name
// Scores the planner cannot compute from keys, values and queries, handed to it (kvzip: the
// model's reconstruction pass; kvzap: the attention inputs through the fitted surrogate).
bool score_is_given(ScoreMethod m);
// A method's default observation window (32; knorm, keydiff, lagkv, expected-attention, kvzip, kvzap,
// qfilter 0; tova 1) and default sinks (streamingllm, lagkv, expected-attention, kvzip and kvzap 4,
// otherwise 0).
std::size_t default_window(ScoreMethod m);
std::size_t default_sinks(ScoreMethod m);
PoolKind parse_pool(const std::string& s);
GqaReduce parse_gqa_reduce(const std::string& s);

struct ScoreOptions {
  ScoreMethod method = ScoreMethod::snapkv;
  std::size_t window = 32;  // W: last W query positions
  PoolKind pool = PoolKind::max;
  std::size_t kernel = 7;   // pooling kernel (odd, >= 1; 1 = no pooling)
  GqaReduce gqa_reduce = GqaReduce::mean;
  // expected-attention: future positions whose RoPE is averaged, the covariance term, the
  // value-norm factor (kvpress's n_future_positions, use_covariance, use_vnorm).
  std::size_t future = 512;
  bool covariance = true;
  bool vnorm = true;
  std::size_t lag = 128;  // lagkv: partition size (kvpress's lag_size)
  bool plus = false;      // kvzip: KVzip+'s normalization (score/kvzip.h)
  // The calibration files of the scores that read one (method/eviction_params.h eviction_fields):
  std::string qfilters;   // qfilter: the filters
  std::string surrogate;  // kvzap: the fitted surrogate
};
// Whether the scorer reads values (lagkv; expected-attention with vnorm).
bool score_reads_values(const ScoreOptions& o);

// Scores of one KV head, over all n_tokens positions.
struct HeadScores {
  std::vector<double> score;  // [n_tokens] selection score (higher = keep)
  std::vector<double> mass;   // [n_tokens] mean window attention; sums to 1
};

// Throws InvalidInput when W is 0 or exceeds n_query for a scorer that reads queries, the kernel
// is even / 0, or expected-attention meets a RoPE other than plain RoPE (rope_variant). (Whether a
// score's calibration file is given: check_score_file, method/eviction_params.h.)
void validate_score_options(const ScoreOptions& o, const KvWindow& m);

// query: [n_heads, n_query, head_dim], key: [n_kv_heads, n_tokens, head_dim] (one layer).
// value: [n_kv_heads, n_tokens, head_dim] when score_reads_values(o), else unused (may be null).
// sinks: the first positions the caller keeps anyway (expected-attention leaves them out of its
// query statistics and its softmax, lagkv out of its partitions, as kvpress's n_sink).
// Scores of KV head h. Fast path (Eigen GEMM, f32 logits, f64 sums) and plain f64 reference.
HeadScores score_head(const Tensor3& query, const Tensor3& key, std::size_t h, const KvWindow& m,
                      const ScoreOptions& o, const Tensor3* value = nullptr, std::size_t sinks = 0);
// All KV heads of a layer: [n_kv_heads].
std::vector<HeadScores> score_layer(const Tensor3& query, const Tensor3& key, const KvWindow& m,
                                    const ScoreOptions& o, const Tensor3* value = nullptr,
                                    std::size_t sinks = 0);
std::vector<HeadScores> score_layer_ref(const Tensor3& query, const Tensor3& key,
                                        const KvWindow& m, const ScoreOptions& o,
                                        const Tensor3* value = nullptr, std::size_t sinks = 0);

// Pooling of x[0..n) with kernel k (odd), zero padding counted for avg (PyTorch
// avg_pool1d(count_include_pad=True)), padding ignored for max.
std::vector<double> pool1d(const std::vector<double>& x, std::size_t n, std::size_t k, PoolKind p);

}  // namespace akv
