#include "akv/kv/tensor_builder.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "akv/core/errors.h"
#include "akv/kv/ggml_cache.h"
#include "akv/method/ggml_params.h"
#include "akv/quant/outliers.h"
#include "akv/tensor/half.h"

namespace akv {

TensorBuilder head_tensor_builder(std::size_t head_dim, const QuantParams& p, bool key, const RopeContext* rope) {
  const std::string& type = key ? p.key.type : p.value.type;
  if (!type.empty()) {
    const std::string field = std::string(key ? "key" : "value") + " type " + type;
    const HeadType t = parse_head_type(type, "", field);
    const GgmlTypeInfo& info = ggml_cache_type(t.name, head_dim, "", field + ": head_dim");
    check_ggml_head_dim(info, head_dim, "", field + ": head_dim");
    return TensorBuilder(head_dim, info, head_type_rotation(t, p.rotate, p.rotate_seed, info, head_dim, key));
  }
  if (p.method == Quantizer::nuq) {
    if (!p.nuq_key || !p.nuq_value) throw UsageError("nuq needs calibration=calib.json to code rows", {"", "calibration", ""});
    return key ? TensorBuilder(head_dim, p.nuq_key, p.pre_rope, rope) : TensorBuilder(head_dim, p.nuq_value, false, rope);
  }
  if (!key) return TensorBuilder(head_dim, p.value, p, 0, false, rope, p.rotation(head_dim, false));
  const std::size_t n_out = p.quantized() ? outlier_count(p.outlier_fraction, head_dim) : 0;
  return TensorBuilder(head_dim, p.key, p, n_out, p.pre_rope, rope, p.rotation(head_dim, true));
}

TensorBuilder::TensorBuilder(std::size_t head_dim, DenseType dense) : d_(head_dim), store_(head_dim, dense) {}

TensorBuilder::TensorBuilder(std::size_t head_dim, const TensorQuant& t, const QuantParams& p,
                             std::size_t n_outlier, bool pre_rope, const RopeContext* rope, const Rotation& rot)
    : d_(head_dim), quantize_(p.quantized()), t_(t), p_(p), n_out_(n_outlier), pre_rope_(pre_rope),
      rope_(pre_rope ? rope : nullptr), rot_(rot), store_(head_dim, DenseType::f16) {
  if (p.method == Quantizer::nuq) throw std::logic_error("TensorBuilder: nuq rows take the NuqTable constructor");
  if (rot_.active() && pre_rope) {
    throw InvalidInput("rotation needs keys after RoPE (not with pre-rope)", {"", "--rotate", rotation_name(rot_.kind)});
  }
  store_.set_rotation(rot_);
}

TensorBuilder::TensorBuilder(std::size_t head_dim, std::shared_ptr<const NuqTable> table, bool pre_rope,
                             const RopeContext* rope)
    : d_(head_dim), quantize_(true), pre_rope_(pre_rope), rope_(pre_rope ? rope : nullptr), nuq_(std::move(table)),
      store_(head_dim, DenseType::f16) {
  if (!nuq_) throw std::logic_error("TensorBuilder: nuq rows need a table");
}

TensorBuilder::TensorBuilder(std::size_t head_dim, const GgmlTypeInfo& type, const Rotation& rot)
    : d_(head_dim), ggml_(&type), rot_(rot), store_(head_dim, DenseType::f16) {
  store_.set_rotation(rot_);
}

void TensorBuilder::append(const float* src, const float* post, const std::int32_t* pos, std::size_t n) {
  if (!rot_.active()) {
    append_rows(src, post, pos, n);
    return;
  }
  rotated_.assign(src, src + n * d_);
  rotate_rows(rot_, rotated_.data(), n, d_);
  if (post != src) {
    rotated_.insert(rotated_.end(), post, post + n * d_);
    rotate_rows(rot_, rotated_.data() + n * d_, n, d_);
  }
  append_rows(rotated_.data(), rotated_.data() + (post != src ? n * d_ : 0), pos, n);
  if (n > 1) {  // a prompt's rows: the scratch does not outlive the call (decode steps keep theirs)
    rotated_.clear();
    rotated_.shrink_to_fit();
  }
}

void TensorBuilder::set_scale(float scale) {
  store_.set_ggml_scale(scale);
  scale_set_ = true;
}

float TensorBuilder::stored_amax(const float* rows, std::size_t n) const {
  std::vector<float> x(rows, rows + n * d_);
  rotate_rows(rot_, x.data(), n, d_);
  float a = 0.0f;
  for (const float v : x) a = std::max(a, std::fabs(v));
  return a;
}

float fp8_scale_for(float amax, Fp8Format f) { return amax > 0.0f && std::isfinite(amax) ? amax / fp8_max(f) : 1.0f; }

void TensorBuilder::append_rows(const float* src, const float* post, const std::int32_t* pos, std::size_t n) {
  if (ggml_) {
    if (const auto f = fp8_format_of(*ggml_); f && !scale_set_ && n > 0) {  // the first rows set the scale
      float a = 0.0f;
      for (std::size_t i = 0; i < n * d_; ++i) a = std::max(a, std::fabs(post[i]));
      set_scale(fp8_scale_for(a, *f));
    }
    store_.append_ggml(*ggml_, post, n);
    return;
  }
  if (nuq_) {
    const std::size_t first = store_.rows();
    store_.append_nuq(nuq_, src, n, pos);
    if (rope_) {  // pre-RoPE keys: attention reads the decoded rows rotated
      mirror_.resize((first + n) * d_);
      dequantize_rows(store_.view(), d_, first, first + n, mirror_.data() + first * d_);
      for (std::size_t r = 0; r < n; ++r) {
        apply_rope(mirror_.data() + (first + r) * d_, 1, static_cast<std::size_t>(pos[r]), rope_->layout, *rope_->table);
      }
    }
    return;
  }
  if (quantize_ && store_.dense_rows() == 0) {
    // Nothing waits in the window: the rows due for quantization go straight from `src` (a whole
    // prompt is not copied into the window first).
    const std::size_t have = rows(), target = quantized_rows(have + n, t_, p_);
    const std::size_t m = target > have ? std::min(n, target - have) : 0;
    if (m > 0) {
      if (rope_) mirror_.resize((have + m) * d_);
      quantize(src, pos, m);
      src += m * d_;
      post += m * d_;
      pos += m;
      n -= m;
    }
  }
  if (n == 0) return;
  store_.append_dense(post, n);
  if (rope_) {
    for (std::size_t i = 0; i < n * d_; ++i) mirror_.push_back(f16_nearest(post[i]));
  }
  if (quantize_) {
    pending_.insert(pending_.end(), src, src + n * d_);
    positions_.insert(positions_.end(), pos, pos + n);
    quantize_ready();
  }
}

void TensorBuilder::swap_remove(std::size_t i) {
  store_.swap_remove_dense(i);
  if (rope_) {
    std::copy(mirror_.end() - static_cast<std::ptrdiff_t>(d_), mirror_.end(),
              mirror_.begin() + static_cast<std::ptrdiff_t>(i * d_));
    mirror_.resize(mirror_.size() - d_);
  }
}

void TensorBuilder::retain(const std::vector<std::size_t>& rows) {
  if (quantize_ || ggml_) throw std::logic_error("TensorBuilder::retain: dense rows only");
  store_.retain_dense(rows);
  if (rope_) {
    for (std::size_t j = 0; j < rows.size(); ++j) {
      std::copy_n(mirror_.begin() + static_cast<std::ptrdiff_t>(rows[j] * d_), d_,
                  mirror_.begin() + static_cast<std::ptrdiff_t>(j * d_));
    }
    mirror_.resize(rows.size() * d_);
  }
}

PackedTensor TensorBuilder::take() {
  store_.set_pre_rope(pre_rope());
  return std::move(store_);
}

TensorView TensorBuilder::view() const {
  if (!rope_) return store_.view();
  TensorView v;
  v.dense = {DenseType::f32, mirror_.data(), rows()};
  return v;
}

void TensorBuilder::quantize(const float* src, const std::int32_t* pos, std::size_t m) {
  const std::size_t first = store_.packed_rows(), cols = d_ - n_out_;
  if (n_out_ > 0 && outliers_.empty()) {
    // Channels with the largest variance over the first rows quantized, kept from then on.
    outliers_ = select_outlier_channels(src, m, d_, n_out_);
  }
  if (n_out_ == 0) {
    store_.append_packed(quantize_block(src, m, cols, t_.axis, t_.bits, t_.group, p_.rule), outliers_, nullptr);
  } else {
    std::vector<float> in(m * cols), out_f32(m * n_out_);
    split_outliers(src, m, d_, outliers_, in.data(), out_f32.data());
    std::vector<std::uint16_t> out(m * n_out_);
    f32_to_f16(out_f32.data(), out.data(), out.size());
    store_.append_packed(quantize_block(in.data(), m, cols, t_.axis, t_.bits, t_.group, p_.rule), outliers_,
                         out.data());
  }
  if (rope_) {
    std::vector<float> deq(m * d_);
    dequantize_rows(store_.view(), d_, first, first + m, deq.data());
    for (std::size_t r = 0; r < m; ++r) {
      float* row = mirror_.data() + (first + r) * d_;
      std::copy_n(deq.data() + r * d_, d_, row);
      apply_rope(row, 1, static_cast<std::size_t>(pos[r]), rope_->layout, *rope_->table);
    }
  }
}

void TensorBuilder::quantize_ready() {
  const std::size_t n_quant = store_.packed_rows(), target = quantized_rows(rows(), t_, p_);
  if (target <= n_quant) return;
  const std::size_t m = target - n_quant;
  quantize(pending_.data() + pending_front_ * d_, positions_.data() + pending_front_, m);
  store_.drop_dense_front(m);
  // Quantized rows leave the front; they are moved out once they are as many as the rows left
  // (O(1) amortized per row, as PackedTensor's dense rows).
  pending_front_ += m;
  if (pending_front_ * 2 >= positions_.size()) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_front_ * d_));
    positions_.erase(positions_.begin(), positions_.begin() + static_cast<std::ptrdiff_t>(pending_front_));
    pending_front_ = 0;
  }
}

}  // namespace akv
