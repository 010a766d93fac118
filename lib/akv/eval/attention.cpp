#include "akv/eval/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/exp.h"

namespace akv {
namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Index in `original` positions of every compressed key (positions must be a subset).
std::vector<std::size_t> map_positions(const AttentionInput& o, const AttentionInput& c) {
  std::vector<std::size_t> idx(c.nk);
  std::size_t j = 0;
  for (std::size_t i = 0; i < c.nk; ++i) {
    while (j < o.nk && o.kpos[j] < c.kpos[i]) ++j;
    if (j == o.nk || o.kpos[j] != c.kpos[i]) {
      throw InvalidInput("compressed key position not among the original positions",
                         {"", "position", std::to_string(c.kpos[i])});
    }
    idx[i] = j;
  }
  return idx;
}

// Keys visible to a query at position p: the prefix with kpos <= p.
std::size_t visible(const AttentionInput& a, std::size_t p) {
  return static_cast<std::size_t>(std::upper_bound(a.kpos, a.kpos + a.nk, p) - a.kpos);
}

// The kept mass sum_j exp(logp[idx[j]]) (sum_f64) and the kept keys' renormalized probabilities
// exp(logp[idx[j]]) / kept, j < nc (idx null: j itself, a side that keeps every key).
AttentionReference::Kept kept_of(const std::vector<double>& logp, const std::size_t* idx, std::size_t nc) {
  AttentionReference::Kept k;
  k.p.resize(nc);
  for (std::size_t j = 0; j < nc; ++j) k.p[j] = logp[idx ? idx[j] : j];
  exp_f64(k.p.data(), nc, k.p.data());
  k.mass = sum_f64(k.p.data(), nc);
  for (double& p : k.p) p /= k.mass;
  return k;
}

// Per-query metrics from the original's log-probabilities logp [n] and top kRecallK[2] keys a,
// the compressed side's logits sc [nc] and log-probabilities logq [nc], and kept =
// kept_of(logp, idx, nc).
void compare_row(const std::vector<double>& logp, const std::vector<std::size_t>& a, const double* sc,
                 const double* logq, std::size_t nc, const std::vector<std::size_t>& idx,
                 const AttentionReference::Kept& kept, AttentionFidelity& f) {
  const std::size_t n = logp.size();
  const double log_kept = std::log(kept.mass);
  double acc[4] = {0.0, 0.0, 0.0, 0.0};  // KL(kept || compressed): four running sums, as sum_f64's
  for (std::size_t j = 0; j < nc; ++j) acc[j % 4] = std::fma(kept.p[j], logp[idx[j]] - log_kept - logq[j], acc[j % 4]);
  const double kl = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  f.kl += std::max(kl, 0.0);
  f.evicted_mass += std::max(0.0, 1.0 - kept.mass);
  // Top-k lists are prefixes of one sorted top-32 list (same order for every k), in original
  // indices (idx ascends, so ties among kept keys order as their original indices).
  std::vector<std::size_t> b = top_k(sc, nc, kRecallK[2]);
  for (std::size_t& j : b) j = idx[j];
  for (int r = 0; r < 3; ++r) {
    const std::size_t k = std::min(kRecallK[r], n);
    std::vector<std::size_t> bk(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(std::min(k, b.size())));
    std::sort(bk.begin(), bk.end());
    std::size_t hit = 0;
    for (std::size_t t = 0; t < k; ++t) hit += std::binary_search(bk.begin(), bk.end(), a[t]) ? 1 : 0;
    f.recall[r] += static_cast<double>(hit) / static_cast<double>(k);
  }
  f.queries += 1;
}

void check(const AttentionInput& o, const AttentionInput& c) {
  if (o.nq != c.nq || o.d != c.d) throw InvalidInput("attention inputs differ in shape", {"", "nq/d"});
  for (std::size_t i = 0; i < o.nq; ++i) {
    if (o.qpos[i] != c.qpos[i]) throw InvalidInput("query positions differ", {"", "qpos"});
    if (i > 0 && o.qpos[i] < o.qpos[i - 1]) throw InvalidInput("query positions must ascend", {"", "qpos"});
  }
}

// Each query's logits (as f64) and their log-sum-exp.
struct Logits {
  std::vector<std::vector<double>> s;
  std::vector<double> lse;
};

// One side's outputs and, when `logits` is given, each query's logits; with `entropy`, each
// query's attention entropy.
AttentionOutputs attend(const AttentionInput& a, Logits* logits, bool entropy = false) {
  std::vector<std::size_t> vis(a.nq);
  AttentionOutputs r;
  r.sees.resize(a.nq);
  for (std::size_t i = 0; i < a.nq; ++i) {
    vis[i] = visible(a, a.qpos[i]);
    r.sees[i] = vis[i] > 0 ? 1 : 0;
  }
  const CausalBlock b{a.q, a.k, vis.data(), a.nq, a.nk, a.d};
  r.out.assign(a.nq * a.d, 0.0f);
  if (!logits && !entropy) {
    causal_attention(b, a.v, r.out.data());
    return r;
  }
  if (logits) {
    logits->s.assign(a.nq, {});
    logits->lse.assign(a.nq, 0.0);
  }
  if (entropy) r.entropy.assign(a.nq, 0.0);
  causal_attention(b, a.v, r.out.data(), [&](std::size_t i, const float* s, const double* p, double lse, std::size_t n) {
    if (logits) {
      logits->s[i].assign(s, s + n);
      logits->lse[i] = lse;
    }
    if (entropy) {
      double h = 0;  // -sum p log p with log p = s - lse: non-negative terms
      for (std::size_t j = 0; j < n; ++j) h += p[j] * (lse - static_cast<double>(s[j]));
      r.entropy[i] = h;
    }
  });
  return r;
}

}  // namespace

