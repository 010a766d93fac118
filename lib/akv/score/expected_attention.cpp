#include "akv/score/expected_attention.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/tensor/rope.h"

namespace akv {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The query rows a head's statistics use: positions first .. n_tokens - 1 (first >= sinks; at
// least the last query, as sinks < n_tokens).
struct QueryRows {
  std::size_t first = 0, n = 0, row0 = 0;  // first position, count, its row in the query tensor
};

QueryRows query_rows(const KvWindow& m, std::size_t sinks) {
  QueryRows r;
  r.first = std::max(m.first_query_pos(), sinks);
  r.n = m.n_tokens - r.first;
  r.row0 = r.first - m.first_query_pos();
  return r;
}

// Query head qh's rows before RoPE, [n, d] in f32 as the model's RoPE undone; `table` covers the
// rows' positions (one table for every query head of the call).
std::vector<float> unrotated_queries(const Tensor3& query, std::size_t qh, const KvWindow& m, const QueryRows& r,
                                     const RopeTable& table) {
  const std::size_t d = m.head_dim;
  std::vector<float> x(query.row(qh, r.row0), query.row(qh, r.row0) + r.n * d);
  apply_rope(x.data(), r.n, r.first, m.rope_layout, table, true);
  return x;
}

double row_norm(const float* x, std::size_t d) {
  double s = 0;
  for (std::size_t c = 0; c < d; ++c) s += static_cast<double>(x[c]) * x[c];
  return std::sqrt(s);
}

// Softmax of the logits of tokens sinks .. T-1 into the head's scores (reduced over the group),
// then the value norms.
void reduce_group(const std::vector<double>& logits, std::size_t q, std::size_t g, std::size_t sinks,
                  const ScoreOptions& o, std::vector<double>& score) {
  std::vector<double> p(logits.size());
  softmax(logits.data(), logits.size(), p.data());
  for (std::size_t i = 0; i < p.size(); ++i) {
    double& s = score[sinks + i];
    if (o.gqa_reduce == GqaReduce::mean) {
      s += p[i] / static_cast<double>(g);
    } else {
      s = q == 0 ? p[i] : std::max(s, p[i]);
    }
  }
}

void scale_by_values(const Tensor3* value, std::size_t h, const KvWindow& m, std::size_t sinks,
                     const ScoreOptions& o, std::vector<double>& score) {
  if (!o.vnorm) return;
  if (!value) throw std::logic_error("expected-attention with vnorm needs the values");
  for (std::size_t t = sinks; t < m.n_tokens; ++t) score[t] *= row_norm(value->row(h, t), m.head_dim);
}

}  // namespace

void validate_expected_attention(const ScoreOptions& o, const KvWindow& m) {
  if (!m.rope_variant.empty()) {
    throw InvalidInput("expected-attention undoes and averages plain RoPE; this model's RoPE differs",
                       {"", "rope_variant", m.rope_variant});
  }
  if (o.future == 0) throw InvalidInput("future positions must be >= 1", {"", "--future", "0"});
}

std::vector<double> mean_rope_rotation(std::size_t head_dim, double theta, RopeLayout layout, std::size_t first,
                                       std::size_t n) {
  const std::vector<float> inv_freq = rope_inv_freq(head_dim, theta, RopeScaling{}, 0);
  std::vector<double> r(head_dim * head_dim, 0.0);
  for (std::size_t i = 0; i < head_dim / 2; ++i) {
    double c = 0, s = 0;
    for (std::size_t p = first; p < first + n; ++p) {
      const double angle = static_cast<double>(p) * static_cast<double>(inv_freq[i]);
      c += std::cos(angle);
      s += std::sin(angle);
    }
    c /= static_cast<double>(n);
    s /= static_cast<double>(n);
    std::size_t a = 0, b = 0;
    rope_pair_dims(layout, head_dim, i, a, b);
    r[a * head_dim + a] = c;
    r[a * head_dim + b] = -s;
    r[b * head_dim + a] = s;
    r[b * head_dim + b] = c;
  }
  return r;
}

