#include "akv/score/score.h"

#include <algorithm>
#include <cmath>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"

namespace akv {
namespace {

// Adds the probabilities of logits s[0..n) to acc[0..n).
template <class T>
void add_softmax(const T* s, std::size_t n, double* acc, std::vector<double>& p) {
  p.resize(n);
  softmax(s, n, p.data());
  for (std::size_t j = 0; j < n; ++j) acc[j] += p[j];
}

// Turns per-query-head accumulations into the KV head's scores.
// window_acc / all_acc: [g][T] sums over the window queries / over all queries.
HeadScores finish(const std::vector<std::vector<double>>& window_acc,
                  const std::vector<std::vector<double>>& all_acc, const KvWindow& m,
                  const ScoreOptions& o) {
  const std::size_t T = m.n_tokens, g = window_acc.size(), W = o.window;
  HeadScores hs;
  hs.mass.assign(T, 0.0);
  hs.score.assign(T, 0.0);
  for (std::size_t q = 0; q < g; ++q) {
    for (std::size_t t = 0; t < T; ++t) hs.mass[t] += window_acc[q][t] / static_cast<double>(W * g);
  }
  if (o.method == ScoreMethod::streamingllm) {
    for (std::size_t t = 0; t < T; ++t) hs.score[t] = static_cast<double>(t);
    return hs;
  }
  // The group's query heads are reduced first (mean or max), then SnapKV pools the result over
  // the tokens before the window: the order of the official SnapKV / Ada-KV GQA code.
  for (std::size_t q = 0; q < g; ++q) {
    const std::vector<double>& acc = o.method == ScoreMethod::snapkv ? window_acc[q] : all_acc[q];
    const double scale = o.method == ScoreMethod::snapkv ? static_cast<double>(W) : 1.0;
    for (std::size_t t = 0; t < T; ++t) {
      const double s = acc[t] / scale;
      if (o.gqa_reduce == GqaReduce::mean) {
        hs.score[t] += s / static_cast<double>(g);
      } else {
        hs.score[t] = q == 0 ? s : std::max(hs.score[t], s);
      }
    }
  }
  if (o.method == ScoreMethod::snapkv) {
    const std::vector<double> pooled = pool1d(hs.score, T - W, o.kernel, o.pool);
    std::copy(pooled.begin(), pooled.end(), hs.score.begin());
  }
  return hs;
}

}  // namespace

std::string score_method_name(ScoreMethod m) {
  switch (m) {
    case ScoreMethod::snapkv: return "snapkv";
    case ScoreMethod::h2o: return "h2o";
    case ScoreMethod::streamingllm: return "streamingllm";
  }
  return "?";
}
std::string pool_name(PoolKind p) { return p == PoolKind::max ? "max" : "avg"; }
std::string gqa_reduce_name(GqaReduce r) { return r == GqaReduce::mean ? "mean" : "max"; }

ScoreMethod parse_score_method(const std::string& s) {
  if (s == "snapkv") return ScoreMethod::snapkv;
  if (s == "h2o") return ScoreMethod::h2o;
  if (s == "streamingllm") return ScoreMethod::streamingllm;
  throw InvalidInput("unknown score method (expected snapkv, h2o or streamingllm)", {"", "--score", s});
}
PoolKind parse_pool(const std::string& s) {
  if (s == "max") return PoolKind::max;
  if (s == "avg") return PoolKind::avg;
  throw InvalidInput("unknown pooling (expected max or avg)", {"", "--pool", s});
}
GqaReduce parse_gqa_reduce(const std::string& s) {
  if (s == "mean") return GqaReduce::mean;
  if (s == "max") return GqaReduce::max;
  throw InvalidInput("unknown GQA reduction (expected mean or max)", {"", "--gqa-reduce", s});
}

void validate_score_options(const ScoreOptions& o, const KvWindow& m) {
  if (o.window == 0 || o.window > m.n_query) {
    throw InvalidInput("observation window must be in [1, n_query = " + std::to_string(m.n_query) +
                           "] (the dump stores the queries of the last n_query positions)",
                       {"", "--window", std::to_string(o.window)});
  }
  if (o.kernel == 0 || o.kernel % 2 == 0) {
    throw InvalidInput("pooling kernel must be odd", {"", "--kernel", std::to_string(o.kernel)});
  }
}

std::vector<double> pool1d(const std::vector<double>& x, std::size_t n, std::size_t k, PoolKind p) {
  std::vector<double> out(n);
  const std::ptrdiff_t half = static_cast<std::ptrdiff_t>(k / 2);
  for (std::size_t t = 0; t < n; ++t) {
    const std::ptrdiff_t lo = std::max<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>(t) - half);
    const std::ptrdiff_t hi =
        std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(n) - 1, static_cast<std::ptrdiff_t>(t) + half);
    double acc = p == PoolKind::max ? -INFINITY : 0.0;
    for (std::ptrdiff_t j = lo; j <= hi; ++j) {
      acc = p == PoolKind::max ? std::max(acc, x[static_cast<std::size_t>(j)]) : acc + x[static_cast<std::size_t>(j)];
    }
    out[t] = p == PoolKind::max ? acc : acc / static_cast<double>(k);
  }
  return out;
}

