#pragma once
// Asymmetric min/max affine group quantization (KIVI family), round to nearest. Two rules choose
// the f16 parameters and the codes (docs/compress.md, "Parameter rules"):
//
//   kivi (default): KIVI's quant_and_pack_kcache / quant_and_pack_vcache in fp16 arithmetic, every
//     operation rounded to the nearest f16 as on an fp16 model. Inputs are first rounded to f16;
//     zero = min, scale = f16(f16(max - min) / (2^b - 1)),
//     code = round_half_even(clamp(f16(f16(x - zero) / scale), 0, 2^b - 1)); a constant group has
//     scale 0 and code 0 (KIVI divides 0 by 0 there).
//   bounded: zero = the largest f16 <= min, scale = the smallest f16 >= (max - zero) / (2^b - 1);
//     code = clamp(round_half_even((x - zero) * (1 / scale)), 0, 2^b - 1). Directed rounding keeps
//     every input inside [zero, zero + (2^b - 1) scale]: |x - x^| <= scale / 2 (plus f32
//     arithmetic rounding). A constant group whose value is an f16 has scale 0 and is exact.
//
// Both rules decode x^ = zero + code * scale (one f32 fused multiply-add).
//
// Axes of a [rows = tokens, cols = channels] block:
//   channel: each channel is quantized in groups of G consecutive tokens (KIVI keys);
//   token:   each token is quantized in groups of G consecutive channels (KIVI values).
// The last group along the axis may be shorter than G.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace akv {

enum class QuantAxis { channel, token };
enum class QuantRule { kivi, bounded };
std::string quant_rule_name(QuantRule r);             // "kivi" | "bounded"
QuantRule parse_quant_rule(const std::string& name);  // throws InvalidInput naming the value
std::string quant_axis_name(QuantAxis a);             // "channel" | "token"
QuantAxis parse_quant_axis(const std::string& name);  // throws InvalidInput naming the value

struct GroupParams {
  float scale = 0.0f;  // an f16 value
  float zero = 0.0f;   // an f16 value
};
// The bounded rule's parameters. Throws InvalidInput when min or max lies beyond the f16 range.
GroupParams group_params(float min, float max, int bits);
// The kivi rule's parameters from the group's f16-rounded min and max. Throws InvalidInput when
// they, or max - min, lie beyond the f16 range.
GroupParams group_params_kivi(float min, float max, int bits);

// One quantized block of `rows` tokens x `cols` channels.
struct QuantizedBlock {
  int bits = 4;
  QuantAxis axis = QuantAxis::channel;
  std::size_t rows = 0, cols = 0, group = 32;
  // Packed codes in row-major element order (token after token, channels in order), for both
  // axes. Groups (and their scale/zero entries) are ordered: channel axis -> for each token
  // group, for each channel; token axis -> for each token, for each channel group.
  std::vector<std::uint8_t> codes;
  std::vector<std::uint16_t> scale;  // [n_groups] f16 bits, in group order
  std::vector<std::uint16_t> zero;   // [n_groups] f16 bits

  // Number of groups: channel axis ceil(rows/G) * cols, token axis rows * ceil(cols/G).
  std::size_t n_groups() const;
  // Bytes stored: packed codes + f16 scales and zeros.
  std::size_t bytes() const { return codes.size() + 2 * (scale.size() + zero.size()); }
};

// x: [rows, cols] row-major. bits in {2,3,4,8}, group >= 1 (InvalidInput otherwise).
QuantizedBlock quantize_block_ref(const float* x, std::size_t rows, std::size_t cols,
                                  QuantAxis axis, int bits, std::size_t group, QuantRule rule);
void dequantize_block_ref(const QuantizedBlock& q, float* out);  // out: [rows, cols]

// Fast paths (contiguous inner loops over channels, specialised packing): bit-identical codes,
// scales and zeros, and identical dequantized values.
QuantizedBlock quantize_block(const float* x, std::size_t rows, std::size_t cols, QuantAxis axis,
                              int bits, std::size_t group, QuantRule rule);
void dequantize_block(const QuantizedBlock& q, float* out);

}  // namespace akv
