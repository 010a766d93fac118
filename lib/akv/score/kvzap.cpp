#include "akv/score/kvzap.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include <Eigen/Cholesky>

namespace akv {

void kvzap_layer_scores(const KvzapLayer& layer, const RowMatrix& input, std::vector<std::vector<double>>& scores,
                        std::size_t first) {
  const std::size_t H = layer.weight.size(), n = static_cast<std::size_t>(input.rows());
  const std::size_t dim = static_cast<std::size_t>(input.cols());
  scores.resize(H);
  for (auto& s : scores) s.resize(std::max(s.size(), first + n), 0.0);
  for (std::size_t h = 0; h < H; ++h) {
    const std::vector<double>& w = layer.weight[h];
    if (w.size() != dim) throw std::logic_error("kvzap_layer_scores: weight row is not the input's width");
    for (std::size_t t = 0; t < n; ++t) {
      const float* x = input.row(static_cast<Eigen::Index>(t)).data();
      double s = layer.bias[h];
      for (std::size_t j = 0; j < dim; ++j) s += w[j] * static_cast<double>(x[j]);
      scores[h][first + t] = s;
    }
  }
}

RidgeAccumulator::RidgeAccumulator(std::size_t dim, std::size_t targets)
    : dim_(dim),
      targets_(targets),
      xx_(Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(dim), static_cast<Eigen::Index>(dim))),
      xy_(Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(dim), static_cast<Eigen::Index>(targets))),
      sx_(Eigen::VectorXd::Zero(static_cast<Eigen::Index>(dim))),
      sy_(Eigen::VectorXd::Zero(static_cast<Eigen::Index>(targets))),
      yy_(Eigen::VectorXd::Zero(static_cast<Eigen::Index>(targets))) {}

void RidgeAccumulator::add(const RowMatrix& x, const std::vector<std::vector<double>>& y, std::size_t first) {
  const std::size_t n = static_cast<std::size_t>(x.rows());
  if (static_cast<std::size_t>(x.cols()) != dim_ || y.size() != targets_) {
    throw std::logic_error("RidgeAccumulator::add: block shape differs from the accumulator's");
  }
  if (first >= n) return;
  const Eigen::Index m = static_cast<Eigen::Index>(n - first);
  const Eigen::MatrixXd xd = x.bottomRows(m).cast<double>();
  Eigen::MatrixXd yd(m, static_cast<Eigen::Index>(targets_));
  for (std::size_t k = 0; k < targets_; ++k) {
    if (y[k].size() != n) throw std::logic_error("RidgeAccumulator::add: a target is not n long");
    for (Eigen::Index i = 0; i < m; ++i) yd(i, static_cast<Eigen::Index>(k)) = y[k][first + static_cast<std::size_t>(i)];
  }
  xx_.selfadjointView<Eigen::Lower>().rankUpdate(xd.transpose());
  xy_.noalias() += xd.transpose() * yd;
  sx_ += xd.colwise().sum().transpose();
  sy_ += yd.colwise().sum().transpose();
  yy_ += yd.colwise().squaredNorm().transpose();
  n_ += static_cast<std::size_t>(m);
}

KvzapLayer RidgeAccumulator::solve(double alpha) const {
  if (n_ == 0) throw std::logic_error("RidgeAccumulator::solve: no rows");
  const double n = static_cast<double>(n_);
  const Eigen::VectorXd mx = sx_ / n, my = sy_ / n;
  Eigen::MatrixXd a = xx_.selfadjointView<Eigen::Lower>();
  a -= n * mx * mx.transpose();
  a.diagonal().array() += alpha;
  const Eigen::MatrixXd rhs = xy_ - n * mx * my.transpose();
  const Eigen::LLT<Eigen::MatrixXd> llt(a);
  if (llt.info() != Eigen::Success) throw std::logic_error("RidgeAccumulator::solve: not positive definite");
  const Eigen::MatrixXd w = llt.solve(rhs);  // [dim, targets]
  KvzapLayer out;
  out.weight.assign(targets_, std::vector<double>(dim_));
  out.bias.resize(targets_);
  for (std::size_t k = 0; k < targets_; ++k) {
    const Eigen::Index kk = static_cast<Eigen::Index>(k);
    for (std::size_t j = 0; j < dim_; ++j) out.weight[k][j] = w(static_cast<Eigen::Index>(j), kk);
    out.bias[k] = my(kk) - w.col(kk).dot(mx);
  }
  return out;
}

