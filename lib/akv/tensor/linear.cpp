#include "akv/tensor/linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "akv/tensor/half.h"

#if defined(__AVX2__) && defined(__FMA__)
#define AKV_LINEAR_NS avx2
#include "akv/tensor/linear_simd.h"
#undef AKV_LINEAR_NS
#endif

namespace akv {

namespace {

float dot_ref(const float* w, const float* x, std::size_t cols) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t k8 = cols - cols % 8;
  for (std::size_t k = 0; k < k8; ++k) s[k % 8] = std::fma(w[k], x[k], s[k % 8]);
  float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (std::size_t k = k8; k < cols; ++k) r = std::fma(w[k], x[k], r);
  return r;
}

}  // namespace

void linear_rows_ref(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                     std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t o = 0; o < rows; ++o) y[b * ldy + o] = dot_ref(w + o * ldw, x + b * ldx, cols);
  }
}

#if defined(AKV_LINEAR_AVX512_TU)
namespace avx512 {  // linear_avx512.cpp
std::size_t pair_group_vectors();
std::size_t pair_groups(std::size_t batch);
std::size_t pair_group_floats(std::size_t cols);
void pack_pairs(const float* x, std::size_t groups, std::size_t cols, std::size_t ldx, float* out);
void linear_rows_avx512(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* packed,
                        const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy);
}  // namespace avx512
#endif

LinearInput::LinearInput(const float* x, std::size_t batch, std::size_t cols, std::size_t ldx)
    : LinearInput(active_isa(), x, batch, cols, ldx) {}

LinearInput::LinearInput(Isa isa, const float* x, std::size_t batch, std::size_t cols, std::size_t ldx)
    : isa_(std::min(isa, best_isa())), x_(x), batch_(batch), cols_(cols), ldx_(ldx) {
#if defined(AKV_LINEAR_AVX512_TU)
  if (isa_ == Isa::avx512) {
    const std::size_t groups = avx512::pair_groups(batch);
    if (groups == 0 || cols < 8) return;
    constexpr std::size_t kAlign = 16;  // floats in 64 bytes
    storage_.resize(groups * avx512::pair_group_floats(cols) + kAlign);
    const auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    float* aligned = storage_.data() + (kAlign - addr / sizeof(float) % kAlign) % kAlign;
    avx512::pack_pairs(x, groups, cols, ldx, aligned);
    packed_ = aligned;
  }
#endif
}

std::size_t linear_input_slice(std::size_t cols) {
  constexpr std::size_t kBytes = std::size_t{16} << 20;
#if defined(AKV_LINEAR_AVX512_TU)
  const std::size_t group = avx512::pair_group_vectors();
#else
  constexpr std::size_t group = 1;
#endif
  return std::max<std::size_t>(kBytes / (cols * sizeof(float) + 1) / group, 1) * group;
}

void linear_rows(const float* w, std::size_t rows, std::size_t ldw, const LinearInput& in, float* y, std::size_t ldy) {
  const float* x = in.x();
  const std::size_t batch = in.batch(), cols = in.cols(), ldx = in.ldx();
#if defined(AKV_LINEAR_AVX512_TU)
  if (in.isa() == Isa::avx512) return avx512::linear_rows_avx512(w, rows, cols, ldw, in.packed(), x, batch, ldx, y, ldy);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (in.isa() == Isa::avx2) return avx2::linear_rows_simd<3>(w, rows, cols, ldw, x, batch, ldx, y, ldy);
#endif
  linear_rows_ref(w, rows, cols, ldw, x, batch, ldx, y, ldy);
}

void linear_rows_isa(Isa isa, const float* w, std::size_t rows, std::size_t cols, std::size_t ldw,
                     const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  linear_rows(w, rows, ldw, LinearInput(isa, x, batch, cols, ldx), y, ldy);
}


void linear_rows(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* x,
                 std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  linear_rows_isa(active_isa(), w, rows, cols, ldw, x, batch, ldx, y, ldy);
}

void linear_rows_16(const std::uint8_t* w, bool bf16, std::size_t rows, std::size_t cols, std::size_t ldw,
                    const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
#if defined(__AVX2__) && defined(__FMA__)
  if (active_isa() >= Isa::avx2) {
    if (bf16) return avx2::linear_rows_simd<3, avx2::BF16Rows>(w, rows, cols, ldw, x, batch, ldx, y, ldy);
    return avx2::linear_rows_simd<3, avx2::F16Rows>(w, rows, cols, ldw, x, batch, ldx, y, ldy);
  }
#endif
  std::vector<float> row(cols);
  for (std::size_t o = 0; o < rows; ++o) {
    for (std::size_t k = 0; k < cols; ++k) {
      std::uint16_t h;
      std::memcpy(&h, w + 2 * (o * ldw + k), 2);
      row[k] = bf16 ? bf16_to_f32_ref(h) : f16_to_f32_ref(h);
    }
    for (std::size_t b = 0; b < batch; ++b) y[b * ldy + o] = dot_ref(row.data(), x + b * ldx, cols);
  }
}

}  // namespace akv
