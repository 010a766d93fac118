#pragma once
// Rotary position embedding (RoPE). Pair i (0 <= i < rotary_dim/2) rotates by angle
// pos * inv_freq[i]; by default inv_freq[i] = theta^(-2i/rotary_dim), computed in f32 as llama2.c
// and Hugging Face do, and rotary_dim = head_dim. Hugging Face's rope_scaling (linear, dynamic
// NTK, llama3) changes inv_freq; partial_rotary_factor rotates only the first rotary_dim dims.
// Layouts: `interleaved` pairs are dims (2i, 2i+1) (llama2.c, Meta checkpoints);
// `rotate_half` pairs are dims (i, i + rotary_dim/2) (Hugging Face).
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

// Hugging Face's rope_scaling (docs/model.md), as transformers computes inv_freq in f32:
//   linear   inv_freq / factor
//   dynamic  theta * (factor * L / original - (factor - 1))^(d / (d - 2)) for a call whose
//            positions reach L > original (NTK-aware; L = the prefill length, or pos + 1 when
//            decoding); unchanged up to `original` (max_position_embeddings)
//   llama3   wavelengths 2 pi / inv_freq above original / low_freq_factor divided by factor,
//            below original / high_freq_factor kept, in between smoothly interpolated
//   yarn     (transformers 4.45) inv_freq / factor where a pair turns fewer than beta_slow times
//            over original positions, kept where it turns more than beta_fast times, a linear ramp
//            between (floor / ceil of the correction dims); cos and sin multiplied by
//            attention_factor (default 0.1 ln(factor) + 1)
//   longrope (Phi-3 / Phi-3.5's LongRoPE, transformers' Phi3 rotary embedding) 1 / (ext[i] *
//            theta^(2i/d)), ext = long_factors for a call whose positions reach L > original,
//            short_factors otherwise; cos and sin multiplied by attention_factor
struct RopeScaling {
  enum class Kind { none, linear, dynamic, llama3, yarn, longrope };
  Kind kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  std::size_t original_max_positions = 0;                // dynamic, llama3, yarn, longrope
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double attention_factor = 1.0;                         // yarn, longrope: scales cos and sin
  std::vector<float> short_factors, long_factors;        // longrope: [rotary_dim / 2] each
  // Per-frequency divisors applied after the kind's rule (GGUF's rope_freqs.weight, how
  // llama.cpp stores Llama 3's scaling): inv_freq[i] / freq_factors[i]; empty = none.
  std::vector<float> freq_factors;
};
std::string rope_scaling_name(RopeScaling::Kind k);  // "none" | "linear" | "dynamic" | "llama3" | "yarn" | "longrope"

// inv_freq [rotary_dim / 2] for a call whose positions are < seq_len (dynamic and longrope use it;
// InvalidInput when longrope's factors do not number rotary_dim / 2 or are not positive).
// Each f32 operation is rounded as f32 (no fused multiply-add), so every build agrees.
std::vector<float> rope_inv_freq(std::size_t rotary_dim, double theta, const RopeScaling& s,
                                 std::size_t seq_len);

// cos/sin of the angles of positions [first_pos, first_pos + n_pos).
class RopeTable {
 public:
  RopeTable(std::size_t head_dim, double theta, std::size_t first_pos, std::size_t n_pos);
  // Given inverse frequencies: the first 2 * inv_freq.size() dims of each head rotate. `scale`
  // multiplies cos and sin (each rounded to f32: yarn's attention factor); a table with
  // scale != 1 rotates forward only.
  RopeTable(std::size_t head_dim, const std::vector<float>& inv_freq, std::size_t first_pos,
            std::size_t n_pos, float scale = 1.0f);
  float scale() const { return scale_; }
  std::size_t head_dim() const { return head_dim_; }
  std::size_t rotary_dim() const { return 2 * half_; }
  std::size_t first_pos() const { return first_pos_; }
  std::size_t n_pos() const { return n_pos_; }
  const float* cos_row(std::size_t pos) const { return cos_.data() + (pos - first_pos_) * half_; }
  const float* sin_row(std::size_t pos) const { return sin_.data() + (pos - first_pos_) * half_; }

 private:
  std::size_t head_dim_, half_, first_pos_, n_pos_;
  float scale_ = 1.0f;
  std::vector<float> cos_;  // [n_pos, head_dim/2]
  std::vector<float> sin_;  // [n_pos, head_dim/2]
};

// Rotates n rows x[r] (each head_dim values, position first_pos + r) in place.
// inverse = true rotates by the negative angle (undoes RoPE).
void apply_rope(float* x, std::size_t n, std::size_t first_pos, RopeLayout layout,
                const RopeTable& table, bool inverse = false);

}  // namespace akv
