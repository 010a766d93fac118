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
// AVX2's 16 registers, four rows by six with AVX-512's 32 (picked at run time when the CPU has
// AVX-512 F/VL), so each row of W is read once per call for every three (six) vectors of the
// batch. All of them give the same bits (tests/unit/test_tensor.cpp).
#include <cstddef>

namespace akv {

// W [rows, cols] (row stride ldw), X [batch, cols] (row stride ldx), Y [batch, *] (row stride
// ldy; writes Y[b * ldy + o] for o < rows).
void linear_rows(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                 std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);
// Kernel variants: linear_rows runs linear_active_isa()'s (by default the best).
enum class LinearIsa { generic, avx2, avx512 };
LinearIsa linear_best_isa();  // what this build and CPU support
const char* linear_isa_name(LinearIsa isa);
// Process-wide cap on the variant linear_rows runs (clamped to linear_best_isa(); `akv
// --max-isa`); linear_active_isa() is the one in use.
void set_linear_isa(LinearIsa isa);
LinearIsa linear_active_isa();
// linear_rows with a given variant (clamped to linear_best_isa()).
void linear_rows_isa(LinearIsa isa, const float* w, std::size_t rows, std::size_t cols, std::size_t ldw,
                     const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);
void linear_rows_ref(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                     std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);

}  // namespace akv
