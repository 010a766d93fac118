#include "akv/score/kvzip.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <Eigen/Core>

#include "akv/attention/block_attention.h"

namespace akv {
namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The keys a repeat query sees, in softmax order: sinks, chunk, repeat rows.
std::vector<std::size_t> key_rows(std::size_t n_ctx, std::size_t n, std::size_t start, std::size_t end,
                                  std::size_t sinks) {
  std::vector<std::size_t> rows;
  for (std::size_t t = 0; t < std::min(sinks, start); ++t) rows.push_back(t);
  for (std::size_t t = start; t < end; ++t) rows.push_back(t);
  for (std::size_t t = n_ctx; t < n; ++t) rows.push_back(t);
  return rows;
}

void check(const Tensor3& query, const Tensor3& key, const KvShape& s, std::size_t n_ctx, std::size_t start,
           std::size_t end, const std::vector<std::vector<double>>& scores) {
  if (query.dim0() != s.n_heads || key.dim0() != s.n_kv_heads || query.dim1() != key.dim1() || start > end ||
      end > n_ctx || n_ctx >= key.dim1() || scores.size() != s.n_kv_heads) {
    throw std::logic_error("kvzip_chunk_scores: shapes do not match");
  }
}

// Folds one repeat query's probabilities p over the chunk's columns into the head's maxima;
// KVzip+ weighs them by 1 / the query row's input norm and the query head's value norms.
void fold(const double* p, std::size_t first, std::size_t start, std::size_t end, std::vector<double>& score,
          const KvzipPlus& plus, std::size_t head, std::size_t row) {
  if (!plus.input_norm) {
    for (std::size_t t = start; t < end; ++t) score[t] = std::max(score[t], p[first + t - start]);
    return;
  }
  const double inv = 1.0 / (*plus.input_norm)[row];
  const std::vector<double>& out = (*plus.out_norm)[head];
  for (std::size_t t = start; t < end; ++t) score[t] = std::max(score[t], p[first + t - start] * inv * out[t - start]);
}

void check_plus(const KvzipPlus& plus, const KvShape& s, std::size_t n, std::size_t start, std::size_t end) {
  if (!plus.input_norm) return;
  if (!plus.out_norm || plus.input_norm->size() != n || plus.out_norm->size() != s.n_heads ||
      (*plus.out_norm)[0].size() != end - start) {
    throw std::logic_error("kvzip_chunk_scores: KVzip+ norms do not match the shapes");
  }
}

}  // namespace

void kvzip_chunk_scores(const Tensor3& query, const Tensor3& key, const KvShape& s, std::size_t n_ctx,
                        std::size_t start, std::size_t end, std::size_t sinks, std::vector<std::vector<double>>& scores,
                        const KvzipPlus& plus) {
  check(query, key, s, n_ctx, start, end, scores);
  check_plus(plus, s, key.dim1(), start, end);
  const std::size_t n = key.dim1(), r = n - n_ctx, d = s.head_dim, g = s.group_size();
  const std::vector<std::size_t> rows = key_rows(n_ctx, n, start, end, sinks);
  const std::size_t first = std::min(sinks, start), m = rows.size(), fixed = m - r;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<double> p(m);
  for (std::size_t h = 0; h < s.n_kv_heads; ++h) {
    MatF K(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(d));
    for (std::size_t i = 0; i < m; ++i) std::copy_n(key.row(h, rows[i]), d, K.row(static_cast<Eigen::Index>(i)).data());
    std::vector<double>& score = scores[h];
    std::fill(score.begin() + static_cast<std::ptrdiff_t>(start), score.begin() + static_cast<std::ptrdiff_t>(end), 0.0);
    for (std::size_t q = 0; q < g; ++q) {
      const Eigen::Map<const MatF> Q(query.row(h * g + q, n_ctx), static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(d));
      const MatF logits = (Q * K.transpose()) * scale;
      for (std::size_t j = 0; j < r; ++j) {
        const std::size_t visible = fixed + j + 1;  // the repeat rows up to itself
        softmax(logits.row(static_cast<Eigen::Index>(j)).data(), visible, p.data());
        fold(p.data(), first, start, end, score, plus, h * g + q, n_ctx + j);
      }
    }
  }
}

void kvzip_chunk_scores_ref(const Tensor3& query, const Tensor3& key, const KvShape& s, std::size_t n_ctx,
                            std::size_t start, std::size_t end, std::size_t sinks,
                            std::vector<std::vector<double>>& scores, const KvzipPlus& plus) {
  check(query, key, s, n_ctx, start, end, scores);
  check_plus(plus, s, key.dim1(), start, end);
  const std::size_t n = key.dim1(), d = s.head_dim, g = s.group_size();
  const std::vector<std::size_t> rows = key_rows(n_ctx, n, start, end, sinks);
  const std::size_t first = std::min(sinks, start), fixed = rows.size() - (n - n_ctx);
  std::vector<double> logit(rows.size()), p(rows.size());
  for (std::size_t h = 0; h < s.n_kv_heads; ++h) {
    std::vector<double>& score = scores[h];
    std::fill(score.begin() + static_cast<std::ptrdiff_t>(start), score.begin() + static_cast<std::ptrdiff_t>(end), 0.0);
    for (std::size_t q = 0; q < g; ++q) {
      for (std::size_t j = 0; j < n - n_ctx; ++j) {
        const float* x = query.row(h * g + q, n_ctx + j);
        const std::size_t visible = fixed + j + 1;
        for (std::size_t i = 0; i < visible; ++i) {
          const float* k = key.row(h, rows[i]);
          double dot = 0;
          for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(x[c]) * k[c];
          logit[i] = dot / std::sqrt(static_cast<double>(d));
        }
        softmax(logit.data(), visible, p.data());
        fold(p.data(), first, start, end, score, plus, h * g + q, n_ctx + j);
      }
    }
  }
}

}  // namespace akv