// The k-th largest score is at least the k-th largest of the maxima of blocks of eight (k blocks
// hold a score that high), so the scores at or above that bar are the only candidates (about k
// of them on attention logits); they are ordered by score, ties by index. Fewer than k whole
// blocks: every score is a candidate.
std::vector<std::size_t> top_k(const double* s, std::size_t n, std::size_t k) {
  using Entry = std::pair<double, std::size_t>;
  k = std::min(k, n);
  if (k == 0) return {};
  constexpr std::size_t kBlock = 8;
  const std::size_t blocks = n / kBlock;
  double bar = -INFINITY;
  if (blocks >= k) {
    std::vector<double> top(blocks);
    for (std::size_t b = 0; b < blocks; ++b) {
      double m = s[b * kBlock];
      for (std::size_t u = 1; u < kBlock; ++u) m = std::max(m, s[b * kBlock + u]);
      top[b] = m;
    }
    std::nth_element(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(blocks - k), top.end());
    bar = top[blocks - k];
  }
  std::vector<Entry> best;
  for (std::size_t j = 0; j < n; ++j) {
    if (s[j] >= bar) best.emplace_back(s[j], j);
  }
  const auto better = [](const Entry& a, const Entry& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(best.begin(), best.begin() + static_cast<std::ptrdiff_t>(k), best.end(), better);
  std::vector<std::size_t> order(k);
  for (std::size_t i = 0; i < k; ++i) order[i] = best[i].second;
  return order;
}

AttentionOutputs attention_outputs(const AttentionInput& a, bool entropy) { return attend(a, nullptr, entropy); }

AttentionFidelity output_error(const AttentionOutputs& original, const AttentionOutputs& compressed, std::size_t d) {
  std::vector<float> out = original.out, outc = compressed.out;
  const std::size_t nq = original.sees.size();
  for (std::size_t i = 0; i < nq; ++i) {
    if (original.sees[i] && compressed.sees[i]) continue;
    // No key on one side: the query counts for neither.
    std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(i * d), d, 0.0f);
    std::fill_n(outc.begin() + static_cast<std::ptrdiff_t>(i * d), d, 0.0f);
  }
  const auto rows = static_cast<Eigen::Index>(nq), cols = static_cast<Eigen::Index>(d);
  Eigen::Map<const MatF> om(out.data(), rows, cols), ocm(outc.data(), rows, cols);
  AttentionFidelity f;
  f.out_err2 = (om - ocm).cast<double>().squaredNorm();
  f.out_norm2 = om.cast<double>().squaredNorm();
  return f;
}