std::vector<double> expected_attention(const Tensor3& query, const Tensor3& key, const Tensor3* value,
                                       std::size_t h, const KvWindow& m, const ScoreOptions& o, std::size_t sinks) {
  const std::size_t T = m.n_tokens, d = m.head_dim, g = m.group_size();
  std::vector<double> score(T, 0.0);
  if (sinks >= T) return score;
  const QueryRows rows = query_rows(m, sinks);
  const RopeTable table(d, m.rope_theta, rows.first, rows.n);
  const auto D = static_cast<Eigen::Index>(d);
  const std::vector<double> rot = mean_rope_rotation(d, m.rope_theta, m.rope_layout, T, o.future);
  const Eigen::Map<const MatD> R(rot.data(), D, D);
  const MatD K = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                     key.row(h, sinks), static_cast<Eigen::Index>(T - sinks), D)
                     .cast<double>();
  std::vector<double> logits(T - sinks);
  for (std::size_t q = 0; q < g; ++q) {
    const std::vector<float> xf = unrotated_queries(query, h * g + q, m, rows, table);
    const MatD X = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                       xf.data(), static_cast<Eigen::Index>(rows.n), D)
                       .cast<double>();
    const Eigen::RowVectorXd mu = X.colwise().sum() / static_cast<double>(rows.n);
    Eigen::VectorXd l = K * (R * mu.transpose()) / std::sqrt(static_cast<double>(d));
    if (o.covariance) {
      const MatD Xc = X.rowwise() - mu;
      const MatD S = R * ((Xc.transpose() * Xc) / static_cast<double>(rows.n)) * R.transpose();
      l += (K * S).cwiseProduct(K).rowwise().sum() / (2.0 * static_cast<double>(d));
    }
    std::copy(l.data(), l.data() + l.size(), logits.begin());
    reduce_group(logits, q, g, sinks, o, score);
  }
  scale_by_values(value, h, m, sinks, o, score);
  return score;
}

std::vector<double> expected_attention_ref(const Tensor3& query, const Tensor3& key, const Tensor3* value,
                                           std::size_t h, const KvWindow& m, const ScoreOptions& o,
                                           std::size_t sinks) {
  const std::size_t T = m.n_tokens, d = m.head_dim, g = m.group_size();
  std::vector<double> score(T, 0.0);
  if (sinks >= T) return score;
  const QueryRows rows = query_rows(m, sinks);
  const RopeTable table(d, m.rope_theta, rows.first, rows.n);
  const std::vector<double> R = mean_rope_rotation(d, m.rope_theta, m.rope_layout, T, o.future);
  std::vector<double> logits(T - sinks);
  for (std::size_t q = 0; q < g; ++q) {
    const std::vector<float> x = unrotated_queries(query, h * g + q, m, rows, table);
    std::vector<double> mu(d, 0.0), S(d * d, 0.0), muR(d, 0.0), RS(d * d, 0.0), SR(d * d, 0.0);
    for (std::size_t i = 0; i < rows.n; ++i) {
      for (std::size_t c = 0; c < d; ++c) mu[c] += x[i * d + c];
    }
    for (double& v : mu) v /= static_cast<double>(rows.n);
    for (std::size_t i = 0; i < rows.n; ++i) {
      for (std::size_t a = 0; a < d; ++a) {
        for (std::size_t b = 0; b < d; ++b) S[a * d + b] += (x[i * d + a] - mu[a]) * (x[i * d + b] - mu[b]);
      }
    }
    for (double& v : S) v /= static_cast<double>(rows.n);
    for (std::size_t a = 0; a < d; ++a) {
      for (std::size_t b = 0; b < d; ++b) muR[a] += R[a * d + b] * mu[b];
    }
    for (std::size_t a = 0; a < d; ++a) {  // RS = R S, SR = R S R^T
      for (std::size_t b = 0; b < d; ++b) {
        for (std::size_t c = 0; c < d; ++c) RS[a * d + b] += R[a * d + c] * S[c * d + b];
      }
    }
    for (std::size_t a = 0; a < d; ++a) {
      for (std::size_t b = 0; b < d; ++b) {
        for (std::size_t c = 0; c < d; ++c) SR[a * d + b] += RS[a * d + c] * R[b * d + c];
      }
    }
    for (std::size_t t = sinks; t < T; ++t) {
      const float* k = key.row(h, t);
      double lin = 0, quad = 0;
      for (std::size_t a = 0; a < d; ++a) {
        lin += muR[a] * k[a];
        for (std::size_t b = 0; b < d; ++b) quad += k[a] * SR[a * d + b] * k[b];
      }
      logits[t - sinks] = lin / std::sqrt(static_cast<double>(d)) +
                          (o.covariance ? quad / (2.0 * static_cast<double>(d)) : 0.0);
    }
    reduce_group(logits, q, g, sinks, o, score);
  }
  scale_by_values(value, h, m, sinks, o, score);
  return score;
}

}  // namespace akv
