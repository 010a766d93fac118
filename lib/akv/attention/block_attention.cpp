#include "akv/attention/block_attention.h"

#include "akv/attention/kernels.h"
#include "akv/core/exp.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace akv {
namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The maximum by eight running maxima (exact in any order), so no compare waits on the last.
template <class T>
double row_max(const T* s, std::size_t n) {
  double m[8];
  std::fill(m, m + 8, -INFINITY);
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (std::size_t u = 0; u < 8; ++u) m[u] = std::max(m[u], static_cast<double>(s[j + u]));
  }
  for (; j < n; ++j) m[0] = std::max(m[0], static_cast<double>(s[j]));
  return std::max(std::max(std::max(m[0], m[1]), std::max(m[2], m[3])), std::max(std::max(m[4], m[5]), std::max(m[6], m[7])));
}

template <class T>
double softmax_t(const T* s, std::size_t n, double* p) {
  const double m = row_max(s, n);
  for (std::size_t j = 0; j < n; ++j) p[j] = static_cast<double>(s[j]) - m;
  exp_f64(p, n, p);
  const double sum = sum_f64(p, n);
  for (std::size_t j = 0; j < n; ++j) p[j] /= sum;
  return m + std::log(sum);
}

template <class T>
void log_softmax_t(const T* s, std::size_t n, double* logp) {
  const double m = row_max(s, n);
  for (std::size_t j = 0; j < n; ++j) logp[j] = static_cast<double>(s[j]) - m;
  exp_f64(logp, n, logp);  // the exponentials first, in logp's storage
  const double lse = m + std::log(sum_f64(logp, n));
  for (std::size_t j = 0; j < n; ++j) logp[j] = static_cast<double>(s[j]) - lse;
}

using BlockMat = Eigen::Map<MatF>;

// The most rows x columns of one block's matrices: storage allocated once for every block.
std::unique_ptr<float[]> block_storage(const CausalBlock& b) {
  return std::unique_ptr<float[]>(new float[b.nq == 0 ? 0 : std::min(b.nq, kAttentionBlock) * b.visible[b.nq - 1]]);
}

// Calls block(i0, i1, s) for blocks of query rows with s = logits [i1 - i0, visible[i1 - 1]]
// (Eigen folds the scale into its GEMM: these bits, not those of the product scaled after).
template <class Fn>
void for_each_block(const CausalBlock& b, Fn&& block) {
  const auto d = static_cast<Eigen::Index>(b.d);
  Eigen::Map<const MatF> k(b.k, static_cast<Eigen::Index>(b.nk), d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.d));
  const std::unique_ptr<float[]> storage = block_storage(b);
  for (std::size_t i0 = 0; i0 < b.nq; i0 += kAttentionBlock) {
    const std::size_t i1 = std::min(b.nq, i0 + kAttentionBlock), ncols = b.visible[i1 - 1];
    Eigen::Map<const MatF> q(b.q + i0 * b.d, static_cast<Eigen::Index>(i1 - i0), d);
    BlockMat s(storage.get(), static_cast<Eigen::Index>(i1 - i0), static_cast<Eigen::Index>(ncols));
    s.noalias() = (q * k.topRows(static_cast<Eigen::Index>(ncols)).transpose()) * scale;
    block(i0, i1, s);
  }
}

}  // namespace

double sum_f64(const double* x, std::size_t n) {
  double a[4] = {0.0, 0.0, 0.0, 0.0};
  std::size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (std::size_t u = 0; u < 4; ++u) a[u] += x[j + u];
  }
  for (; j < n; ++j) a[j % 4] += x[j];
  return (a[0] + a[1]) + (a[2] + a[3]);
}

double softmax(const float* s, std::size_t n, double* p) { return softmax_t(s, n, p); }
double softmax(const double* s, std::size_t n, double* p) { return softmax_t(s, n, p); }
void log_softmax(const float* s, std::size_t n, double* logp) { log_softmax_t(s, n, logp); }
void log_softmax(const double* s, std::size_t n, double* logp) { log_softmax_t(s, n, logp); }

void causal_logits(const CausalBlock& b, const LogitRow& row) {
  for_each_block(b, [&](std::size_t i0, std::size_t i1, const BlockMat& s) {
    for (std::size_t i = i0; i < i1; ++i) row(i, s.data() + (i - i0) * static_cast<std::size_t>(s.cols()), b.visible[i]);
  });
}

void causal_logits_ref(const CausalBlock& b, const LogitRowRef& row) {
  std::vector<double> s;
  const double scale = 1.0 / std::sqrt(static_cast<double>(b.d));
  for (std::size_t i = 0; i < b.nq; ++i) {
    s.assign(b.visible[i], 0.0);
    for (std::size_t j = 0; j < b.visible[i]; ++j) {
      double dot = 0;
      for (std::size_t c = 0; c < b.d; ++c) dot += static_cast<double>(b.q[i * b.d + c]) * b.k[j * b.d + c];
      s[j] = dot * scale;
    }
    row(i, s.data(), s.size());
  }
}