HeadScores score_head(const Tensor3& query, const Tensor3& key, std::size_t h, const KvWindow& m,
                      const ScoreOptions& o) {
  validate_score_options(o, m);
  const std::size_t T = m.n_tokens, d = m.head_dim, nq = m.n_query, g = m.group_size();
  const std::size_t rows = o.method == ScoreMethod::h2o ? nq : o.window;  // last `rows` queries
  std::vector<double> tmp;
  std::vector<std::vector<double>> win(g, std::vector<double>(T, 0.0)), all;
  if (o.method == ScoreMethod::h2o) all.assign(g, std::vector<double>(T, 0.0));
  // The last `rows` query rows, at positions T - rows + i: blocked (H2O scores every prompt
  // query; one [T, T] product would need 4 GB per head at 32K).
  std::vector<std::size_t> visible(rows);
  for (std::size_t i = 0; i < rows; ++i) visible[i] = T - rows + i + 1;
  for (std::size_t q = 0; q < g; ++q) {
    const CausalBlock b{query.row(h * g + q, nq - rows), key.row(h, 0), visible.data(), rows, T, d};
    causal_logits(b, [&](std::size_t i, const float* s, std::size_t n) {
      if (i >= rows - o.window) add_softmax(s, n, win[q].data(), tmp);
      if (o.method == ScoreMethod::h2o) add_softmax(s, n, all[q].data(), tmp);
    });
  }
  return finish(win, all, m, o);
}

std::vector<HeadScores> score_layer(const Tensor3& query, const Tensor3& key, const KvWindow& m,
                                    const ScoreOptions& o) {
  std::vector<HeadScores> out(m.n_kv_heads);
  for (std::size_t h = 0; h < m.n_kv_heads; ++h) out[h] = score_head(query, key, h, m, o);
  return out;
}

std::vector<HeadScores> score_layer_ref(const Tensor3& query, const Tensor3& key,
                                        const KvWindow& m, const ScoreOptions& o) {
  validate_score_options(o, m);
  const std::size_t T = m.n_tokens, d = m.head_dim, nq = m.n_query, g = m.group_size();
  std::vector<HeadScores> out(m.n_kv_heads);
  std::vector<std::size_t> visible(nq);
  for (std::size_t i = 0; i < nq; ++i) visible[i] = T - nq + i + 1;
  std::vector<double> tmp;
  for (std::size_t h = 0; h < m.n_kv_heads; ++h) {
    std::vector<std::vector<double>> win(g, std::vector<double>(T, 0.0)),
        all(g, std::vector<double>(T, 0.0));
    for (std::size_t q = 0; q < g; ++q) {
      const CausalBlock b{query.row(h * g + q, 0), key.row(h, 0), visible.data(), nq, T, d};
      causal_logits_ref(b, [&](std::size_t i, const double* s, std::size_t n) {
        if (i >= nq - o.window) add_softmax(s, n, win[q].data(), tmp);
        add_softmax(s, n, all[q].data(), tmp);
      });
    }
    out[h] = finish(win, all, m, o);
  }
  return out;
}

}  // namespace akv
