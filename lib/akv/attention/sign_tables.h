#pragma once
// Sums of query heads' weights over rows of 1-bit codes (TurboQuant QJL's sign bits, tq2j's
// level bits; internal to the attention module) by tables of the weights' partial sums.
//
// One or two heads: nibble tables (kernels.h nibble_sums): per 4 channels a 16-entry table per
// head, the rows in vector lanes (16 a register on AVX-512, 8 on AVX2), one permute and one add
// per nibble and head for 16 (8) rows. Since 9e91a4c and 9bec8dc (2026-12-06; before, one head
// added its weights under the bits as lane masks, 16 values an add on AVX-512, and two heads
// used the byte tables below). Measured (AMD EPYC Zen 4, one core, 4096 tokens, head_dim 128,
// `akv -t 1 bench attention --isa avx512,avx2`, min of three alternating runs, 3996028 against
// a0b81de): QJL 4-bit keys at GQA 1 0.67 -> 0.57 ms per step (AVX-512; 1.48x -> 1.24-1.30x q4),
// 0.71 -> 0.60 (AVX2; 1.44x -> 1.15x); tq2j 0.63 -> 0.45 and 0.70 -> 0.50; at GQA 2 QJL 0.91 ->
// 0.80 (AVX-512) and 0.95 -> 0.92 (AVX2), tq2j 0.83 -> 0.67 and 0.86 -> 0.80 (docs/compress.md).
//
// Three or more heads: byte tables: for each 8-bit chunk k of a row, table k holds for every
// byte value b the sum of the weights of b's set bits, one lane per head (4 or 8 lanes an entry),
// and a row's sum adds its chunks' entries in chunk order: one table load and one vector add per
// byte for up to eight heads, where the vector loops' lane-mask adds (1-bit codes, a row format
// of kernels.h until c01bb2f) spent an add per head and 8 or 16 values. Measured (same host and
// command, 7d15c4e against 74385c8): QJL 4-bit keys at GQA 4 1.57 -> 1.43 ms per step (AVX-512), 1.67 ->
// 1.47 (AVX2); at GQA 8 2.98 -> ~2.6 and 4.7 -> ~3.6 (docs/compress.md).
//
// Order of the sums, per head h and row r, in f32: a table's entry for a nibble (byte) m is the
// sum of w[h][4k + j] (w[h][8k + j]) over m's set bits j from the lowest up (0 for m = 0), and the
// row's sum is ((T_0[m_0] + T_1[m_1]) + T_2[m_2]) + ... over its nibbles (bytes) in order. Lanes
// do not mix, so a head's sums are the same bits whatever the lane width or the instruction set.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace akv::attn {

class SignTables {
 public:
  // nq >= 1 heads' weights, head h's d values at w + h * ws (d a multiple of 8, >= 8).
  SignTables(const float* w, std::size_t ws, std::size_t nq, std::size_t d);

  // out[h * os + i] for h < nq, i < n: head h's weights summed over the set bits of row i (bit
  // j % 8 of byte j / 8 stands for weight j; row i's d / 8 bytes at bits + i * stride, nothing
  // read past them).
  void sums(const std::uint8_t* bits, std::size_t stride, std::size_t n, float* out, std::size_t os) const;

  std::size_t lanes() const { return lanes_; }  // heads per entry: 1 (1-2 heads: nibble tables), 4 (3-4), else 8

 private:
  std::size_t nq_, chunks_, lanes_;
  // nibble tables [head][d / 4][16]; byte tables [group of lanes_ heads][chunk][256][lanes_], unused lanes 0
  std::unique_ptr<float[]> table_;
};

}  // namespace akv::attn
