#include "akv/kv/stored_head.h"

#include <algorithm>
#include <cmath>

#include "akv/core/errors.h"
#include "akv/tensor/ggml_quant.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

std::vector<std::uint16_t> to_f16_ref(const float* x, std::size_t n) {
  std::vector<std::uint16_t> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = f32_to_f16_ref(x[i]);
  return h;
}

// The reference of TensorBuilder's affine rows, in one pass over plain loops (rows rotated by
// rotate_rows, whose own reference is rotate_rows_ref).
PackedTensor compress_tensor_ref(const float* src, const float* post, std::size_t n, std::size_t d,
                                 const TensorQuant& t, const QuantParams& p, std::size_t n_outlier, bool pre_rope,
                                 const Rotation& rot, const std::shared_ptr<const NuqTable>& nuq,
                                 const std::vector<std::int32_t>& pos) {
  PackedTensor out(d, DenseType::f16);
  out.set_rotation(rot);
  std::vector<float> rotated;
  if (rot.active()) {  // pre_rope is refused with a rotation: src == post
    rotated.assign(post, post + n * d);
    rotate_rows(rot, rotated.data(), n, d);
    src = post = rotated.data();
  }
  const std::size_t n_quant = quantized_rows(n, t, p);
  out.set_pre_rope(pre_rope && n_quant > 0);
  if (p.method == Quantizer::nuq) {  // nuq_encode is checked against KVQuant's code itself
    if (n > 0) out.append_nuq(nuq, src, n, pos.data());
    return out;
  }
  const auto quantize = quantize_block_ref;
  if (n_quant > 0) {
    if (n_outlier == 0) {
      out.append_packed(quantize(src, n_quant, d, t.axis, t.bits, t.group, p.rule), {}, nullptr);
    } else {
      const std::vector<std::uint16_t> channels = select_outlier_channels(src, n_quant, d, n_outlier);
      const std::size_t cols = d - n_outlier;
      std::vector<float> inliers(n_quant * cols), outliers(n_quant * n_outlier);
      split_outliers(src, n_quant, d, channels, inliers.data(), outliers.data());
      out.append_packed(quantize(inliers.data(), n_quant, cols, t.axis, t.bits, t.group, p.rule), channels,
                        to_f16_ref(outliers.data(), outliers.size()).data());
    }
  }
  const std::vector<std::uint16_t> residual = to_f16_ref(post + n_quant * d, (n - n_quant) * d);
  out.insert_dense_f16(0, residual.data(), n - n_quant);
  return out;
}

void check_head(const HeadInput& in, const QuantParams& p, std::size_t n_out) {
  if (p.pre_rope && !in.key_pre_rope) {
    throw InvalidInput("--pre-rope needs key_pre_rope in the dump", {"", "key_pre_rope", "missing"});
  }
  if (n_out >= in.head_dim && n_out > 0) {
    throw InvalidInput("outlier fraction leaves no channel to quantize",
                       {"", "--outlier-fraction", std::to_string(p.outlier_fraction)});
  }
}

HeadCache head_of(const HeadInput& in) {
  HeadCache h;
  h.n_tokens = in.n_tokens;
  h.head_dim = in.head_dim;
  h.kept = in.kept;
  return h;
}

std::vector<std::int32_t> positions(const HeadInput& in) {
  if (!in.kept.empty()) return in.kept;
  std::vector<std::int32_t> pos(in.n);
  for (std::size_t i = 0; i < in.n; ++i) pos[i] = static_cast<std::int32_t>(i);
  return pos;
}

