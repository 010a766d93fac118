#pragma once
// Inner loops of decode attention (internal to the attention module). Rows are read 8 values
// (one chunk) at a time straight from their storage: f32, f16, b-bit codes (as floats
// 0..2^b-1) or b-bit codes standing for a table's levels (nuq); AVX2/F16C/FMA when compiled for
// x86-64-v3, plain loops otherwise.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "akv/core/isa.h"

namespace akv::attn {

// level2 .. level4: b-bit codes (packed as code2 .. code4) standing for Rows::levels[code]
// (KVQuant's non-uniform levels, quant/nuq.h; TurboQuant's codebook, tensor/turboquant.h), read
// with a table lookup per value. e4m3, e5m2: one fp8 byte per value (tensor/fp8.h), read exactly
// as f16 bits (e5m2: the byte is f16's high byte; e4m3: sign, then exponent and mantissa shifted
// into f16's, which reads the value times 2^-8; the sums are multiplied by 2^8 once) - except
// e4m3's NaN codes (S.1111.111), which read as 480: callers route rows holding them elsewhere.
// q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl: ggml's 32-value blocks (tensor/ggml_blocks.h has the
// layouts: an f16 scale d first, Q4_1/Q5_1 an f16 min m, Q5_x a word of 5th bits, then the
// codes), read as ggml_dequantize computes them (d x q, d x (q - offset), d x q + m, d x
// kvalues[q]), so the loops' sums are those over the dequantized rows, bit for bit.
enum class RowFormat {
  f32, f16, code2, code3, code4, code8, level2, level3, level4, e4m3, e5m2, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl
};

// The vector loops run core/isa.h's active_isa(): avx2 (x86-64-v3, the build's baseline) or
// avx512 (the same loops compiled with AVX-512 F/VL/BW/DQ: 4-bit codes read without shifts, more
// accumulators). AVX2 and AVX-512 results are bitwise identical; the plain loops (generic) sum in
// another order and agree within 1e-6.

RowFormat code_format(int bits);  // 2, 3, 4, 8
RowFormat level_format(int bits);  // 2, 3, 4
// The row format of ggml type `id` (tensor/ggml_blocks.h: 8 Q8_0, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7
// Q5_1, 20 IQ4_NL), nullopt for the types the loops do not read.
std::optional<RowFormat> ggml_row_format(std::uint32_t id);
int format_bits(RowFormat f);  // bits per value: code2..code8, level2..level4 (others: 8)

// n rows of `chunks` * 8 values each; row r starts at base + r * stride bytes (code rows:
// stride = chunks * bits bytes; the stream must be readable 8 bytes past its end; ggml blocks:
// chunks a multiple of 4, whole blocks, nothing read past them).
struct Rows {
  RowFormat format = RowFormat::f32;
  const std::uint8_t* base = nullptr;
  std::size_t stride = 0, n = 0, chunks = 0;
  const float* levels = nullptr;  // level formats: 16 floats as level_table fills them
};

// The table of a level format: table[i] = values[i mod 2^bits] for i < 16 (the 2^bits values
// repeated: the vector loops index it with the code's bits and the bits above them, which saves
// masking each code).
void level_table(const float* values, int bits, float* table);

// For h < nq, r < rows.n: s[h * s_stride + r] = bias[h] + sum_c w[h * w_stride + c] * row_r[c]
// (f32 products and sums; bias may be null = 0). sq (may be null, nq >= 1): also
// sq[r] = sum_c row_r[c]^2, in the same pass (TurboQuant's norm correction); the scores are
// then those without sq, bit for bit, except for one head over 2- or 4-bit codes (the 8-wide
// loops instead of AVX-512's 16-wide: the same sums in another order).
void score_rows(const Rows& rows, std::size_t nq, const float* w, std::size_t w_stride,
                const float* bias, float* s, std::size_t s_stride, float* sq = nullptr);

// Sums over rows of nibbles (4-bit groups of codes) by tables: head h's table at table + 16
// nibbles h, entry 16 j + m its value for nibble j holding m, and out[h * os + i] = ((0 +
// t[m_0]) + t[16 + m_1]) + ... over row i's nibbles m_j in order (nibble j: bits 4 (j % 2) to
// 4 (j % 2) + 3 of byte j / 2). What an entry holds is the caller's (SignTables: the sum of a
// head's weights over a nibble's set bits, for QJL's signs and tq2j's levels; 2-bit levels, two
// codes a nibble, measured no faster than their loops on Zen 4 with AVX-512 and 13% slower with
// AVX2: nuq2, GQA 1, 2026-12-06). nibbles even (> 0); row i's nibbles / 2 bytes at bits + i * stride,
// nothing read past them. Rows lie in vector lanes (16 a time on AVX-512, 2 x 8 on AVX2; a
// 16-entry lookup per nibble and head, two heads a pass), so every instruction set gives the
// same bits.
void nibble_sums(const float* table, std::size_t nq, std::size_t nibbles, const std::uint8_t* bits, std::size_t stride,
                 std::size_t n, float* out, std::size_t os);

// For h < nq, c < chunks * 8: acc[h * a_stride + c] += sum_r coef[(r * nq + h) * n_groups + g(c)]
// * row_r[c], with g(c) = c / (8 * chunks_per_group).
void accumulate_rows(const Rows& rows, std::size_t nq, const float* coef, std::size_t n_groups,
                     std::size_t chunks_per_group, float* acc, std::size_t a_stride);

// Per-token packed values, for rows i < n and query heads h < nq:
//   coef[(i * nq + h) * ng + g] = p[h * ps + i] * scale[i * ng + g]
//   zsum[h * ng + g] = sum_i p[h * ps + i] * zero[i * ng + g]
// with scale and zero f16 bits [n, ng]. The sums run as four partial sums over i % 4 (fused
// multiply-adds), added as (s0 + s1) + (s2 + s3).
void value_coefficients(const float* p, std::size_t ps, const std::uint16_t* scale, const std::uint16_t* zero,
                        std::size_t n, std::size_t nq, std::size_t ng, float* coef, float* zsum);

// Per-channel packed keys, one token group: for query heads h < nq and channels c < cols
// (cols % 8 == 0): w[h * cols + c] = q[h * cols + c] * scale[c] and bias[h] = sum_c
// q[h * cols + c] * zero[c] (scale, zero: f16 bits [cols]). The sums run as 32 partial sums
// l[c % 32] (fused multiply-adds); t[i] = (l[i] + l[8 + i]) + (l[16 + i] + l[24 + i]) for i < 8,
// added pairwise.
void key_weights(const float* q, std::size_t nq, std::size_t cols, const std::uint16_t* scale,
                 const std::uint16_t* zero, float* w, float* bias);

// The largest of x[0..n), n >= 1 (NaN-free input).
float max_value(const float* x, std::size_t n);

// out[i] = exp(x[i] - shift) for i < n (x[i] - shift <= 0); returns the sum of out in the
// loop's fixed order. Relative error of each value <= 2e-7 (tested against std::exp).
float exp_shifted(const float* x, float shift, std::size_t n, float* out);

// Weights below this are 0 in exp_weights (2^-100).
inline constexpr float kMinWeight = 7.88860905e-31f;
// exp_shifted for the weights of a value sum (attention probabilities times value rows): each
// result below kMinWeight is 0. Their products with values would be subnormal floats, which x86
// CPUs compute through microcode assists (measured 2026-12-04, Intel Xeon, AVX-512: the chunked
// prompt protocol on the retrieval model, whose attention is sharp, spent 3x its time there), and
// beside the weight 1 of the row's maximum they are below f32's resolution of the sum.
float exp_weights(const float* x, float shift, std::size_t n, float* out);

}  // namespace akv::attn
