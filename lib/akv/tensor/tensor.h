#pragma once
// Dense f32 blocks of K/V/query data, row-major. The common shape is
// [heads, tokens, head_dim]; a "slice" is one head, [tokens, head_dim].
#include <Eigen/Core>
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <vector>

namespace akv {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

class Tensor3 {
 public:
  Tensor3() = default;
  Tensor3(std::size_t d0, std::size_t d1, std::size_t d2)
      : d0_(d0), d1_(d1), d2_(d2), data_(d0 * d1 * d2, 0.0f) {}

  // Gives the tensor shape [d0, d1, d2], keeping its storage when it is large enough (a layer
  // read into the previous layer's buffer touches no fresh pages). Values are left as they were
  // (new elements zero): for callers that overwrite every element.
  void reshape(std::size_t d0, std::size_t d1, std::size_t d2) {
    d0_ = d0, d1_ = d1, d2_ = d2;
    data_.resize(d0 * d1 * d2);
  }

  std::size_t dim0() const { return d0_; }
  std::size_t dim1() const { return d1_; }
  std::size_t dim2() const { return d2_; }
  std::size_t size() const { return data_.size(); }
  bool empty() const { return data_.empty(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  // Row (i, j): d2 contiguous values.
  float* row(std::size_t i, std::size_t j) { return data_.data() + (i * d1_ + j) * d2_; }
  const float* row(std::size_t i, std::size_t j) const {
    return data_.data() + (i * d1_ + j) * d2_;
  }
  float& at(std::size_t i, std::size_t j, std::size_t k) {
    assert(i < d0_ && j < d1_ && k < d2_);
    return data_[(i * d1_ + j) * d2_ + k];
  }
  float at(std::size_t i, std::size_t j, std::size_t k) const {
    assert(i < d0_ && j < d1_ && k < d2_);
    return data_[(i * d1_ + j) * d2_ + k];
  }
  // Rows [first, first + n) of every slice, a new tensor [d0, n, d2] (e.g. a prompt's last queries).
  Tensor3 rows(std::size_t first, std::size_t n) const {
    assert(first + n <= d1_);
    Tensor3 out(d0_, n, d2_);
    for (std::size_t i = 0; i < d0_; ++i) std::copy_n(row(i, first), n * d2_, out.row(i, 0));
    return out;
  }
  // Slice i as an Eigen matrix [d1, d2].
  MatrixMap slice(std::size_t i) {
    return MatrixMap(row(i, 0), static_cast<Eigen::Index>(d1_), static_cast<Eigen::Index>(d2_));
  }
  ConstMatrixMap slice(std::size_t i) const {
    return ConstMatrixMap(row(i, 0), static_cast<Eigen::Index>(d1_),
                          static_cast<Eigen::Index>(d2_));
  }

 private:
  std::size_t d0_ = 0, d1_ = 0, d2_ = 0;
  std::vector<float> data_;  // [d0, d1, d2]
};

}  // namespace akv
