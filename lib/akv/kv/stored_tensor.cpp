#include "akv/kv/stored_tensor.h"

#include <algorithm>
#include <string_view>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/tensor/ggml_quant.h"
#include "akv/tensor/half.h"

namespace akv {

CacheBytes& CacheBytes::operator+=(const CacheBytes& o) {
  components([&](const char*, auto m) { this->*m += o.*m; });
  return *this;
}

PackedTensor::PackedTensor(std::size_t head_dim, DenseType dense) : d_(head_dim), type_(dense) {
  codes_.assign(kCodePadding, 0);
}

void PackedTensor::append_dense(const float* rows, std::size_t n) {
  if (nuq_table_) throw InvalidInput("nuq rows go alone, under one table", {"", "rows", std::to_string(n)});
  if (type_ == DenseType::f32) {
    dense32_.insert(dense32_.end(), rows, rows + n * d_);
  } else {
    const std::size_t old = dense16_.size();
    dense16_.resize(old + n * d_);
    f32_to_f16(rows, dense16_.data() + old, n * d_);
  }
  dense_rows_ += n;
}

void PackedTensor::append_ggml(const GgmlTypeInfo& type, const float* rows, std::size_t n) {
  const std::size_t at = ggml_blocks_.size(), row_bytes = d_ / type.block * type.bytes;
  append_ggml_blocks(type, nullptr, n);
  if (const auto f = fp8_format_of(type)) {
    fp8_encode_rows(rows, n * d_, ggml_scale_, *f, ggml_blocks_.data() + at);
    note_fp8_rows(type, at, n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) ggml_quantize(type, rows + i * d_, d_, ggml_blocks_.data() + at + i * row_bytes);
}

void PackedTensor::append_nuq(std::shared_ptr<const NuqTable> table, const float* rows, std::size_t n,
                              const std::int32_t* pos) {
  if ((nuq_table_ && nuq_table_ != table) || view_.rows > 0 || dense_rows_ > 0 || ggml_type_ || !table) {
    throw InvalidInput("nuq rows go alone, under one table", {"", "rows", std::to_string(n)});
  }
  nuq_table_ = std::move(table);
  nuq_encode(*nuq_table_, rows, n, d_, nuq_, pos);
}

void PackedTensor::set_nuq(std::shared_ptr<const NuqTable> table, NuqRows rows) {
  if (view_.rows > 0 || dense_rows_ > 0 || ggml_type_ || nuq_.rows > 0 || !table) {
    throw InvalidInput("nuq rows go alone, under one table", {"", "rows", std::to_string(rows.rows)});
  }
  nuq_table_ = std::move(table);
  nuq_ = std::move(rows);
}

void PackedTensor::append_ggml_blocks(const GgmlTypeInfo& type, const std::uint8_t* blocks, std::size_t n) {
  if ((ggml_type_ && ggml_type_ != &type) || view_.rows > 0 || dense_rows_ > 0 || nuq_table_) {
    throw InvalidInput("ggml rows go alone, of one type", {"", "ggml type", type.name});
  }
  ggml_type_ = &type;
  const std::size_t bytes = n * (d_ / type.block * type.bytes);
  if (blocks) {
    const std::size_t at = ggml_blocks_.size();
    ggml_blocks_.insert(ggml_blocks_.end(), blocks, blocks + bytes);
    if (fp8_format_of(type)) note_fp8_rows(type, at, n);
  } else {
    ggml_blocks_.resize(ggml_blocks_.size() + bytes);
  }
  ggml_rows_ += n;
}

void PackedTensor::note_fp8_rows(const GgmlTypeInfo& type, std::size_t at, std::size_t n) {
  if (ggml_finite_) ggml_finite_ = ggml_first_nonfinite(type, ggml_blocks_.data() + at, n * d_) == n * d_;
}

void PackedTensor::take_parameters(const QuantizedBlock& b) {
  view_.bits = b.bits;
  view_.axis = b.axis;
  view_.group = b.group;
  view_.cols = b.cols;
}

void PackedTensor::append_packed(const QuantizedBlock& b,
                                 const std::vector<std::uint16_t>& outlier_channels,
                                 const std::uint16_t* outliers) {
  if (b.rows == 0) return;
  if (view_.rows == 0) {
    take_parameters(b);
    view_.n_outliers = outlier_channels.size();
    outlier_channel_ = outlier_channels;
  } else if (b.bits != view_.bits || b.axis != view_.axis || b.group != view_.group ||
             b.cols != view_.cols || outlier_channels != outlier_channel_ ||
             (b.axis == QuantAxis::channel && view_.rows % view_.group != 0)) {
    throw InvalidInput("packed block does not continue the stored rows (bits, axis, group, "
                       "channels or a partial group)", {"", "block"});
  }
  if (b.cols + outlier_channels.size() != d_) {
    throw InvalidInput("packed block channels + outliers differ from head_dim",
                       {"", "cols", std::to_string(b.cols)});
  }
  const std::size_t n_bits = b.rows * b.cols * static_cast<std::size_t>(b.bits);
  // One reservation for the codes and the padding behind them: geometric for row-by-row
  // appends, exact for a whole prompt (growing twice would double its capacity).
  const std::size_t final_bytes = ceil_div(code_bits_ + n_bits, 8) + kCodePadding;
  if (final_bytes > codes_.capacity()) codes_.reserve(std::max(final_bytes, 2 * codes_.capacity()));
  codes_.resize(ceil_div(code_bits_, 8));
  if (code_bits_ % 8 == 0) {
    codes_.insert(codes_.end(), b.codes.begin(), b.codes.end());
  } else {
    codes_.resize(ceil_div(code_bits_ + n_bits, 8), 0);
    for (std::size_t i = 0; i < n_bits; ++i) {
      if ((b.codes[i / 8] >> (i % 8)) & 1u) {
        const std::size_t o = code_bits_ + i;
        codes_[o / 8] = static_cast<std::uint8_t>(codes_[o / 8] | (1u << (o % 8)));
      }
    }
  }
  code_bits_ += n_bits;
  codes_.resize(ceil_div(code_bits_, 8) + kCodePadding, 0);
  scale_.insert(scale_.end(), b.scale.begin(), b.scale.end());
  zero_.insert(zero_.end(), b.zero.begin(), b.zero.end());
  if (!outlier_channels.empty()) {
    outlier_value_.insert(outlier_value_.end(), outliers, outliers + b.rows * outlier_channels.size());
  }
  view_.rows += b.rows;
}

void PackedTensor::drop_dense_front(std::size_t n) {
  if (n > dense_rows_) throw InvalidInput("dropping more dense rows than stored", {"", "rows", std::to_string(n)});
  front_ += n;
  dense_rows_ -= n;
  if (front_ >= dense_rows_) {
    if (type_ == DenseType::f32) {
      compact(dense32_);
    } else {
      compact(dense16_);
    }
  }
}

template <typename T>
void PackedTensor::compact(std::vector<T>& rows) {
  rows.erase(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(front_ * d_));
  front_ = 0;
}

void PackedTensor::retain_dense(const std::vector<std::size_t>& rows) {
  if (view_.rows > 0 || ggml_rows_ > 0) throw InvalidInput("retaining rows of a tensor that is not all dense", {"", "rows"});
  const auto keep = [&](auto& data) {
    for (std::size_t j = 0; j < rows.size(); ++j) {
      if (rows[j] >= dense_rows_ || (j > 0 && rows[j] <= rows[j - 1])) {
        throw InvalidInput("retained rows must be ascending dense rows", {"", "row", std::to_string(rows[j])});
      }
      std::copy_n(data.begin() + static_cast<std::ptrdiff_t>((front_ + rows[j]) * d_), d_,
                  data.begin() + static_cast<std::ptrdiff_t>((front_ + j) * d_));
    }
    data.resize((front_ + rows.size()) * d_);
  };
  if (type_ == DenseType::f32) {
    keep(dense32_);
  } else {
    keep(dense16_);
  }
  dense_rows_ = rows.size();
}

void PackedTensor::swap_remove_dense(std::size_t i) {
  if (i >= dense_rows_) throw InvalidInput("removing a dense row that is not stored", {"", "row", std::to_string(i)});
  const auto move_last = [&](auto& rows) {
    std::copy(rows.end() - static_cast<std::ptrdiff_t>(d_), rows.end(),
              rows.begin() + static_cast<std::ptrdiff_t>((front_ + i) * d_));
    rows.resize(rows.size() - d_);
  };
  if (type_ == DenseType::f32) {
    move_last(dense32_);
  } else {
    move_last(dense16_);
  }
  --dense_rows_;
}

namespace {

// Groups before row r of a [rows, cols] block quantized along `axis` in groups of g.
std::size_t groups_before(std::size_t r, QuantAxis axis, std::size_t cols, std::size_t g) {
  return axis == QuantAxis::channel ? r / g * cols : r * ceil_div(cols, g);
}

}  // namespace

void PackedTensor::insert_packed(std::size_t row, const QuantizedBlock& b) {
  if (b.rows == 0) return;
  if (view_.rows == 0) take_parameters(b);
  const std::size_t row_bits = b.cols * static_cast<std::size_t>(b.bits);
  const bool aligned = row <= view_.rows && (row * row_bits) % 8 == 0 && (b.rows * row_bits) % 8 == 0 &&
                       (b.axis == QuantAxis::token || (row % b.group == 0 && b.rows % b.group == 0));
  if (b.bits != view_.bits || b.axis != view_.axis || b.group != view_.group || b.cols != view_.cols ||
      b.cols != d_ || view_.n_outliers != 0 || !aligned) {
    throw InvalidInput("packed block does not fit between the stored rows (parameters, channels, "
                       "outliers or a group/byte boundary)", {"", "row", std::to_string(row)});
  }
  codes_.insert(codes_.begin() + static_cast<std::ptrdiff_t>(row * row_bits / 8), b.codes.begin(), b.codes.end());
  const std::size_t g = groups_before(row, b.axis, b.cols, b.group);
  scale_.insert(scale_.begin() + static_cast<std::ptrdiff_t>(g), b.scale.begin(), b.scale.end());
  zero_.insert(zero_.begin() + static_cast<std::ptrdiff_t>(g), b.zero.begin(), b.zero.end());
  code_bits_ += b.rows * row_bits;
  codes_.resize(code_bits_ / 8 + kCodePadding, 0);  // the padding stays behind the stream
  view_.rows += b.rows;
}

void PackedTensor::erase_packed(std::size_t row, std::size_t n) {
  const std::size_t row_bits = view_.cols * static_cast<std::size_t>(view_.bits);
  const bool aligned = row + n <= view_.rows && (row * row_bits) % 8 == 0 && (n * row_bits) % 8 == 0 &&
                       (view_.axis == QuantAxis::token || (row % view_.group == 0 && n % view_.group == 0));
  if (!aligned || view_.n_outliers != 0) {
    throw InvalidInput("packed rows to erase are not whole groups and bytes", {"", "row", std::to_string(row)});
  }
  const auto at = [](auto& v, std::size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
  codes_.erase(at(codes_, row * row_bits / 8), at(codes_, (row + n) * row_bits / 8));
  const std::size_t g0 = groups_before(row, view_.axis, view_.cols, view_.group),
                    g1 = groups_before(row + n, view_.axis, view_.cols, view_.group);
  scale_.erase(at(scale_, g0), at(scale_, g1));
  zero_.erase(at(zero_, g0), at(zero_, g1));
  code_bits_ -= n * row_bits;
  view_.rows -= n;
}

void PackedTensor::insert_dense_f16(std::size_t row, const std::uint16_t* rows, std::size_t n) {
  if (type_ != DenseType::f16 || row > dense_rows_) {
    throw InvalidInput("f16 rows go into f16 storage within its rows", {"", "row", std::to_string(row)});
  }
  dense16_.insert(dense16_.begin() + static_cast<std::ptrdiff_t>((front_ + row) * d_), rows, rows + n * d_);
  dense_rows_ += n;
}

void PackedTensor::erase_dense(std::size_t row, std::size_t n) {
  if (row + n > dense_rows_) throw InvalidInput("erasing dense rows that are not stored", {"", "row", std::to_string(row)});
  const auto erase = [&](auto& v) {
    v.erase(v.begin() + static_cast<std::ptrdiff_t>((front_ + row) * d_),
            v.begin() + static_cast<std::ptrdiff_t>((front_ + row + n) * d_));
  };
  if (type_ == DenseType::f32) {
    erase(dense32_);
  } else {
    erase(dense16_);
  }
  dense_rows_ -= n;
}

QuantizedBlock PackedTensor::packed_block() const {
  QuantizedBlock q;
  q.bits = view_.bits;
  q.axis = view_.axis;
  q.group = view_.group;
  q.rows = view_.rows;
  q.cols = view_.cols;
  q.codes.assign(codes_.begin(), codes_.begin() + static_cast<std::ptrdiff_t>(ceil_div(code_bits_, 8)));
  q.scale = scale_;
  q.zero = zero_;
  return q;
}

const float* PackedTensor::dense_f32(std::size_t row) const { return dense32_.data() + (front_ + row) * d_; }
const std::uint16_t* PackedTensor::dense_f16(std::size_t row) const { return dense16_.data() + (front_ + row) * d_; }

CacheBytes PackedTensor::stored_bytes() const {
  CacheBytes b;
  b.codes = code_bytes() + ggml_blocks_.size();  // a ggml block's scales are inside it
  b.scales = 2 * scale_.size() + (ggml_type_ && fp8_format_of(*ggml_type_) && ggml_rows_ > 0 ? 4 : 0);
  b.zeros = 2 * zero_.size();
  b.outliers = 2 * outlier_value_.size() + (view_.rows > 0 ? 2 * outlier_channel_.size() : 0);
  b.residual = (type_ == DenseType::f32 ? 4 : 2) * dense_rows_ * d_;
  if (nuq_table_ && nuq_.rows > 0) {
    b.codes += nuq_.code_bytes();
    b.scales += nuq_table_->bytes() + nuq_.scale_bytes();
    b.residual += nuq_.sink_bytes();
    b.outliers += nuq_.outlier_bytes();
    b.indices += nuq_.index_bytes();
  }
  return b;
}

TensorView PackedTensor::view() const {
  TensorView t;
  t.rotation = rotation_;
  if (ggml_type_) {
    if (std::string_view(ggml_type_->name) == "F16") {  // the f16 loops read them, as method none's rows
      t.dense = {DenseType::f16, ggml_blocks_.data(), ggml_rows_};
    } else {
      t.ggml = {ggml_type_, ggml_blocks_.data(), ggml_rows_, ggml_scale_, fp8_format_of(*ggml_type_) && ggml_finite_};
    }
    return t;
  }
  if (nuq_table_) {
    t.nuq = nuq_.view(*nuq_table_);
    return t;
  }
  t.packed = view_;
  t.packed.codes = codes_.data();
  t.packed.scale = scale_.data();
  t.packed.zero = zero_.data();
  t.packed.outlier_channel = outlier_channel_.data();
  t.packed.outlier_value = outlier_value_.data();
  t.dense.type = type_;
  t.dense.data = type_ == DenseType::f32 ? static_cast<const void*>(dense32_.data() + front_ * d_)
                                         : static_cast<const void*>(dense16_.data() + front_ * d_);
  t.dense.rows = dense_rows_;
  return t;
}

}  // namespace akv