void causal_attention(const CausalBlock& b, const float* v, float* out, const ProbRow& row) {
  const auto d = static_cast<Eigen::Index>(b.d);
  Eigen::Map<const MatF> vm(v, static_cast<Eigen::Index>(b.nk), d);
  std::vector<double> p;
  const std::unique_ptr<float[]> storage = block_storage(b);
  for_each_block(b, [&](std::size_t i0, std::size_t i1, const BlockMat& s) {
    const std::size_t ncols = static_cast<std::size_t>(s.cols());
    BlockMat prob(storage.get(), s.rows(), s.cols());  // each row's probabilities, zero past them
    for (std::size_t i = i0; i < i1; ++i) {
      const std::size_t n = b.visible[i];
      float* pr = prob.data() + (i - i0) * ncols;
      std::fill(pr + n, pr + ncols, 0.0f);
      if (n == 0) continue;
      p.resize(n);
      const float* si = s.data() + (i - i0) * ncols;
      const double lse = softmax(si, n, p.data());
      if (row) row(i, si, p.data(), lse, n);
      for (std::size_t j = 0; j < n; ++j) pr[j] = static_cast<float>(p[j]);
    }
    Eigen::Map<MatF> o(out + i0 * b.d, static_cast<Eigen::Index>(i1 - i0), d);
    o.noalias() = prob * vm.topRows(static_cast<Eigen::Index>(ncols));
  });
}

void causal_attention_ref(const CausalBlock& b, const float* v, float* out) {
  std::vector<double> p, o(b.d);
  causal_logits_ref(b, [&](std::size_t i, const double* s, std::size_t n) {
    std::fill(o.begin(), o.end(), 0.0);
    if (n > 0) {
      const std::size_t j0 = b.first ? b.first[i] : 0;
      p.resize(n - j0);
      std::vector<double> capped(s + j0, s + n);
      if (b.softcap != 0.0f) {
        for (double& x : capped) x = b.softcap * std::tanh(x / b.softcap);
      }
      softmax(capped.data(), n - j0, p.data());
      for (std::size_t j = j0; j < n; ++j) {
        for (std::size_t c = 0; c < b.d; ++c) o[c] += p[j - j0] * v[j * b.d + c];
      }
    }
    for (std::size_t c = 0; c < b.d; ++c) out[i * b.d + c] = static_cast<float>(o[c]);
  });
}

void causal_attention_flash(const CausalBlock& b, const float* v, float* out) {
  const auto d = static_cast<Eigen::Index>(b.d);
  Eigen::Map<const MatF> k(b.k, static_cast<Eigen::Index>(b.nk), d), vm(v, static_cast<Eigen::Index>(b.nk), d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.d));
  MatF s, p, acc;
  std::vector<float> row_max(kFlashQueries), row_sum(kFlashQueries);
  for (std::size_t i0 = 0; i0 < b.nq; i0 += kFlashQueries) {
    const std::size_t i1 = std::min(b.nq, i0 + kFlashQueries), rows = i1 - i0, ncols = b.visible[i1 - 1];
    Eigen::Map<const MatF> q(b.q + i0 * b.d, static_cast<Eigen::Index>(rows), d);
    acc.setZero(static_cast<Eigen::Index>(rows), d);
    std::fill(row_max.begin(), row_max.end(), -INFINITY);
    std::fill(row_sum.begin(), row_sum.end(), 0.0f);
    // Key tiles start at multiples of kFlashKeys from the tile's first visible key (a sliding
    // window skips the keys below every query's window).
    const std::size_t start = b.first ? b.first[i0] / kFlashKeys * kFlashKeys : 0;
    for (std::size_t j0 = start; j0 < ncols; j0 += kFlashKeys) {
      const std::size_t j1 = std::min(ncols, j0 + kFlashKeys);
      const auto cols = static_cast<Eigen::Index>(j1 - j0);
      s.noalias() = (q * k.middleRows(static_cast<Eigen::Index>(j0), cols).transpose()) * scale;
      if (b.softcap != 0.0f) s.array() = b.softcap * (s.array() / b.softcap).tanh();
      p.setZero(static_cast<Eigen::Index>(rows), cols);
      for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t n = std::min(b.visible[i0 + r], j1), lo = b.first ? std::max(b.first[i0 + r], j0) : j0;
        if (n <= lo) continue;  // this row sees none of the tile's keys
        const float* sr = s.data() + r * static_cast<std::size_t>(cols) + (lo - j0);
        const float m = std::max(row_max[r], attn::max_value(sr, n - lo));
        const float tile_sum =
            attn::exp_weights(sr, m, n - lo, p.data() + r * static_cast<std::size_t>(cols) + (lo - j0));
        if (m != row_max[r]) {
          const float alpha = row_max[r] == -INFINITY ? 0.0f : std::exp(row_max[r] - m);
          row_sum[r] *= alpha;
          acc.row(static_cast<Eigen::Index>(r)) *= alpha;
          row_max[r] = m;
        }
        row_sum[r] += tile_sum;
      }
      acc.noalias() += p * vm.middleRows(static_cast<Eigen::Index>(j0), cols);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      Eigen::Map<Eigen::RowVectorXf> o(out + (i0 + r) * b.d, d);
      if (row_sum[r] > 0.0f) o = acc.row(static_cast<Eigen::Index>(r)) / row_sum[r];
      else o.setZero();
    }
  }
}

}  // namespace akv
