#include "akv/tensor/rope.h"

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

RopeTable::RopeTable(std::size_t head_dim, double theta, std::size_t first_pos, std::size_t n_pos)
    : head_dim_(head_dim), half_(head_dim / 2), first_pos_(first_pos), n_pos_(n_pos),
      cos_(n_pos * half_), sin_(n_pos * half_) {
  if (head_dim == 0 || head_dim % 2 != 0) {
    throw InvalidInput("RoPE needs an even head_dim", {"", "head_dim", std::to_string(head_dim)});
  }
  if (!(theta > 1.0) || !std::isfinite(theta)) {
    throw InvalidInput("RoPE theta must be finite and > 1", {"", "rope_theta",
                                                             std::to_string(theta)});
  }
  std::vector<float> freq(half_);
  for (std::size_t i = 0; i < half_; ++i) {
    freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                              static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  for (std::size_t p = 0; p < n_pos; ++p) {
    const float pos = static_cast<float>(first_pos + p);
    for (std::size_t i = 0; i < half_; ++i) {
      const float angle = pos * freq[i];
      cos_[p * half_ + i] = std::cos(angle);
      sin_[p * half_ + i] = std::sin(angle);
    }
  }
}

void apply_rope(float* x, std::size_t n, std::size_t first_pos, RopeLayout layout,
                const RopeTable& table, bool inverse) {
  const std::size_t d = table.head_dim();
  const std::size_t half = d / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (std::size_t r = 0; r < n; ++r) {
    float* v = x + r * d;
    const float* c = table.cos_row(first_pos + r);
    const float* s = table.sin_row(first_pos + r);
    for (std::size_t i = 0; i < half; ++i) {
      std::size_t a, b;
      rope_pair_dims(layout, d, i, a, b);
      const float x0 = v[a], x1 = v[b];
      const float si = sign * s[i];
      v[a] = x0 * c[i] - x1 * si;
      v[b] = x0 * si + x1 * c[i];
    }
  }
}

}  // namespace akv
