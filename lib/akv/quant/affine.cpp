#include "akv/quant/affine.h"

#include <algorithm>
#include <cmath>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/quant/kernels.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

void check_args(int bits, std::size_t group) {
  check_bits(bits, "bits");
  if (group == 0) throw InvalidInput("group size must be >= 1", {"", "group_size", "0"});
}

inline std::uint8_t encode(float x, float zero, float inv_scale, float max_code) {
  const float q = std::nearbyint((x - zero) * inv_scale);
  return static_cast<std::uint8_t>(std::clamp(q, 0.0f, max_code));
}

// x^ = zero + code * scale as one fused multiply-add, in every path (no contraction ambiguity).
inline float decode(std::uint8_t code, float scale, float zero) {
  return std::fma(static_cast<float>(code), scale, zero);
}

inline float inverse(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }


// The block's values rounded to f16 (the kivi rule's input), or nothing for the bounded rule.
std::vector<float> rule_input(const float* x, std::size_t n, QuantRule rule, bool ref) {
  if (rule != QuantRule::kivi) return {};
  std::vector<float> h(x, x + n);
  if (ref) {
    for (float& v : h) v = f16_nearest(v);
  } else {
    round_through_f16(h.data(), h.size());
  }
  return h;
}

QuantizedBlock empty_block(std::size_t rows, std::size_t cols, QuantAxis axis, int bits,
                           std::size_t group) {
  QuantizedBlock q;
  q.bits = bits;
  q.axis = axis;
  q.rows = rows;
  q.cols = cols;
  q.group = group;
  q.scale.resize(q.n_groups());
  q.zero.resize(q.n_groups());
  return q;
}

}  // namespace

std::string quant_axis_name(QuantAxis a) { return a == QuantAxis::channel ? "channel" : "token"; }

QuantAxis parse_quant_axis(const std::string& name) {
  if (name == "channel") return QuantAxis::channel;
  if (name == "token") return QuantAxis::token;
  throw InvalidInput("unknown quantization axis (expected channel or token)", {"", "axis", name});
}

std::string quant_rule_name(QuantRule r) { return r == QuantRule::kivi ? "kivi" : "bounded"; }

QuantRule parse_quant_rule(const std::string& name) {
  if (name == "kivi") return QuantRule::kivi;
  if (name == "bounded") return QuantRule::bounded;
  throw InvalidInput("unknown quantization rule (expected kivi or bounded)", {"", "quant_rule", name});
}

GroupParams group_params_kivi(float min, float max, int bits) {
  if (!std::isfinite(min) || !std::isfinite(max)) {
    throw InvalidInput("value beyond the f16 range of quantization parameters",
                       {"", "group min/max", format_number(min) + " / " + format_number(max)});
  }
  const float range = f16_nearest(max - min);
  if (!std::isfinite(range)) {
    throw InvalidInput("group range beyond the f16 range of quantization parameters",
                       {"", "group min/max", format_number(min) + " / " + format_number(max)});
  }
  return {f16_nearest(range / static_cast<float>((1 << bits) - 1)), min};
}

GroupParams group_params(float min, float max, int bits) {
  const float zero = f16_round_down(min);
  if (!std::isfinite(zero) || !std::isfinite(f16_round_up(max))) {
    throw InvalidInput("value beyond the f16 range of quantization parameters",
                       {"", "group min/max", format_number(min) + " / " + format_number(max)});
  }
  const float levels = static_cast<float>((1 << bits) - 1);
  const float scale = f16_round_up((max - zero) / levels);
  if (!std::isfinite(scale)) {
    throw InvalidInput("group range beyond the f16 range of quantization parameters",
                       {"", "group min/max", format_number(min) + " / " + format_number(max)});
  }
  return {scale, zero};
}

std::size_t QuantizedBlock::n_groups() const {
  if (rows == 0 || cols == 0) return 0;
  return axis == QuantAxis::channel ? ceil_div(rows, group) * cols : rows * ceil_div(cols, group);
}

