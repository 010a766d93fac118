#pragma once
// Sums of several query heads' weights over rows of 1-bit codes (TurboQuant QJL's sign bits;
// internal to the attention module) by byte tables: for each 8-bit chunk k of a row, table k
// holds for every byte value b the sum of the weights of b's set bits, one lane per head (2, 4
// or 8 lanes an entry), and a row's sum adds its chunks' entries in chunk order. A chunk of a row
// costs one table load and one vector add for up to eight heads, where the lane-mask adds of the
// vector loops (kernels.h, RowFormat::code1) spend an add per head and 8 or 16 values. Measured
// (AMD EPYC Zen 4, one core, 4096 tokens, head_dim 128, 2026-12-06, 7d15c4e against 74385c8,
// `akv -t 1 bench attention --isa avx512,avx2`): QJL 4-bit keys at GQA 4
// 1.57 -> 1.43 ms per step (AVX-512), 1.67 -> 1.47 (AVX2); at GQA 8 2.98 -> ~2.6 and 4.7 ->
// ~3.6; at GQA 2 AVX2 6-11% faster, AVX-512 3-4% slower at head_dim 128 (faster at 64); at
// GQA 1 the lane masks (16 values an add on AVX-512) stay faster, and the callers keep them
// there (docs/compress.md).
//
// Order of the sums, per head h and row r, in f32: table k's entry for byte b is the sum of
// w[h][8k + j] over b's set bits j from the lowest up (0 for b = 0), and the row's sum is
// ((T_0[byte 0] + T_1[byte 1]) + T_2[byte 2]) + ... Lanes do not mix, so a head's sums are the
// same bits whatever the number of heads, the lane width or the instruction set.
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

  std::size_t lanes() const { return lanes_; }  // heads per entry: 2 (1-2 heads), 4 (3-4), else 8

 private:
  std::size_t nq_, chunks_, lanes_;
  std::unique_ptr<float[]> table_;  // [group of lanes_ heads][chunk][256][lanes_], unused lanes 0
};

}  // namespace akv::attn
