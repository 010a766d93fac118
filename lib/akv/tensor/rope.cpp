#include "akv/tensor/rope.h"

#include <algorithm>
#include <cmath>

#include "akv/core/errors.h"

namespace akv {

std::string rope_layout_name(RopeLayout l) {
  return l == RopeLayout::interleaved ? "interleaved" : "rotate-half";
}

RopeLayout parse_rope_layout(const std::string& name) {
  if (name == "interleaved") return RopeLayout::interleaved;
  if (name == "rotate-half") return RopeLayout::rotate_half;
  throw InvalidInput("unknown RoPE layout (expected interleaved or rotate-half)",
                     {"", "rope_layout", name});
}

namespace {

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

// One f32 operation each: the f64 result of two f32 operands is exact (+, -, *) or correctly
// rounded (/), and one more rounding to f32 gives the correctly rounded f32 result (53 >= 2*24+2);
// the conversions also keep the compiler from fusing a multiply and an add.
float f32_mul(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }
float f32_div(float a, float b) { return static_cast<float>(static_cast<double>(a) / static_cast<double>(b)); }
float f32_add(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }
float f32_sub(float a, float b) { return static_cast<float>(static_cast<double>(a) - static_cast<double>(b)); }

void check_theta(double theta) {
  if (!(theta > 1.0) || !std::isfinite(theta)) {
    throw InvalidInput("RoPE theta must be finite and > 1", {"", "rope_theta", format_number(theta)});
  }
}

// 1 / theta^(2i/d) as torch computes 1.0 / (base ** (arange(0, d, 2).float() / d)); with `ext`
// (longrope's factors) 1 / (ext[i] * theta^(2i/d)), the same bits as without when ext[i] = 1.
std::vector<float> default_inv_freq(std::size_t rotary_dim, double theta, const std::vector<float>* ext = nullptr) {
  std::vector<float> freq(rotary_dim / 2);
  for (std::size_t i = 0; i < freq.size(); ++i) {
    const float p = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
    freq[i] = 1.0f / (ext ? f32_mul((*ext)[i], p) : p);
  }
  return freq;
}

}  // namespace

std::string rope_scaling_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::none: return "none";
    case RopeScaling::Kind::linear: return "linear";
    case RopeScaling::Kind::dynamic: return "dynamic";
    case RopeScaling::Kind::llama3: return "llama3";
    case RopeScaling::Kind::yarn: return "yarn";
    case RopeScaling::Kind::longrope: return "longrope";
  }
  return "?";
}

namespace {

std::vector<float> scaled_inv_freq(std::size_t rotary_dim, double theta, const RopeScaling& s,
                                   std::size_t seq_len) {
  switch (s.kind) {
    case RopeScaling::Kind::none:
      return default_inv_freq(rotary_dim, theta);
    case RopeScaling::Kind::linear: {
      std::vector<float> f = default_inv_freq(rotary_dim, theta);
      for (float& v : f) v = f32_div(v, static_cast<float>(s.factor));
      return f;
    }
    case RopeScaling::Kind::dynamic: {
      // transformers: base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)),
      // in Python floats (f64), seq_len = max(seq_len, max_pos).
      const double len = static_cast<double>(std::max(seq_len, s.original_max_positions));
      const double d = static_cast<double>(rotary_dim);
      const double base =
          theta * std::pow(s.factor * len / static_cast<double>(s.original_max_positions) - (s.factor - 1.0),
                           d / (d - 2.0));
      return default_inv_freq(rotary_dim, base);
    }
    case RopeScaling::Kind::llama3: {
      std::vector<float> f = default_inv_freq(rotary_dim, theta);
      const auto old_len = static_cast<double>(s.original_max_positions);
      const auto low_wavelen = static_cast<float>(old_len / s.low_freq_factor);
      const auto high_wavelen = static_cast<float>(old_len / s.high_freq_factor);
      const auto factor = static_cast<float>(s.factor);
      const auto low = static_cast<float>(s.low_freq_factor);
      const auto span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
      for (float& v : f) {
        const float wavelen = f32_div(static_cast<float>(2.0 * kPi), v);
        float scaled = wavelen > low_wavelen ? f32_div(v, factor) : v;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
          // smooth = (old_len / wavelen - low) / (high - low);
          // (1 - smooth) * inv / factor + smooth * inv
          const float smooth = f32_div(f32_sub(f32_div(static_cast<float>(old_len), wavelen), low), span);
          scaled = f32_add(f32_div(f32_mul(f32_sub(1.0f, smooth), scaled), factor), f32_mul(smooth, scaled));
        }
        v = scaled;
      }
      return f;
    }
    case RopeScaling::Kind::longrope: {
      // transformers: 1.0 / (ext_factors * base ** (arange(0, d, 2).float() / d)), f32 tensors.
      const std::vector<float>& ext = seq_len > s.original_max_positions ? s.long_factors : s.short_factors;
      const char* field = seq_len > s.original_max_positions ? "long_factor" : "short_factor";
      if (ext.size() != rotary_dim / 2) {
        throw InvalidInput("longrope factors must number rotary_dim / 2 = " + std::to_string(rotary_dim / 2),
                           {"", std::string("rope_scaling.") + field, std::to_string(ext.size())});
      }
      for (std::size_t i = 0; i < ext.size(); ++i) {
        if (!(ext[i] > 0.0f) || !std::isfinite(ext[i])) {
          throw InvalidInput("longrope factors must be positive and finite",
                             {"", std::string("rope_scaling.") + field + "[" + std::to_string(i) + "]", format_number(ext[i])});
        }
      }
      return default_inv_freq(rotary_dim, theta, &ext);
    }
    case RopeScaling::Kind::yarn: {
      // transformers 4.45 _compute_yarn_parameters: python floats (f64) for the correction
      // range, f32 tensors for the rest.
      const double d = static_cast<double>(rotary_dim);
      const double orig = static_cast<double>(s.original_max_positions);
      auto correction_dim = [&](double rotations) {
        return d * std::log(orig / (rotations * 2.0 * kPi)) / (2.0 * std::log(theta));
      };
      const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
      double high = std::min(std::ceil(correction_dim(s.beta_slow)), d - 1.0);
      if (low == high) high += 0.001;  // the ramp's singularity guard
      const auto span = static_cast<float>(high - low);
      const auto factor = static_cast<float>(s.factor);
      std::vector<float> f(rotary_dim / 2);
      for (std::size_t i = 0; i < f.size(); ++i) {
        const float pos_freq = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
        const float extrapolation = f32_div(1.0f, pos_freq);
        const float interpolation = f32_div(1.0f, f32_mul(factor, pos_freq));
        const float ramp = std::clamp(f32_div(f32_sub(static_cast<float>(i), static_cast<float>(low)), span), 0.0f, 1.0f);
        const float extra = f32_sub(1.0f, ramp);
        f[i] = f32_add(f32_mul(interpolation, f32_sub(1.0f, extra)), f32_mul(extrapolation, extra));
      }
      return f;
    }
  }
  return {};
}

}  // namespace