QuantizedBlock quantize_block_ref(const float* x, std::size_t rows, std::size_t cols,
                                  QuantAxis axis, int bits, std::size_t group, QuantRule rule) {
  check_args(bits, group);
  QuantizedBlock q = empty_block(rows, cols, axis, bits, group);
  const std::vector<float> h = rule_input(x, rows * cols, rule, true);
  if (!h.empty()) x = h.data();
  std::vector<std::uint8_t> codes(rows * cols);  // row-major, like x
  const float max_code = static_cast<float>((1 << bits) - 1);
  // Visit groups in their parameter order; each group is a list of element offsets.
  std::vector<std::size_t> idx;
  std::size_t g = 0;
  auto quantize_group = [&]() {
    float lo = x[idx[0]], hi = x[idx[0]];
    for (std::size_t i : idx) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    if (rule == QuantRule::kivi) {
      const GroupParams p = group_params_kivi(lo, hi, bits);
      for (std::size_t i : idx) codes[i] = kernels::encode_kivi_one(x[i], p.zero, p.scale, max_code);
      q.scale[g] = f32_to_f16_ref(p.scale);
      q.zero[g] = f32_to_f16_ref(p.zero);
      ++g;
      return;
    }
    const GroupParams p = group_params(lo, hi, bits);
    const float inv = inverse(p.scale);
    for (std::size_t i : idx) codes[i] = encode(x[i], p.zero, inv, max_code);
    q.scale[g] = f32_to_f16_ref(p.scale);
    q.zero[g] = f32_to_f16_ref(p.zero);
    ++g;
  };
  if (axis == QuantAxis::channel) {
    for (std::size_t t0 = 0; t0 < rows; t0 += group) {
      for (std::size_t c = 0; c < cols; ++c) {
        idx.clear();
        for (std::size_t t = t0; t < std::min(rows, t0 + group); ++t) idx.push_back(t * cols + c);
        quantize_group();
      }
    }
  } else {
    for (std::size_t t = 0; t < rows; ++t) {
      for (std::size_t c0 = 0; c0 < cols; c0 += group) {
        idx.clear();
        for (std::size_t c = c0; c < std::min(cols, c0 + group); ++c) idx.push_back(t * cols + c);
        quantize_group();
      }
    }
  }
  q.codes.resize(packed_size(codes.size(), bits));
  pack_codes_ref(codes.data(), codes.size(), bits, q.codes.data());
  return q;
}

void dequantize_block_ref(const QuantizedBlock& q, float* out) {
  std::vector<std::uint8_t> codes(q.rows * q.cols);
  unpack_codes_ref(q.codes.data(), codes.size(), q.bits, codes.data());
  const std::size_t groups_per_row = ceil_div(q.cols, q.group);
  for (std::size_t t = 0; t < q.rows; ++t) {
    for (std::size_t c = 0; c < q.cols; ++c) {
      const std::size_t g = q.axis == QuantAxis::channel ? (t / q.group) * q.cols + c
                                                         : t * groups_per_row + c / q.group;
      const std::size_t i = t * q.cols + c;
      out[i] = decode(codes[i], f16_to_f32_ref(q.scale[g]), f16_to_f32_ref(q.zero[g]));
    }
  }
}

namespace {
// Rows of a token-axis block processed per parameter batch (keeps the batch in L1).
constexpr std::size_t kTokenRowsPerBatch = 64;
}  // namespace

