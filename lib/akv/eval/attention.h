#pragma once
// Causal softmax attention of a block of queries, and the fidelity metrics that compare the
// attention of a compressed cache with the original.
//
// Queries i = 0..nq-1 sit at positions qpos[i]; keys/values at positions kpos[j] (ascending).
// Query i attends to the keys with kpos[j] <= qpos[i]: p = softmax(q K^T / sqrt(d)), o = p V.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace akv {

struct AttentionInput {
  const float* q = nullptr;  // [nq, d]
  const float* k = nullptr;  // [nk, d]
  const float* v = nullptr;  // [nk, d]
  std::size_t nq = 0, nk = 0, d = 0;
  const std::size_t* qpos = nullptr;  // [nq]
  const std::size_t* kpos = nullptr;  // [nk] ascending
};

// Metrics of one query head: original attention (over all tokens) vs compressed attention
// (over the kept tokens). Sums over queries, so heads aggregate by adding.
struct AttentionFidelity {
  double out_err2 = 0;   // sum_i ||o_i - o^_i||^2
  double out_norm2 = 0;  // sum_i ||o_i||^2
  double kl = 0;         // sum_i KL(p_i || p^_i), natural log; tokens not kept count as p^ = 0
                         // only through the renormalisation (their p mass is reported below)
  double evicted_mass = 0;  // sum_i of the original attention mass on tokens not kept
  double recall[3] = {0, 0, 0};  // sum_i of top-k recall, k = 1, 8, 32
  std::size_t queries = 0;
};
inline constexpr std::size_t kRecallK[3] = {1, 8, 32};

// Fast path (Eigen GEMM, f32 logits, f64 softmax sums) and plain reference (f64 loops).
// `kept` maps compressed key j to its original index (kpos of the original = 0..n_tokens-1
// restricted as usual); empty = the compressed keys are the original keys' positions.
AttentionFidelity attention_fidelity(const AttentionInput& original,
                                     const AttentionInput& compressed);
AttentionFidelity attention_fidelity_ref(const AttentionInput& original,
                                         const AttentionInput& compressed);

// Indices of the k largest scores among s[0..n) (ties: lower index first), best first; min(k, n)
// of them.
std::vector<std::size_t> top_k(const double* s, std::size_t n, std::size_t k);

// One side's attention outputs [nq, d] (attention_fidelity's fast path) and which queries see a
// key (one that sees none on either side counts for neither); with `entropy`, also each query's
// attention entropy in nats, sum_j p_j (lse - s_j) over the softmax that weighs the outputs (0
// for a query that sees no key).
struct AttentionOutputs {
  std::vector<float> out;
  std::vector<char> sees;
  std::vector<double> entropy;  // [nq] when asked, else empty
};
AttentionOutputs attention_outputs(const AttentionInput& a, bool entropy = false);
// attention_fidelity's out_err2 and out_norm2 alone (the same values, the rest 0) from the two
// sides' outputs: callers that compare many compressed sides with one original and read no
// logit metric compute the original once.
AttentionFidelity output_error(const AttentionOutputs& original, const AttentionOutputs& compressed, std::size_t d);

// The original side of attention_fidelity, computed once for several compressed sides: its
// outputs and each query's log-probabilities and top kRecallK[2] keys.
// attention_fidelity(o, c) is attention_fidelity(ref, o, c) with ref = attention_reference(o)
// (ref may then serve further compressed sides of o).
struct AttentionReference {
  AttentionOutputs outputs;
  std::vector<std::vector<double>> logp;
  std::vector<std::vector<std::size_t>> top;
  // A compressed side's kept mass (the original's probability of the keys it keeps) and their
  // renormalized original probabilities. whole: per query, filled by attention_fidelity the first
  // time a compressed side keeps every key the query sees (a quantizer's): they then depend on
  // the original alone.
  struct Kept {
    double mass = 0;
    std::vector<double> p;
  };
  std::vector<std::optional<Kept>> whole;
};
AttentionReference attention_reference(const AttentionInput& original);
AttentionFidelity attention_fidelity(AttentionReference& reference, const AttentionInput& original,
                                     const AttentionInput& compressed);

}  // namespace akv
