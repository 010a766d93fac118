#pragma once
// The integer attention path (internal to the attention module; DecodeAttentionOptions::mode ==
// AttentionMode::int8): packed 2- and 4-bit codes multiplied by 8-bit integers with vpmaddubsw
// (AVX2), the products summed in 16- and 32-bit integers, one float multiply-add per result.
// Integer sums do not depend on their order, so every instruction set and the plain loops give
// the same bits.
//
// Keys (per-channel packed, a key group's w = q * scale from key_weights): w is rounded to int8
// in blocks of 32 channels, block b with step unit * mult[b] (mult an integer in [1, 256], the
// block's largest |w| over 127 rounded up to a multiple of unit = max|w| / (127 * 256)), so
//   score_r = bias + unit * S_r,  S_r = sum_b mult[b] * sum_{c in b} w8[c] * code_r[c]
// with |w[c] - unit * mult[b] * w8[c]| <= unit * mult[b] / 2.
//
// Values (per-token packed): a sub-tile of at most kInt8ValueRows rows; each coefficient
// coef[r, h, g] = p * scale (>= 0) is rounded to 0..127 in steps of sigma[h, g] = max_r coef / 127,
// and the integer sum over the rows of c8 * code goes into the float accumulator as
// acc = fma(sigma, sum, acc). The rounded coefficients are stored four rows to a 32-bit word:
// AVX2 reads them a row pair (16 bits) at a time for vpmaddubsw, AVX-512 VNNI a word at a time
// for vpdpbusd.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/attention/kernels.h"

namespace akv::attn {

// Rows of one value sub-tile: 16-bit sums of 8 token pairs stay below 2^15 (8 * 2 * 15 * 127).
constexpr std::size_t kInt8ValueRows = 16;
constexpr std::size_t kInt8Block = 32;  // channels per block

// Formats the integer loops read: 2- and 4-bit codes.
bool int8_format(RowFormat f);

// Byte i of an unpacked block of 32 codes (the vector loops' order) holds channel
// int8_lane_channel(f, i) of the block: 4 bits: even channels then odd; 2 bits: channels
// 4i, then 4i + 1, 4i + 2, 4i + 3 (8 bytes each).
int int8_lane_channel(RowFormat f, int lane);

struct Int8Weights {
  RowFormat format = RowFormat::code4;
  std::size_t nq = 0, cols = 0;             // cols % 32 == 0
  std::vector<std::int8_t> w;               // [nq, cols] channel order
  std::vector<std::int8_t> lanes;           // [cols / 32, nq, 32]: blocks in int8_lane_channel order
  std::vector<std::int16_t> mult;           // [nq, cols / 32]
  std::vector<std::int16_t> mult16;         // [cols / 32, nq, 16]: mult repeated (vector operands)
  // [nq, cols, ...] in the VNNI key loop's order: 4 bits, chunk k's w8 of channels 8k + {0, 2, 4,
  // 6, 1, 3, 5, 7}; 2 bits, word k's (16 channels) of 16k + {0, 4, 8, 12, 1, 5, 9, 13, 2, ..., 15}.
  std::vector<std::int8_t> quads;
  std::vector<float> unit;                  // [nq]
  std::vector<float> block_max;             // scratch
};

constexpr float kInt8Levels = 127.0f, kInt8MaxMult = 256.0f;  // weight codes -127..127, mult 1..256

// Where the AVX-512 quantize_weights_int8 writes (Int8Weights' storage, sized); it takes rows of
// 1, 2, 4, 8 or 16 blocks (cols 32, 64, 128, 256, 512).
constexpr std::size_t kInt8VectorBlocks = 16;
struct Int8WeightsOut {
  std::size_t nq = 0, cols = 0;
  std::int8_t* w = nullptr;
  std::int8_t* lanes = nullptr;
  std::int16_t* mult = nullptr;
  std::int16_t* mult16 = nullptr;
  std::int8_t* quads = nullptr;
  float* unit = nullptr;
};

// What the vector loops read of Int8Weights (plain pointers: no standard-library code in the
// AVX-512 translation unit).
struct Int8WeightsView {
  std::size_t nq = 0, cols = 0;
  const std::int8_t* lanes = nullptr;
  const std::int16_t* mult16 = nullptr;
  const float* unit = nullptr;
  const std::int16_t* mult = nullptr;  // [nq, cols / 32]
  const std::int8_t* quads = nullptr;
};

// w [nq, cols] (finite) -> out (reuses its storage).
void quantize_weights_int8(const float* w, std::size_t nq, std::size_t cols, RowFormat f, Int8Weights& out);

// s[h * ss + r] = fma(unit[h], float(S_hr), bias[h]) for r < rows.n, h < w.nq (rows.format ==
// w.format; rows.chunks * 8 == w.cols).
void score_rows_int8(const Rows& rows, const Int8Weights& w, const float* bias, float* s, std::size_t ss);

// Coefficients of n <= kInt8ValueRows rows, coef[(r * nq + h) * ng + g] >= 0 (finite) ->
// quads[(k * nq + h) * ng + g] = c8[4k] | c8[4k + 1] << 8 | c8[4k + 2] << 16 | c8[4k + 3] << 24
// (c8 of the missing rows of a last partial quad 0) and sigma[h * ng + g].
void quantize_coefficients_int8(const float* coef, std::size_t n, std::size_t nq, std::size_t ng,
                                std::vector<std::uint32_t>& quads, std::vector<float>& sigma);

// c8 of row r, entry j = h * ng + g, of quantize_coefficients_int8's quads (e = nq * ng entries per row).
inline unsigned coefficient_c8(const std::uint32_t* quads, std::size_t e, std::size_t r, std::size_t j) {
  return (quads[(r / 4) * e + j] >> (8 * (r % 4))) & 0xFFu;
}

// For h < nq, c < cols: acc[h * as + c] = fma(sigma[h * ng + g], S, acc[h * as + c]) with
// S = sum_{r < rows.n} c8[r, h, g] * code_r[c], g = c / group (exact integer sum); cols =
// rows.chunks * 8 a multiple of 32, group a multiple of 32, rows.n <= kInt8ValueRows.
void accumulate_rows_int8(const Rows& rows, std::size_t nq, const std::uint32_t* quads, std::size_t ng,
                          std::size_t group, const float* sigma, float* acc, std::size_t as);

}  // namespace akv::attn
