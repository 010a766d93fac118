#pragma once
// Batched matrix-vector products with a fixed summation order: Y[b, o] = sum_k W[o, k] X[b, k].
// Every output is computed the same way whatever the batch size, the blocking and the thread
// count, so a sequence decoded alone and inside a batch gets bit-identical logits
// (docs/model.md, "Batched evaluation").
//
// The order: eight partial sums s_l, lane l accumulating k = l (mod 8) over k < cols - cols % 8
// with fused multiply-adds (s_l = fma(w_k, x_k, s_l), from 0), reduced as
// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then the remaining k added in order with
// fused multiply-adds. linear_rows_ref spells it out in scalar code; the fast paths keep each
// (o, b) pair's eight sums in one 256-bit register, four rows by three vectors at a time with
// AVX2's 16 registers; with AVX-512 F/VL (picked at run time) the eight sums of (o, b) and
// (o, b + 1) share a 512-bit register, four rows by twelve vectors at a time (the last vectors
// of a batch four rows by six in 256-bit registers), so each row of W is read once per call for
// every three (twelve) vectors of the batch. All of them give the same bits
// (tests/unit/test_tensor.cpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/core/isa.h"

namespace akv {

// W [rows, cols] (row stride ldw), X [batch, cols] (row stride ldx), Y [batch, *] (row stride
// ldy; writes Y[b * ldy + o] for o < rows).
void linear_rows(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                 std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);
// Kernel variants: linear_rows runs core/isa.h's active_isa()'s (by default the best).

// X prepared once for several linear_rows calls over it (the row blocks of one product, on
// several threads): the AVX-512 kernels read X's vectors two per register, laid out pair by
// pair here instead of in every call. Keeps a pointer to x, which must outlive it.
class LinearInput {
 public:
  LinearInput(const float* x, std::size_t batch, std::size_t cols, std::size_t ldx);
  LinearInput(Isa isa, const float* x, std::size_t batch, std::size_t cols, std::size_t ldx);
  Isa isa() const { return isa_; }
  const float* x() const { return x_; }
  std::size_t batch() const { return batch_; }
  std::size_t cols() const { return cols_; }
  std::size_t ldx() const { return ldx_; }
  const float* packed() const { return packed_; }  // null when the kernel reads x as it is

 private:
  Isa isa_;
  const float* x_;
  std::size_t batch_, cols_, ldx_;
  std::vector<float> storage_;
  const float* packed_ = nullptr;  // in storage_, 64-byte aligned
};
// Vectors of X to prepare at a time for rows of `cols` values: as many as keep LinearInput's
// copy within 16 MB (whole 512-bit groups, at least one group); callers with a longer X prepare
// it slice by slice.
std::size_t linear_input_slice(std::size_t cols);
// linear_rows over a prepared X (W [rows, x.cols()], row stride ldw).
void linear_rows(const float* w, std::size_t rows, std::size_t ldw, const LinearInput& x, float* y, std::size_t ldy);
// linear_rows with a given variant (clamped to best_isa()).
void linear_rows_isa(Isa isa, const float* w, std::size_t rows, std::size_t cols, std::size_t ldw,
                     const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);
void linear_rows_ref(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                     std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);

// linear_rows over 16-bit rows, F16 (bf16 false) or BF16, read where they lie (any byte offset):
// w is row 0's first byte, ldw counts values. The same bits as linear_rows over their f32 values
// (the conversions are exact): the vector loops widen 8 values at a time in registers, the plain
// loops (generic) a row at a time. For few vectors (decode steps), where converting a tile of rows
// to f32 first would cost more than the products.
void linear_rows_16(const std::uint8_t* w, bool bf16, std::size_t rows, std::size_t cols, std::size_t ldw,
                    const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);

}  // namespace akv
