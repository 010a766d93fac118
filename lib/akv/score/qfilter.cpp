#include "akv/score/qfilter.h"

#include <Eigen/Eigenvalues>
#include <Eigen/SVD>

#include <stdexcept>

#include "akv/core/parallel.h"

namespace akv {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Matrix rows_f64(const float* rows, std::size_t n, std::size_t d) {
  return Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
             rows, static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(d))
      .cast<double>();
}

// The orientation rule of qfilter.h applied to the unit vector v (zero stays zero).
std::vector<double> oriented(const Matrix& x, const Eigen::VectorXd& v) {
  const std::size_t d = static_cast<std::size_t>(v.size());
  std::vector<double> out(d, 0.0);
  if (v.squaredNorm() == 0.0) return out;
  const Eigen::VectorXd proj = x * v;
  std::size_t pos = 0, neg = 0;
  for (Eigen::Index i = 0; i < proj.size(); ++i) {
    pos += proj[i] > 0.0 ? 1 : 0;
    neg += proj[i] < 0.0 ? 1 : 0;
  }
  const std::size_t n = static_cast<std::size_t>(proj.size());
  double sign = 1.0;
  if (2 * pos > n) {
    sign = 1.0;
  } else if (2 * neg > n) {
    sign = -1.0;
  } else if (proj.sum() != 0.0) {
    sign = proj.sum() > 0.0 ? 1.0 : -1.0;
  } else {
    for (std::size_t c = 0; c < d; ++c) {
      if (v[static_cast<Eigen::Index>(c)] != 0.0) {
        sign = v[static_cast<Eigen::Index>(c)] > 0.0 ? 1.0 : -1.0;
        break;
      }
    }
  }
  for (std::size_t c = 0; c < d; ++c) out[c] = sign * v[static_cast<Eigen::Index>(c)];
  return out;
}

template <bool Ref>
std::vector<std::vector<double>> fit(const Tensor3& queries, std::size_t n_kv_heads, int threads) {
  const std::size_t H = queries.dim0(), n = queries.dim1(), d = queries.dim2();
  if (n_kv_heads == 0 || H % n_kv_heads != 0) throw std::logic_error("fit_qfilters: n_heads not a multiple of n_kv_heads");
  std::vector<std::vector<double>> dir(H);
  parallel_for(H, threads, [&](std::size_t h) {
    dir[h] = Ref ? query_direction_ref(queries.row(h, 0), n, d) : query_direction(queries.row(h, 0), n, d);
  });
  const std::size_t group = H / n_kv_heads;
  std::vector<std::vector<double>> filters(n_kv_heads, std::vector<double>(d, 0.0));
  for (std::size_t g = 0; g < n_kv_heads; ++g) {
    for (std::size_t j = 0; j < group; ++j) {
      for (std::size_t c = 0; c < d; ++c) filters[g][c] -= dir[g * group + j][c];
    }
    for (double& x : filters[g]) x /= static_cast<double>(group);
  }
  return filters;
}

}  // namespace

std::vector<double> query_direction(const float* rows, std::size_t n, std::size_t d) {
  const Matrix x = rows_f64(rows, n, d);
  const Eigen::MatrixXd gram = x.transpose() * x;
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(gram);
  const Eigen::Index top = static_cast<Eigen::Index>(d) - 1;  // eigenvalues ascending
  if (n == 0 || eig.eigenvalues()[top] <= 0.0) return std::vector<double>(d, 0.0);
  return oriented(x, eig.eigenvectors().col(top));
}

std::vector<double> query_direction_ref(const float* rows, std::size_t n, std::size_t d) {
  const Matrix x = rows_f64(rows, n, d);
  if (n == 0) return std::vector<double>(d, 0.0);
  const Eigen::JacobiSVD<Eigen::MatrixXd> svd(x, Eigen::ComputeThinV);
  if (svd.singularValues()[0] <= 0.0) return std::vector<double>(d, 0.0);
  return oriented(x, svd.matrixV().col(0));
}

std::vector<std::vector<double>> fit_qfilters(const Tensor3& queries, std::size_t n_kv_heads, int threads) {
  return fit<false>(queries, n_kv_heads, threads);
}

std::vector<std::vector<double>> fit_qfilters_ref(const Tensor3& queries, std::size_t n_kv_heads) {
  return fit<true>(queries, n_kv_heads, 1);
}

std::vector<double> qfilter_scores(const Tensor3& key, std::size_t h, const std::vector<double>& filter) {
  const std::size_t T = key.dim1(), d = key.dim2();
  if (filter.size() != d) throw std::logic_error("qfilter_scores: filter length is not head_dim");
  std::vector<double> out(T);
  for (std::size_t t = 0; t < T; ++t) {
    const float* k = key.row(h, t);
    double s = 0.0;
    for (std::size_t c = 0; c < d; ++c) s += filter[c] * static_cast<double>(k[c]);
    out[t] = -s;
  }
  return out;
}

}  // namespace akv
