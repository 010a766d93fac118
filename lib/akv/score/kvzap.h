#pragma once
// KVzap (arXiv 2601.07891; kvpress's KVzapPress with its linear model): a KV pair's score is a
// linear function of its token's attention input h (the layer's RMS-normed hidden state, what
// Hugging Face's self_attn receives), one row per KV head: s = W h + b. W and b are fitted per
// layer by ridge regression on the log KVzip+ scores (score/kvzip.h) of calibration dumps (`akv
// calibrate`), as kvpress's kvzap/train.py `train_linear` does with scikit-learn's Ridge (alpha 1,
// with intercept). No second prefill, no queries: a cheap surrogate of KVzip.
//
// Fit, scikit-learn's Ridge(alpha, fit_intercept=True) solved in f64: with the column means m of
// X [n, dim] and ybar of Y [n, targets], (X_c^T X_c + alpha I) W^T = X_c^T Y_c (X_c = X - 1 m^T,
// Y_c likewise), b = ybar - W m. The accumulator keeps the uncentred sums (X^T X, X^T Y, the column
// sums) in f64 and centres them at the end; the reference centres the rows themselves and
// eliminates with partial pivoting. They agree within 1e-9 relative on well-conditioned data
// (tests); scikit-learn run on f32 inputs (as train.py passes them) within f32 rounding.
#include <cstddef>
#include <vector>

#include "akv/tensor/tensor.h"

namespace akv {

// One layer's surrogate.
struct KvzapLayer {
  std::vector<std::vector<double>> weight;  // [n_kv_heads][dim]
  std::vector<double> bias;                 // [n_kv_heads]
};
using KvzapModel = std::vector<KvzapLayer>;  // [layer]

// scores[h][first + t] = b[h] + sum_j W[h][j] input(t, j) (f64, j in order) for every row t of
// input [n, dim]; scores is resized to [n_kv_heads][max(its length, first + n)].
void kvzap_layer_scores(const KvzapLayer& layer, const RowMatrix& input, std::vector<std::vector<double>>& scores,
                        std::size_t first = 0);

// The sufficient statistics of one layer's ridge regression, rows added a block at a time.
class RidgeAccumulator {
 public:
  RidgeAccumulator(std::size_t dim, std::size_t targets);
  // Rows [first, n) of x [n, dim] with their targets y[k][row] (k < targets), the products in f64
  // (Eigen's rank update: the same bits for the same blocks in the same order).
  void add(const RowMatrix& x, const std::vector<std::vector<double>>& y, std::size_t first = 0);
  std::size_t rows() const { return n_; }
  std::size_t dim() const { return dim_; }
  // The fit (alpha > 0; rows() >= 1). std::logic_error when the system is not positive definite.
  KvzapLayer solve(double alpha) const;
  // Coefficient of determination 1 - SSE / SST of `fit` on the accumulated rows, per target
  // (from the sums; a constant target gives 1 when fitted exactly, else 0).
  std::vector<double> r2(const KvzapLayer& fit) const;

 private:
  std::size_t dim_, targets_, n_ = 0;
  Eigen::MatrixXd xx_, xy_;       // [dim, dim] (lower triangle), [dim, targets]
  Eigen::VectorXd sx_, sy_, yy_;  // column sums of X, of Y, of Y squared
};

// The reference: rows x[i] [dim], y[i] [targets], centred explicitly, Gaussian elimination with
// partial pivoting in f64.
KvzapLayer ridge_fit_ref(const std::vector<std::vector<double>>& x, const std::vector<std::vector<double>>& y,
                         double alpha);

}  // namespace akv