AttentionReference attention_reference(const AttentionInput& o) {
  AttentionReference r;
  Logits s;
  r.outputs = attend(o, &s);
  r.logp.resize(o.nq);
  r.top.resize(o.nq);
  r.whole.resize(o.nq);
  for (std::size_t i = 0; i < o.nq; ++i) {
    r.logp[i].resize(s.s[i].size());
    for (std::size_t j = 0; j < s.s[i].size(); ++j) r.logp[i][j] = s.s[i][j] - s.lse[i];
    r.top[i] = top_k(s.s[i].data(), s.s[i].size(), kRecallK[2]);
  }
  return r;
}

AttentionFidelity attention_fidelity(AttentionReference& ref, const AttentionInput& o, const AttentionInput& c) {
  check(o, c);
  const std::vector<std::size_t> idx = map_positions(o, c);
  std::size_t same = 0;  // idx[j] == j for j < same
  while (same < idx.size() && idx[same] == same) ++same;
  Logits sc;
  const AttentionOutputs outc = attend(c, &sc);
  AttentionFidelity f = output_error(ref.outputs, outc, o.d);
  std::vector<double> logq;
  for (std::size_t i = 0; i < o.nq; ++i) {
    if (!ref.outputs.sees[i] || !outc.sees[i]) continue;
    const std::size_t nc = sc.s[i].size();
    logq.resize(nc);
    for (std::size_t j = 0; j < nc; ++j) logq[j] = sc.s[i][j] - sc.lse[i];
    if (nc == ref.logp[i].size() && nc <= same) {  // every key: the reference's, once
      if (!ref.whole[i]) ref.whole[i] = kept_of(ref.logp[i], nullptr, nc);
      compare_row(ref.logp[i], ref.top[i], sc.s[i].data(), logq.data(), nc, idx, *ref.whole[i], f);
    } else {
      compare_row(ref.logp[i], ref.top[i], sc.s[i].data(), logq.data(), nc, idx, kept_of(ref.logp[i], idx.data(), nc), f);
    }
  }
  return f;
}

AttentionFidelity attention_fidelity(const AttentionInput& o, const AttentionInput& c) {
  AttentionReference ref = attention_reference(o);
  return attention_fidelity(ref, o, c);
}

AttentionFidelity attention_fidelity_ref(const AttentionInput& o, const AttentionInput& c) {
  check(o, c);
  const std::vector<std::size_t> idx = map_positions(o, c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.d));
  AttentionFidelity f;
  auto scores = [&](const AttentionInput& a, std::size_t i, std::size_t n) {
    std::vector<double> s(n);
    for (std::size_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::size_t t = 0; t < a.d; ++t) dot += static_cast<double>(a.q[i * a.d + t]) * a.k[j * a.d + t];
      s[j] = dot * scale;
    }
    return s;
  };
  auto output = [&](const AttentionInput& a, const std::vector<double>& s) {
    std::vector<double> lp(s.size()), out(a.d, 0.0);
    log_softmax(s.data(), s.size(), lp.data());
    for (std::size_t j = 0; j < s.size(); ++j) {
      for (std::size_t t = 0; t < a.d; ++t) out[t] += std::exp(lp[j]) * a.v[j * a.d + t];
    }
    return out;
  };
  for (std::size_t i = 0; i < o.nq; ++i) {
    const std::size_t n = visible(o, o.qpos[i]), nc = visible(c, c.qpos[i]);
    if (n == 0 || nc == 0) continue;
    const auto s = scores(o, i, n), sc = scores(c, i, nc);
    std::vector<double> logp(n), logq(nc);
    log_softmax(s.data(), n, logp.data());
    log_softmax(sc.data(), nc, logq.data());
    compare_row(logp, top_k(s.data(), n, kRecallK[2]), sc.data(), logq.data(), nc, idx, kept_of(logp, idx.data(), nc), f);
    const auto out = output(o, s), outc = output(c, sc);
    for (std::size_t t = 0; t < o.d; ++t) {
      f.out_err2 += (out[t] - outc[t]) * (out[t] - outc[t]);
      f.out_norm2 += out[t] * out[t];
    }
  }
  return f;
}

}  // namespace akv