void rebuild(const PackedTensor& t, float* out) {
  const std::size_t d = t.head_dim();
  const std::size_t n_quant = t.packed_rows(), n_out = t.outlier_channels().size();
  if (t.ggml_type()) {
    ggml_dequantize_scaled(*t.ggml_type(), t.ggml_blocks().data(), t.ggml_rows() * d, t.ggml_scale(), out);
  } else if (t.nuq_table()) {
    nuq_decode(t.nuq_rows().view(*t.nuq_table()), d, 0, t.rows(), out);
  } else if (n_quant > 0) {
    if (n_out == 0) {
      dequantize_block(t.packed_block(), out);
    } else {
      const std::size_t cols = d - n_out;
      std::vector<float> inliers(n_quant * cols), outliers(n_quant * n_out);
      dequantize_block(t.packed_block(), inliers.data());
      f16_to_f32(t.outlier_values().data(), outliers.data(), outliers.size());
      merge_outliers(inliers.data(), outliers.data(), n_quant, d, t.outlier_channels(), out);
    }
  }
  if (t.dense_rows() > 0) f16_to_f32(t.dense_f16(0), out + n_quant * d, t.dense_rows() * d);
  unrotate_rows(t.rotation(), out, t.rows(), d);
}

}  // namespace

CacheBytes HeadCache::bytes() const {
  CacheBytes b = key.stored_bytes();
  b += value.stored_bytes();
  b.indices += 4 * kept.size();  // kept positions, beside the tensors' own (nuq outlier channels)
  for (const HeadCache& s : segments) b += s.bytes();
  return b;
}

HeadCache compress_head(const HeadInput& in, const QuantParams& p) {
  const std::size_t d = in.head_dim, n_out = p.quantized() ? outlier_count(p.outlier_fraction, d) : 0;
  check_head(in, p, n_out);
  const std::vector<std::int32_t> pos = positions(in);
  TensorBuilder key = head_tensor_builder(d, p, true, nullptr);
  TensorBuilder value = head_tensor_builder(d, p, false, nullptr);
  key.append(p.pre_rope ? in.key_pre_rope : in.key, in.key, pos.data(), in.n);
  value.append(in.value, in.value, pos.data(), in.n);
  HeadCache h = head_of(in);
  h.key = key.take();
  h.value = value.take();
  return h;
}

HeadCache compress_head_ref(const HeadInput& in, const QuantParams& p) {
  if (!p.key.type.empty() || !p.value.type.empty()) {
    throw std::logic_error("compress_head_ref: cache types have their own reference (tensor/ggml_quant.h)");
  }
  const std::size_t n_out = p.quantized() ? outlier_count(p.outlier_fraction, in.head_dim) : 0;
  check_head(in, p, n_out);
  HeadCache h = head_of(in);
  const std::vector<std::int32_t> pos = positions(in);
  const float* key_src = p.pre_rope ? in.key_pre_rope : in.key;
  h.key = compress_tensor_ref(key_src, in.key, in.n, in.head_dim, p.key, p, n_out, p.pre_rope,
                              p.rotation(in.head_dim, true), p.nuq_key, pos);
  h.value = compress_tensor_ref(in.value, in.value, in.n, in.head_dim, p.value, p, 0, false,
                                p.rotation(in.head_dim, false), p.nuq_value, pos);
  return h;
}

void reconstruct_head(const HeadCache& h, const RopeContext& rope, float* key, float* value) {
  const std::size_t d = h.head_dim;
  if (!h.segments.empty()) {
    for (const HeadCache& s : h.segments) {
      std::vector<float> k(s.n_kept() * d), v(k.size());
      reconstruct_head(s, rope, k.data(), v.data());
      for (std::size_t i = 0; i < s.n_kept(); ++i) {
        std::copy_n(k.data() + i * d, d, key + s.position(i) * d);
        std::copy_n(v.data() + i * d, d, value + s.position(i) * d);
      }
    }
    return;
  }
  rebuild(h.key, key);
  rebuild(h.value, value);
  if (h.key.pre_rope()) {
    if (!rope.table) throw InvalidInput("pre-RoPE keys need a RoPE table", {"", "rope", ""});
    const std::size_t coded = h.key.nuq_table() ? h.key.rows() : h.key.packed_rows();
    for (std::size_t i = 0; i < coded; ++i) {
      apply_rope(key + i * d, 1, h.position(i), rope.layout, *rope.table);
    }
  }
}

}  // namespace akv
