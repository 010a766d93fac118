#pragma once
// Causal softmax attention of a block of queries over a prefix of keys: the one primitive behind
// token scoring (score/), attention fidelity (eval/attention), the joint planner's candidate
// errors (kv/joint), calibration's attention entropy (eval/calibrate) and the model's prefill.
// Decode attention over packed caches is decode_attention.h.
//
// Query i of nq sees the first visible[i] keys (visible non-decreasing; 0 = none). Its logits are
// s_ij = (q_i . k_j) / sqrt(d) for j < visible[i] (times 1.0f / sqrtf(d) in f32, or 1.0 / sqrt(d)
// in f64), and its probabilities p_ij = exp(s_ij - max_j s)
// / sum_j exp(s_ij - max_j s), exponentials and sums in f64 (exp_f64 of core/exp.h, within 1 ulp
// of libm's exp and four lanes at a time).
//   fast path: f32 logits from one GEMM (Eigen) per block of at most kAttentionBlock query rows
//              against the keys its last row sees: memory O(block * nk), never [nq, nk] at once;
//   reference: f64 dot products in channel order, the same softmax.
#include <cstddef>
#include <functional>

namespace akv {

inline constexpr std::size_t kAttentionBlock = 128;

struct CausalBlock {
  const float* q = nullptr;              // [nq, d]
  const float* k = nullptr;              // [nk, d]
  const std::size_t* visible = nullptr;  // [nq] keys each query sees, non-decreasing, <= nk
  std::size_t nq = 0, nk = 0, d = 0;
  // Optional (causal_attention_flash and causal_attention_ref only): [nq], query i sees keys
  // first[i] .. visible[i] - 1 (non-decreasing, first[i] < visible[i] where visible[i] > 0): a
  // sliding window (Model::prefill of a windowed layer). Null: every query from key 0.
  const std::size_t* first = nullptr;
  // causal_attention_flash and causal_attention_ref only: Gemma 2's soft-capping of the scaled
  // logits, s -> c tanh(s / c) (0: none).
  float softcap = 0.0f;
};

// Calls row(i, s, n) for i = 0..nq-1 in order with the logits s[0..n), n = visible[i].
using LogitRow = std::function<void(std::size_t i, const float* s, std::size_t n)>;
void causal_logits(const CausalBlock& b, const LogitRow& row);
using LogitRowRef = std::function<void(std::size_t i, const double* s, std::size_t n)>;
void causal_logits_ref(const CausalBlock& b, const LogitRowRef& row);

// Outputs out [nq, d] = P V with the probabilities rounded to f32 and an f32 GEMM per block;
// v: [nk, d]. Rows with visible[i] == 0 are 0. `row`, when given, sees each query's logits and
// probabilities (f64) as they are computed, queries in order, and lse = max + log(sum_j exp(s[j] -
// max)) of the same sum: s[j] - lse is log_softmax's logp[j], bit for bit.
using ProbRow = std::function<void(std::size_t i, const float* s, const double* p, double lse, std::size_t n)>;
void causal_attention(const CausalBlock& b, const float* v, float* out, const ProbRow& row = {});

// The same outputs as a blocked online softmax (flash-attention style), for the model's prefill:
// per tile of kFlashQueries queries and kFlashKeys keys, f32 logits from one GEMM, the tile's
// probabilities exp(s - m) against the running row maximum m from kernels.h's vectorized f32
// exp, the running sums and outputs rescaled by exp(m_old - m_new) when the maximum grows, and
// f32 GEMMs of the probabilities and the value tile; out = acc / sum at the end. Memory
// O(kFlashQueries * (kFlashKeys + d)) per call; no f64 and no scalar exp per score. Agrees with
// causal_attention_ref within 1e-5 * max |v| on the tested shapes (tests/unit/test_attention.cpp;
// the f32 exp's relative error is 2e-7, the f32 sums' grows with the number of keys).
// Deterministic: the same bits for a given input on any thread.
inline constexpr std::size_t kFlashQueries = 64, kFlashKeys = 256;
void causal_attention_flash(const CausalBlock& b, const float* v, float* out);
// out [nq, d] = P V with f64 logits, probabilities and sums (the reference of both).
void causal_attention_ref(const CausalBlock& b, const float* v, float* out);

// x[0] + ... + x[n-1] as four running sums of every fourth term, (s0 + s1) + (s2 + s3): the adds
// of one sum wait on each other, not every add on the one before.
double sum_f64(const double* x, std::size_t n);
// p[j] = exp(s[j] - max) / sum over j < n (exp_f64, sum_f64), n >= 1; returns max + log(sum)
// (log_softmax's lse).
double softmax(const float* s, std::size_t n, double* p);
double softmax(const double* s, std::size_t n, double* p);
// logp[j] = s[j] - (max + log(sum_j exp(s[j] - max))) (f64, the same exp_f64 and sum), n >= 1.
void log_softmax(const float* s, std::size_t n, double* logp);
void log_softmax(const double* s, std::size_t n, double* logp);

}  // namespace akv
