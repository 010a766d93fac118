#pragma once
// Rotary position embedding (RoPE). Pair i (0 <= i < head_dim/2) rotates by angle
// pos * theta^(-2i/head_dim), computed in f32 as llama2.c and Hugging Face do.
// Layouts: `interleaved` pairs are dims (2i, 2i+1) (llama2.c, Meta checkpoints);
// `rotate_half` pairs are dims (i, i + head_dim/2) (Hugging Face).
#include <cstddef>
#include <string>
#include <vector>

namespace akv {

enum class RopeLayout { interleaved, rotate_half };

std::string rope_layout_name(RopeLayout l);             // "interleaved" | "rotate-half"
RopeLayout parse_rope_layout(const std::string& name);  // throws InvalidInput naming the value

// Dimension indices (a, b) of pair i in a layout.
inline void rope_pair_dims(RopeLayout layout, std::size_t head_dim, std::size_t i,
                           std::size_t& a, std::size_t& b) {
  if (layout == RopeLayout::interleaved) {
    a = 2 * i;
    b = 2 * i + 1;
  } else {
    a = i;
    b = i + head_dim / 2;
  }
}

// cos/sin of the angles of positions [first_pos, first_pos + n_pos).
class RopeTable {
 public:
  RopeTable(std::size_t head_dim, double theta, std::size_t first_pos, std::size_t n_pos);
  std::size_t head_dim() const { return head_dim_; }
  std::size_t first_pos() const { return first_pos_; }
  std::size_t n_pos() const { return n_pos_; }
  const float* cos_row(std::size_t pos) const { return cos_.data() + (pos - first_pos_) * half_; }
  const float* sin_row(std::size_t pos) const { return sin_.data() + (pos - first_pos_) * half_; }

 private:
  std::size_t head_dim_, half_, first_pos_, n_pos_;
  std::vector<float> cos_;  // [n_pos, head_dim/2]
  std::vector<float> sin_;  // [n_pos, head_dim/2]
};

// Rotates n rows x[r] (each head_dim values, position first_pos + r) in place.
// inverse = true rotates by the negative angle (undoes RoPE).
void apply_rope(float* x, std::size_t n, std::size_t first_pos, RopeLayout layout,
                const RopeTable& table, bool inverse = false);

}  // namespace akv