QuantizedBlock quantize_block(const float* x, std::size_t rows, std::size_t cols, QuantAxis axis,
                              int bits, std::size_t group, QuantRule rule) {
  check_args(bits, group);
  QuantizedBlock q = empty_block(rows, cols, axis, bits, group);
  const std::vector<float> h = rule_input(x, rows * cols, rule, false);
  if (!h.empty()) x = h.data();
  const bool kivi = rule == QuantRule::kivi;
  std::vector<std::uint8_t> codes(rows * cols);
  const float max_code = static_cast<float>((1 << bits) - 1);
  // Parameters of n groups: zero and, per rule, 1/scale (bounded) or scale (kivi) as f32.
  auto params = [&](const float* lo, const float* hi, std::size_t n, float* zero, float* sc,
                    std::size_t g0) {
    if (kivi) {
      kernels::group_params_kivi_many(lo, hi, n, bits, zero, sc, q.scale.data() + g0, q.zero.data() + g0);
    } else {
      kernels::group_params_many(lo, hi, n, bits, zero, sc, q.scale.data() + g0, q.zero.data() + g0);
    }
  };
  if (axis == QuantAxis::channel) {
    // Per token group: column ranges, one parameter batch over the columns, then each row is
    // encoded against per-column parameters.
    std::vector<float> lo(cols), hi(cols), zero(cols), sc(cols);
    for (std::size_t t0 = 0, g = 0; t0 < rows; t0 += group, g += cols) {
      const std::size_t n = std::min(group, rows - t0);
      kernels::minmax_columns(x + t0 * cols, n, cols, lo.data(), hi.data());
      params(lo.data(), hi.data(), cols, zero.data(), sc.data(), g);
      for (std::size_t t = t0; t < t0 + n; ++t) {
        kernels::encode_per_element(kivi, x + t * cols, zero.data(), sc.data(), cols, max_code,
                                    codes.data() + t * cols);
      }
    }
  } else {
    const std::size_t per_row = ceil_div(cols, group);
    const std::size_t batch = kTokenRowsPerBatch * per_row;
    std::vector<float> lo(batch), hi(batch), zero(batch), sc(batch);
    for (std::size_t t0 = 0; t0 < rows; t0 += kTokenRowsPerBatch) {
      const std::size_t n = std::min(kTokenRowsPerBatch, rows - t0);
      for (std::size_t t = 0; t < n; ++t) {
        const float* r = x + (t0 + t) * cols;
        for (std::size_t j = 0; j < per_row; ++j) {
          const std::size_t c0 = j * group;
          kernels::minmax_range(r + c0, std::min(group, cols - c0), &lo[t * per_row + j],
                                &hi[t * per_row + j]);
        }
      }
      params(lo.data(), hi.data(), n * per_row, zero.data(), sc.data(), t0 * per_row);
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t off = (t0 + t) * cols;
        for (std::size_t j = 0; j < per_row; ++j) {
          const std::size_t c0 = j * group;
          kernels::encode_broadcast(kivi, x + off + c0, zero[t * per_row + j], sc[t * per_row + j],
                                    std::min(group, cols - c0), max_code, codes.data() + off + c0);
        }
      }
    }
  }
  q.codes.resize(packed_size(codes.size(), bits));
  pack_codes(codes.data(), codes.size(), bits, q.codes.data());
  return q;
}

void dequantize_block(const QuantizedBlock& q, float* out) {
  std::vector<std::uint8_t> codes(q.rows * q.cols);
  unpack_codes(q.codes.data(), codes.size(), q.bits, codes.data());
  std::vector<float> scale(q.scale.size()), zero(q.zero.size());
  f16_to_f32(q.scale.data(), scale.data(), scale.size());
  f16_to_f32(q.zero.data(), zero.data(), zero.size());
  if (q.axis == QuantAxis::channel) {
    for (std::size_t t = 0; t < q.rows; ++t) {
      const std::size_t g = (t / q.group) * q.cols;
      kernels::decode_per_element(codes.data() + t * q.cols, scale.data() + g, zero.data() + g,
                                  q.cols, out + t * q.cols);
    }
  } else {
    for (std::size_t t = 0, g = 0; t < q.rows; ++t) {
      for (std::size_t c0 = 0; c0 < q.cols; c0 += q.group, ++g) {
        const std::size_t off = t * q.cols + c0;
        kernels::decode_broadcast(codes.data() + off, scale[g], zero[g],
                                  std::min(q.group, q.cols - c0), out + off);
      }
    }
  }
}

}  // namespace akv
