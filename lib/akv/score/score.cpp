#include "akv/score/score.h"

#include <algorithm>
#include <cmath>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/score/expected_attention.h"
#include "akv/score/kv_scores.h"

namespace akv {
namespace {

// Adds the probabilities of logits s[0..n) to acc[0..n).
template <class T>
void add_softmax(const T* s, std::size_t n, double* acc, std::vector<double>& p) {
  p.resize(n);
  softmax(s, n, p.data());
  for (std::size_t j = 0; j < n; ++j) acc[j] += p[j];
}

// Attention of query head qh over KV head kvh's keys, summed over the last `rows` queries (`all`,
// when given) and over the last `wrows` of them (`win`). Ref: f64 logits.
template <bool Ref>
void attention_sums(const Tensor3& query, const Tensor3& key, std::size_t qh, std::size_t kvh, const KvWindow& m,
                    std::size_t rows, std::size_t wrows, std::vector<double>& win, std::vector<double>* all) {
  const std::size_t T = m.n_tokens, nq = m.n_query;
  // The last `rows` query rows, at positions T - rows + i: blocked (H2O scores every prompt
  // query; one [T, T] product would need 4 GB per head at 32K).
  std::vector<std::size_t> visible(rows);
  for (std::size_t i = 0; i < rows; ++i) visible[i] = T - rows + i + 1;
  const CausalBlock b{query.row(qh, nq - rows), key.row(kvh, 0), visible.data(), rows, T, m.head_dim};
  std::vector<double> tmp;
  auto row = [&](std::size_t i, const auto* s, std::size_t n) {
    if (i >= rows - wrows) add_softmax(s, n, win.data(), tmp);
    if (all) add_softmax(s, n, all->data(), tmp);
  };
  if constexpr (Ref) {
    causal_logits_ref(b, [&](std::size_t i, const double* s, std::size_t n) { row(i, s, n); });
  } else {
    causal_logits(b, [&](std::size_t i, const float* s, std::size_t n) { row(i, s, n); });
  }
}

// SnapKV and H2O: the group's query heads are reduced first (mean or max), then SnapKV pools the
// result over the tokens before the window: the order of the official SnapKV / Ada-KV GQA code.
void attention_scores(HeadScores& hs, const std::vector<std::vector<double>>& win,
                      const std::vector<std::vector<double>>& all, const KvWindow& m, const ScoreOptions& o) {
  const std::size_t T = m.n_tokens, g = win.size(), W = o.window;
  for (std::size_t q = 0; q < g; ++q) {
    const std::vector<double>& acc = o.method == ScoreMethod::snapkv ? win[q] : all[q];
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
}

template <bool Ref>
HeadScores score_one(const Tensor3& query, const Tensor3& key, std::size_t h, const KvWindow& m,
                     const ScoreOptions& o, const Tensor3* value, std::size_t sinks) {
  const std::size_t T = m.n_tokens, d = m.head_dim, nq = m.n_query, g = m.group_size();
  // The mass's window: at most the stored queries (a query-free score's window may be longer).
  const std::size_t W = std::min(std::max<std::size_t>(o.window, 1), nq);
  const bool h2o = o.method == ScoreMethod::h2o;
  const std::size_t rows = h2o ? nq : W;
  std::vector<std::vector<double>> win(g, std::vector<double>(T, 0.0)), all;
  if (h2o) all.assign(g, std::vector<double>(T, 0.0));
  for (std::size_t q = 0; q < g; ++q) {
    attention_sums<Ref>(query, key, h * g + q, h, m, rows, W, win[q], h2o ? &all[q] : nullptr);
  }
  HeadScores hs;
  hs.mass.assign(T, 0.0);
  hs.score.assign(T, 0.0);
  for (std::size_t q = 0; q < g; ++q) {
    for (std::size_t t = 0; t < T; ++t) hs.mass[t] += win[q][t] / static_cast<double>(W * g);
  }
  switch (o.method) {
    case ScoreMethod::streamingllm:
      for (std::size_t t = 0; t < T; ++t) hs.score[t] = static_cast<double>(t);
      break;
    case ScoreMethod::snapkv:
    case ScoreMethod::h2o:
      attention_scores(hs, win, all, m, o);
      break;
    case ScoreMethod::knorm:
      hs.score = knorm_scores(key, h, T, d);
      break;
    case ScoreMethod::keydiff:
      hs.score = keydiff_scores(key, h, T, d);
      break;
    case ScoreMethod::tova: {
      // Every query head of the layer, each over its own KV head's keys.
      for (std::size_t qh = 0; qh < m.n_heads; ++qh) {
        const std::size_t kvh = qh / g;
        std::vector<double> other;
        const std::vector<double>* acc = &win[qh % g];
        if (kvh != h) {
          other.assign(T, 0.0);
          attention_sums<Ref>(query, key, qh, kvh, m, W, W, other, nullptr);
          acc = &other;
        }
        for (std::size_t t = 0; t < T; ++t) hs.score[t] += (*acc)[t] / static_cast<double>(W * m.n_heads);
      }
      break;
    }
    case ScoreMethod::lagkv:
      if (!value) throw std::logic_error("lagkv needs the values");
      hs.score = lagkv_scores(key, *value, h, T, d, sinks, o.lag);
      break;
    case ScoreMethod::kvzip:    // given by the model's reconstruction pass
    case ScoreMethod::kvzap:    // given by the surrogate on the attention inputs
    case ScoreMethod::qfilter:  // the planner applies the calibrated filters
      break;
    case ScoreMethod::expected_attention:
      hs.score = Ref ? expected_attention_ref(query, key, value, h, m, o, sinks)
                     : expected_attention(query, key, value, h, m, o, sinks);
      break;
  }
  return hs;
}

constexpr ScoreMethod kScores[] = {ScoreMethod::snapkv, ScoreMethod::h2o,     ScoreMethod::streamingllm,
                                   ScoreMethod::knorm,  ScoreMethod::keydiff, ScoreMethod::tova,
                                   ScoreMethod::lagkv,  ScoreMethod::expected_attention, ScoreMethod::kvzip, ScoreMethod::kvzap,
                                   ScoreMethod::qfilter};

// Scorers that read no window queries (knorm, keydiff, lagkv, expected-attention, kvzip, kvzap, qfilter): their
// window (the forced last tokens) may be 0.
bool score_is_query_free(ScoreMethod m) {
  return m == ScoreMethod::knorm || m == ScoreMethod::keydiff || m == ScoreMethod::lagkv ||
         m == ScoreMethod::expected_attention || score_is_given(m) || m == ScoreMethod::qfilter;
}

}  // namespace

std::string score_method_name(ScoreMethod m) {
  switch (m) {
    case ScoreMethod::snapkv: return "snapkv";
    case ScoreMethod::h2o: return "h2o";
    case ScoreMethod::streamingllm: return "streamingllm";
    case ScoreMethod::knorm: return "knorm";
    case ScoreMethod::keydiff: return "keydiff";
    case ScoreMethod::tova: return "tova";
    case ScoreMethod::lagkv: return "lagkv";
    case ScoreMethod::expected_attention: return "expected-attention";
    case ScoreMethod::kvzip: return "kvzip";
    case ScoreMethod::kvzap: return "kvzap";
    case ScoreMethod::qfilter: return "qfilter";
  }
  return "?";
}
std::string pool_name(PoolKind p) { return p == PoolKind::max ? "max" : "avg"; }
std::string gqa_reduce_name(GqaReduce r) { return r == GqaReduce::mean ? "mean" : "max"; }

std::string score_method_list(const char* separator) {
  std::string out;
  for (ScoreMethod m : kScores) out += (out.empty() ? "" : separator) + score_method_name(m);
  return out;
}

ScoreMethod parse_score_method(const std::string& s) {
  for (ScoreMethod m : kScores) {
    if (score_method_name(m) == s) return m;
  }
  throw InvalidInput("unknown score method (expected " + score_method_list(", ") + ")", {"", "--score", s});
}

bool score_is_given(ScoreMethod m) { return m == ScoreMethod::kvzip || m == ScoreMethod::kvzap; }

std::size_t default_window(ScoreMethod m) {
  if (score_is_query_free(m)) return 0;
  return m == ScoreMethod::tova ? 1 : 32;
}

std::size_t default_sinks(ScoreMethod m) {
  return m == ScoreMethod::streamingllm || m == ScoreMethod::lagkv || m == ScoreMethod::expected_attention ||
                 score_is_given(m)
             ? 4
             : 0;
}

bool score_reads_values(const ScoreOptions& o) {
  return o.method == ScoreMethod::lagkv || (o.method == ScoreMethod::expected_attention && o.vnorm);
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
  // Query-free scores read no window queries: their window is only the recent tokens kept.
  if (!score_is_query_free(o.method) && (o.window == 0 || o.window > m.n_query)) {
    throw InvalidInput("observation window must be in [1, n_query = " + std::to_string(m.n_query) +
                           "] (the queries of the last n_query positions: those a dump stores, or a model's prompt's)",
                       {"", "--window", std::to_string(o.window)});
  }
  if (o.kernel == 0 || o.kernel % 2 == 0) {
    throw InvalidInput("pooling kernel must be odd", {"", "--kernel", std::to_string(o.kernel)});
  }
  if (o.method == ScoreMethod::expected_attention) validate_expected_attention(o, m);
  if (o.method == ScoreMethod::lagkv && (o.lag == 0 || m.head_dim < 2)) {
    throw InvalidInput("lagkv partitions must hold >= 1 token (and heads >= 2 channels)", {"", "--lag", std::to_string(o.lag)});
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
                      const ScoreOptions& o, const Tensor3* value, std::size_t sinks) {
  validate_score_options(o, m);
  return score_one<false>(query, key, h, m, o, value, sinks);
}

std::vector<HeadScores> score_layer(const Tensor3& query, const Tensor3& key, const KvWindow& m,
                                    const ScoreOptions& o, const Tensor3* value, std::size_t sinks) {
  std::vector<HeadScores> out(m.n_kv_heads);
  for (std::size_t h = 0; h < m.n_kv_heads; ++h) out[h] = score_head(query, key, h, m, o, value, sinks);
  return out;
}

std::vector<HeadScores> score_layer_ref(const Tensor3& query, const Tensor3& key, const KvWindow& m,
                                        const ScoreOptions& o, const Tensor3* value, std::size_t sinks) {
  validate_score_options(o, m);
  std::vector<HeadScores> out(m.n_kv_heads);
  for (std::size_t h = 0; h < m.n_kv_heads; ++h) out[h] = score_one<true>(query, key, h, m, o, value, sinks);
  return out;
}

}  // namespace akv