std::vector<double> RidgeAccumulator::r2(const KvzapLayer& fit) const {
  const double n = static_cast<double>(n_);
  const Eigen::VectorXd mx = sx_ / n;
  const Eigen::MatrixXd cxx = Eigen::MatrixXd(xx_.selfadjointView<Eigen::Lower>()) - n * mx * mx.transpose();
  std::vector<double> out(targets_);
  for (std::size_t k = 0; k < targets_; ++k) {
    const Eigen::Index kk = static_cast<Eigen::Index>(k);
    const double my = sy_(kk) / n;
    const Eigen::Map<const Eigen::VectorXd> w(fit.weight[k].data(), static_cast<Eigen::Index>(dim_));
    const double syy = yy_(kk) - n * my * my;                       // centred sum of squares
    const double sxy = w.dot(xy_.col(kk) - n * mx * my);            // w . X_c^T y_c
    const double sse = std::max(0.0, syy - 2 * sxy + w.dot(cxx * w));  // the intercept centres the residual
    out[k] = syy > 0 ? 1.0 - sse / syy : (sse == 0 ? 1.0 : 0.0);
  }
  return out;
}

KvzapLayer ridge_fit_ref(const std::vector<std::vector<double>>& x, const std::vector<std::vector<double>>& y,
                         double alpha) {
  const std::size_t n = x.size(), dim = x.at(0).size(), T = y.at(0).size();
  std::vector<double> mx(dim, 0.0), my(T, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < dim; ++j) mx[j] += x[i][j] / static_cast<double>(n);
    for (std::size_t k = 0; k < T; ++k) my[k] += y[i][k] / static_cast<double>(n);
  }
  // Augmented system [A | B], A = X_c^T X_c + alpha I, B = X_c^T Y_c.
  std::vector<std::vector<double>> a(dim, std::vector<double>(dim + T, 0.0));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t r = 0; r < dim; ++r) {
      const double xr = x[i][r] - mx[r];
      for (std::size_t c = 0; c < dim; ++c) a[r][c] += xr * (x[i][c] - mx[c]);
      for (std::size_t k = 0; k < T; ++k) a[r][dim + k] += xr * (y[i][k] - my[k]);
    }
  }
  for (std::size_t r = 0; r < dim; ++r) a[r][r] += alpha;
  for (std::size_t c = 0; c < dim; ++c) {
    std::size_t p = c;
    for (std::size_t r = c + 1; r < dim; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
    }
    std::swap(a[c], a[p]);
    for (std::size_t r = c + 1; r < dim; ++r) {
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k < dim + T; ++k) a[r][k] -= f * a[c][k];
    }
  }
  KvzapLayer out;
  out.weight.assign(T, std::vector<double>(dim, 0.0));
  out.bias.assign(T, 0.0);
  for (std::size_t k = 0; k < T; ++k) {
    for (std::size_t r = dim; r-- > 0;) {
      double s = a[r][dim + k];
      for (std::size_t c = r + 1; c < dim; ++c) s -= a[r][c] * out.weight[k][c];
      out.weight[k][r] = s / a[r][r];
    }
    double b = my[k];
    for (std::size_t j = 0; j < dim; ++j) b -= out.weight[k][j] * mx[j];
    out.bias[k] = b;
  }
  return out;
}

}  // namespace akv
