// linear_rows' register blocks compiled with AVX-512 F/VL (32 vector registers: 4 x 6 blocks);
// linear.cpp calls it only when the CPU has them. Same sums in the same order as the AVX2 blocks
// and linear_rows_ref (linear_simd.h).
#define AKV_LINEAR_NS avx512
#include "akv/tensor/linear_simd.h"

namespace akv::avx512 {

void linear_rows_avx512(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                        std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  linear_rows_simd<6>(w, rows, cols, ldw, x, batch, ldx, y, ldy);
}

}  // namespace akv::avx512
