#include "akv/quant/affine.h"

#include <algorithm>
#include <cmath>

#include "akv/core/errors.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

std::string num(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

void check_args(int bits, std::size_t group) {
  check_bits(bits, "bits");
  if (group == 0) throw InvalidInput("group size must be >= 1", {"", "group_size", "0"});
}

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

inline std::uint8_t encode(float x, float zero, float inv_scale, float max_code) {
  const float q = std::nearbyint((x - zero) * inv_scale);
  return static_cast<std::uint8_t>(std::clamp(q, 0.0f, max_code));
}

// x^ = zero + code * scale as one fused multiply-add, in every path (no contraction ambiguity).
inline float decode(std::uint8_t code, float scale, float zero) {
  return std::fma(static_cast<float>(code), scale, zero);
}

inline float inverse(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

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
  throw UsageError("unknown quantization axis (expected channel or token)", {"", "axis", name});
}

GroupParams group_params(float min, float max, int bits) {
  const float zero = f16_round_down(min);
  if (!std::isfinite(zero) || !std::isfinite(f16_round_up(max))) {
    throw InvalidInput("value beyond the f16 range of quantization parameters",
                       {"", "group min/max", num(min) + " / " + num(max)});
  }
  const float levels = static_cast<float>((1 << bits) - 1);
  const float scale = f16_round_up((max - zero) / levels);
  if (!std::isfinite(scale)) {
    throw InvalidInput("group range beyond the f16 range of quantization parameters",
                       {"", "group min/max", num(min) + " / " + num(max)});
  }
  return {scale, zero};
}

std::size_t QuantizedBlock::n_groups() const {
  if (rows == 0 || cols == 0) return 0;
  return axis == QuantAxis::channel ? ceil_div(rows, group) * cols : rows * ceil_div(cols, group);
}

QuantizedBlock quantize_block_ref(const float* x, std::size_t rows, std::size_t cols,
                                  QuantAxis axis, int bits, std::size_t group) {
  check_args(bits, group);
  QuantizedBlock q = empty_block(rows, cols, axis, bits, group);
  std::vector<std::uint8_t> codes;
  codes.reserve(rows * cols);
  const float max_code = static_cast<float>((1 << bits) - 1);
  // Visit groups in their storage order; each group is a list of element offsets.
  std::vector<std::size_t> idx;
  std::size_t g = 0;
  auto quantize_group = [&]() {
    float lo = x[idx[0]], hi = x[idx[0]];
    for (std::size_t i : idx) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const GroupParams p = group_params(lo, hi, bits);
    const float inv = inverse(p.scale);
    for (std::size_t i : idx) codes.push_back(encode(x[i], p.zero, inv, max_code));
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
  std::size_t k = 0, g = 0;
  auto put = [&](std::size_t i) {
    out[i] = decode(codes[k++], f16_to_f32_ref(q.scale[g]), f16_to_f32_ref(q.zero[g]));
  };
  if (q.axis == QuantAxis::channel) {
    for (std::size_t t0 = 0; t0 < q.rows; t0 += q.group) {
      for (std::size_t c = 0; c < q.cols; ++c, ++g) {
        for (std::size_t t = t0; t < std::min(q.rows, t0 + q.group); ++t) put(t * q.cols + c);
      }
    }
  } else {
    for (std::size_t t = 0; t < q.rows; ++t) {
      for (std::size_t c0 = 0; c0 < q.cols; c0 += q.group, ++g) {
        for (std::size_t c = c0; c < std::min(q.cols, c0 + q.group); ++c) put(t * q.cols + c);
      }
    }
  }
}

QuantizedBlock quantize_block(const float* x, std::size_t rows, std::size_t cols, QuantAxis axis,
                              int bits, std::size_t group) {
  check_args(bits, group);
  QuantizedBlock q = empty_block(rows, cols, axis, bits, group);
  std::vector<std::uint8_t> codes(rows * cols);
  const float max_code = static_cast<float>((1 << bits) - 1);
  if (axis == QuantAxis::channel) {
    // Per token group: column min/max with contiguous row sweeps, then codes row by row into a
    // [cols, n] staging tile that is already in storage order.
    std::vector<float> lo(cols), hi(cols), zero(cols), inv(cols);
    std::size_t g = 0, k = 0;
    for (std::size_t t0 = 0; t0 < rows; t0 += group) {
      const std::size_t n = std::min(group, rows - t0);
      std::copy_n(x + t0 * cols, cols, lo.data());
      std::copy_n(x + t0 * cols, cols, hi.data());
      for (std::size_t t = t0 + 1; t < t0 + n; ++t) {
        const float* r = x + t * cols;
        for (std::size_t c = 0; c < cols; ++c) {
          lo[c] = std::min(lo[c], r[c]);
          hi[c] = std::max(hi[c], r[c]);
        }
      }
      for (std::size_t c = 0; c < cols; ++c, ++g) {
        const GroupParams p = group_params(lo[c], hi[c], bits);
        zero[c] = p.zero;
        inv[c] = inverse(p.scale);
        q.scale[g] = f32_to_f16_ref(p.scale);
        q.zero[g] = f32_to_f16_ref(p.zero);
      }
      std::uint8_t* tile = codes.data() + k;  // [cols, n]
      for (std::size_t i = 0; i < n; ++i) {
        const float* r = x + (t0 + i) * cols;
        for (std::size_t c = 0; c < cols; ++c) tile[c * n + i] = encode(r[c], zero[c], inv[c], max_code);
      }
      k += n * cols;
    }
  } else {
    std::size_t g = 0;
    for (std::size_t t = 0; t < rows; ++t) {
      const float* r = x + t * cols;
      std::uint8_t* out = codes.data() + t * cols;
      for (std::size_t c0 = 0; c0 < cols; c0 += group, ++g) {
        const std::size_t c1 = std::min(cols, c0 + group);
        const auto [mn, mx] = std::minmax_element(r + c0, r + c1);
        const GroupParams p = group_params(*mn, *mx, bits);
        const float inv = inverse(p.scale);
        for (std::size_t c = c0; c < c1; ++c) out[c] = encode(r[c], p.zero, inv, max_code);
        q.scale[g] = f32_to_f16_ref(p.scale);
        q.zero[g] = f32_to_f16_ref(p.zero);
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
    std::size_t k = 0, g = 0;
    for (std::size_t t0 = 0; t0 < q.rows; t0 += q.group) {
      const std::size_t n = std::min(q.group, q.rows - t0);
      const std::uint8_t* tile = codes.data() + k;  // [cols, n]
      const float* s = scale.data() + g;
      const float* z = zero.data() + g;
      for (std::size_t i = 0; i < n; ++i) {
        float* r = out + (t0 + i) * q.cols;
        for (std::size_t c = 0; c < q.cols; ++c) r[c] = decode(tile[c * n + i], s[c], z[c]);
      }
      k += n * q.cols;
      g += q.cols;
    }
  } else {
    std::size_t g = 0;
    for (std::size_t t = 0; t < q.rows; ++t) {
      const std::uint8_t* code = codes.data() + t * q.cols;
      float* r = out + t * q.cols;
      for (std::size_t c0 = 0; c0 < q.cols; c0 += q.group, ++g) {
        const std::size_t c1 = std::min(q.cols, c0 + q.group);
        const float s = scale[g], z = zero[g];
        for (std::size_t c = c0; c < c1; ++c) r[c] = decode(code[c], s, z);
      }
    }
  }
}

}  // namespace akv