std::vector<float> rope_inv_freq(std::size_t rotary_dim, double theta, const RopeScaling& s,
                                 std::size_t seq_len) {
  if (rotary_dim == 0 || rotary_dim % 2 != 0) {
    throw InvalidInput("RoPE needs an even rotary dimension", {"", "rotary_dim", std::to_string(rotary_dim)});
  }
  check_theta(theta);
  std::vector<float> f = scaled_inv_freq(rotary_dim, theta, s, seq_len);
  if (!s.freq_factors.empty()) {
    if (s.freq_factors.size() != f.size()) {
      throw InvalidInput("RoPE frequency factors must number rotary_dim / 2 = " + std::to_string(f.size()),
                         {"", "freq_factors", std::to_string(s.freq_factors.size())});
    }
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (!(s.freq_factors[i] > 0.0f) || !std::isfinite(s.freq_factors[i])) {
        throw InvalidInput("RoPE frequency factors must be positive and finite",
                           {"", "freq_factors[" + std::to_string(i) + "]", format_number(s.freq_factors[i])});
      }
      f[i] = f32_div(f[i], s.freq_factors[i]);
    }
  }
  return f;
}

RopeTable::RopeTable(std::size_t head_dim, double theta, std::size_t first_pos, std::size_t n_pos)
    : RopeTable(head_dim, rope_inv_freq(head_dim, theta, RopeScaling{}, 0), first_pos, n_pos) {}

RopeTable::RopeTable(std::size_t head_dim, const std::vector<float>& freq, std::size_t first_pos,
                     std::size_t n_pos, float scale)
    : head_dim_(head_dim), half_(freq.size()), first_pos_(first_pos), n_pos_(n_pos), scale_(scale),
      cos_(n_pos * half_), sin_(n_pos * half_) {
  if (head_dim == 0 || head_dim % 2 != 0 || half_ == 0 || 2 * half_ > head_dim) {
    throw InvalidInput("RoPE needs an even head_dim of at least the rotary dimension",
                       {"", "head_dim", std::to_string(head_dim)});
  }
  for (std::size_t p = 0; p < n_pos; ++p) {
    const float pos = static_cast<float>(first_pos + p);
    for (std::size_t i = 0; i < half_; ++i) {
      const float angle = pos * freq[i];
      cos_[p * half_ + i] = scale == 1.0f ? std::cos(angle) : f32_mul(std::cos(angle), scale);
      sin_[p * half_ + i] = scale == 1.0f ? std::sin(angle) : f32_mul(std::sin(angle), scale);
    }
  }
}

void apply_rope(float* x, std::size_t n, std::size_t first_pos, RopeLayout layout,
                const RopeTable& table, bool inverse) {
  const std::size_t d = table.head_dim();
  const std::size_t rot = table.rotary_dim();
  const std::size_t half = rot / 2;
  if (inverse && table.scale() != 1.0f) {
    throw InvalidInput("RoPE with an attention factor cannot be undone", {"", "rope_scaling", "yarn"});
  }
  if (first_pos < table.first_pos() || first_pos + n > table.first_pos() + table.n_pos()) {
    throw InvalidInput("positions beyond the RoPE table (positions " + std::to_string(table.first_pos()) + ".." +
                           std::to_string(table.first_pos() + table.n_pos()) + ")",
                       {"", "position", std::to_string(first_pos + n - 1)});
  }
  const float sign = inverse ? -1.0f : 1.0f;
  for (std::size_t r = 0; r < n; ++r) {
    float* v = x + r * d;
    const float* c = table.cos_row(first_pos + r);
    const float* s = table.sin_row(first_pos + r);
    for (std::size_t i = 0; i < half; ++i) {
      std::size_t a, b;
      rope_pair_dims(layout, rot, i, a, b);
      const float x0 = v[a], x1 = v[b];
      const float si = sign * s[i];
      v[a] = x0 * c[i] - x1 * si;
      v[b] = x0 * si + x1 * c[i];
    }
  }
}

}  // namespace akv
