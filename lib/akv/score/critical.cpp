#include "akv/score/critical.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "akv/core/parallel.h"

namespace akv {
namespace {

void check_shapes(const Tensor3& value, const RowMatrix& wo, std::size_t n_heads, int p) {
  const std::size_t kv = value.dim0(), d = value.dim2();
  if (kv == 0 || n_heads % kv != 0 || static_cast<std::size_t>(wo.cols()) != n_heads * d || wo.rows() == 0 ||
      (p != 1 && p != 2)) {
    throw std::logic_error("head_value_out_norms: W_o is not [hidden, n_heads * head_dim], or p is not 1 or 2");
  }
}

// [n_heads][T] -> [n_kv_heads][T]: the mean over each KV head's group (h = g * group + j), in order.
std::vector<std::vector<double>> group_mean(const std::vector<std::vector<double>>& per_head, std::size_t kv) {
  const std::size_t group = per_head.size() / kv, T = per_head[0].size();
  std::vector<std::vector<double>> norms(kv, std::vector<double>(T, 0.0));
  for (std::size_t g = 0; g < kv; ++g) {
    for (std::size_t j = 0; j < group; ++j) {
      for (std::size_t t = 0; t < T; ++t) norms[g][t] += per_head[g * group + j][t];
    }
    for (double& x : norms[g]) x /= static_cast<double>(group);
  }
  return norms;
}

// Tokens per block of the fast path: the product block [block, hidden] stays small.
constexpr std::size_t kBlock = 128;

}  // namespace

std::vector<std::vector<double>> head_value_out_norms(const Tensor3& value, const RowMatrix& wo, std::size_t n_heads,
                                                      int p, int threads) {
  check_shapes(value, wo, n_heads, p);
  const std::size_t kv = value.dim0(), T = value.dim1(), d = value.dim2(), group = n_heads / kv;
  const auto hidden = wo.rows();
  std::vector<std::vector<double>> norms(n_heads, std::vector<double>(T));
  parallel_for(n_heads, threads, [&](std::size_t h) {
    const auto slice = wo.middleCols(static_cast<Eigen::Index>(h * d), static_cast<Eigen::Index>(d));
    RowMatrix out;
    for (std::size_t t0 = 0; t0 < T; t0 += kBlock) {
      const std::size_t n = std::min(kBlock, T - t0);
      const Eigen::Map<const RowMatrix> v(value.row(h / group, t0), static_cast<Eigen::Index>(n),
                                          static_cast<Eigen::Index>(d));
      out.noalias() = v * slice.transpose();
      for (std::size_t i = 0; i < n; ++i) {
        const float* y = out.row(static_cast<Eigen::Index>(i)).data();
        double s = 0;
        for (Eigen::Index j = 0; j < hidden; ++j) s += p == 1 ? std::abs(static_cast<double>(y[j])) : static_cast<double>(y[j]) * y[j];
        norms[h][t0 + i] = p == 1 ? s : std::sqrt(s);
      }
    }
  });
  return norms;
}

std::vector<std::vector<double>> head_value_out_norms_ref(const Tensor3& value, const RowMatrix& wo,
                                                          std::size_t n_heads, int p) {
  check_shapes(value, wo, n_heads, p);
  const std::size_t kv = value.dim0(), T = value.dim1(), d = value.dim2(), group = n_heads / kv;
  const auto hidden = static_cast<std::size_t>(wo.rows());
  std::vector<std::vector<double>> norms(n_heads, std::vector<double>(T));
  for (std::size_t h = 0; h < n_heads; ++h) {
    for (std::size_t t = 0; t < T; ++t) {
      const float* v = value.row(h / group, t);
      double s = 0;
      for (std::size_t j = 0; j < hidden; ++j) {
        double y = 0;
        for (std::size_t i = 0; i < d; ++i) {
          y += static_cast<double>(v[i]) * static_cast<double>(wo(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(h * d + i)));
        }
        s += p == 1 ? std::abs(y) : y * y;
      }
      norms[h][t] = p == 1 ? s : std::sqrt(s);
    }
  }
  return norms;
}

std::vector<std::vector<double>> projected_value_norms(const Tensor3& value, const RowMatrix& wo,
                                                       std::size_t n_heads, int threads) {
  return group_mean(head_value_out_norms(value, wo, n_heads, 1, threads), value.dim0());
}

std::vector<std::vector<double>> projected_value_norms_ref(const Tensor3& value, const RowMatrix& wo,
                                                           std::size_t n_heads) {
  return group_mean(head_value_out_norms_ref(value, wo, n_heads, 1), value.dim0());
}

void critical_select(std::vector<std::size_t>& order, std::size_t keep, std::size_t first,
                     const std::vector<double>& score, const std::vector<double>& norm) {
  keep = std::min(keep, order.size());
  first = std::min(first, keep);
  const auto rest = order.begin() + static_cast<std::ptrdiff_t>(first);
  auto weighed = [&](std::size_t t) { return (score[t] + kCriticalEpsilon) * norm[t]; };
  std::stable_sort(rest, order.end(), [&](std::size_t a, std::size_t b) {
    const double wa = weighed(a), wb = weighed(b);
    return wa > wb || (wa == wb && a < b);
  });
}

}  // namespace akv
