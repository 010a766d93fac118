#pragma once
// Products of ggml block-type weights (Q4_0 ... Q6_K, IQ4_NL) with activations rounded to 8-bit
// blocks, in integer arithmetic, as llama.cpp's CPU backend multiplies them (its activations go
// to q8_0 / q8_K blocks): the weights are never widened to f32 (docs/model.md, "Weights in
// memory").
//
// Activations (q8_quantize): each run of 32 values of a vector becomes int8 codes and one f32
// step, dx = max|x| / 127, q = nearbyint(x * (1 / dx)) (ties to even; 0 when dx = 0), clamped
// to +-127, and the codes' sum. Each value moves by at most dx / 2 (plus the f32 rounding of the
// reciprocal): |sum_k w_k x_k - sum_k w_k dx q_k| <= sum over blocks (dx / 2) sum_k |w_k|
// (tests/unit/test_tensor.cpp checks this bound).
//
// Weights (q8_decode): a tile of rows decoded to int8 codes w_k with, per block of 32, two f32
// scales (a_lo for its first 16 codes, a_hi for the last 16: different only in Q6_K) and an
// offset c, so that element k of the block is a * w_k - c, bit for bit what ggml_dequantize
// gives (Q4_0: a = d, w = q - 8; Q4_1: c = -m; Q4_K: a = d sc, c = dmin m; Q6_K: a = d sc per
// 16).
//
// One output, block b of 32 (nb = cols / 32 blocks): with the exact integer sums lo_b (codes
// 0-15), hi_b (16-31),
//   t_b = dx_b * ((a_lo * lo_b + a_hi * hi_b) - c_b * xsum_b)   (f32, this order, no fusion),
// eight partial sums s_l accumulating t_b for b = l (mod 8), b < nb - nb % 8, reduced as
// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then the remaining t_b added in order.
// The vector kernels (AVX2 integer dot products, 8 blocks per register) compute each lane's
// sums exactly so: q8_rows and q8_rows_ref give the same bits, for any batch, blocking and
// thread count.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/core/isa.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv {

inline constexpr std::size_t kQ8Block = 32;

// Vectors [batch, cols] rounded to 8-bit blocks (cols a multiple of 32).
struct Q8Vectors {
  std::size_t batch = 0, cols = 0;
  std::vector<std::int8_t> q;  // [batch, cols]
  std::vector<float> d;        // [batch, cols / 32] steps
  std::vector<float> sum;      // [batch, cols / 32] sums of the codes (as f32: exact, |sum| <= 4064)
};
// Vectors on `threads` threads (the same bits for any count); q8_quantize runs active_isa()'s
// kernel, and every variant gives the same codes and steps for finite x.
void q8_quantize(const float* x, std::size_t batch, std::size_t cols, std::size_t ldx, Q8Vectors& out,
                 int threads = 1);
void q8_quantize_isa(Isa isa, const float* x, std::size_t batch, std::size_t cols, std::size_t ldx, Q8Vectors& out,
                     int threads = 1);

// Rows of a block-type weight decoded to codes (cols a multiple of the type's block and of 32).
struct Q8Tile {
  std::size_t rows = 0, cols = 0;
  std::vector<std::int8_t> q;  // [rows, cols]
  std::vector<float> a_lo;     // [rows, cols / 32]
  std::vector<float> a_hi;     // [rows, cols / 32]
  std::vector<float> c;        // [rows, cols / 32]
};
// Whether q8_decode reads the type (the block types; not F32, F16, BF16).
bool q8_decodes(const GgmlTypeInfo& type);
// Decodes `rows` rows of `cols` values stored one after the other from src (active_isa()'s
// loops: AVX2 unpacks Q4_0, Q4_K and Q6_K codes 32 at a time; every variant gives the same tile).
void q8_decode(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, std::size_t cols, Q8Tile& out);
void q8_decode_isa(Isa isa, const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, std::size_t cols,
                   Q8Tile& out);

// y[b * ldy + o] = the product of tile row o and vector b, for every o < tile.rows and b < x.batch
// (tile.cols == x.cols). q8_rows runs active_isa()'s kernel; every variant gives the same bits.
void q8_rows(const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy);
void q8_rows_isa(Isa isa, const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy);
void q8_rows_ref(const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy);
// The same products read straight from `rows` stored rows at src (no tile), where active_isa()
// has such a kernel for the type (AVX2: Q4_0, Q8_0, Q4_K, Q6_K: codes unpacked and scales computed
// in registers): the bits of q8_decode + q8_rows. Returns false, writing nothing, otherwise.
// Meant for few vectors (a decode step); a tile pays off when many vectors share it.
bool q8_rows_blocks(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, const Q8Vectors& x, float* y,
                    std::size_t ldy);

}  // namespace akv
