// linear_rows' register blocks compiled with AVX-512 F/VL; linear.cpp calls it only when the CPU
// has them. Same sums in the same order as the AVX2 blocks and linear_rows_ref (linear_simd.h).
//
// The 512-bit blocks: each register holds the eight partial sums of two outputs, (o, b) in the
// low half and (o, b + 1) in the high half, so one 512-bit multiply-add advances both: the low
// half of the X operand is x_b[k .. k+8], the high half x_{b+1}[k .. k+8], and W's chunk
// w_o[k .. k+8] is broadcast to both halves. Every lane sees exactly the multiply-adds of its
// 256-bit counterpart, in the same order, and each half is reduced with hsum8: the same bits.
// On CPUs whose 512-bit units are as wide as two 256-bit ones (AMD Zen 5, Intel server cores)
// that is twice the multiply-adds per instruction. X's vectors go in groups of 12 (6 pairs),
// laid out pair by pair and chunk by chunk once per product (pack_pairs, called by
// LinearInput), so that each pair is one aligned load; the vectors after the last full group
// take the 256-bit blocks (4 x 6).
#define AKV_LINEAR_NS avx512
#include "akv/tensor/linear_simd.h"

namespace akv::avx512 {
namespace {

constexpr std::size_t kPairs = 6;  // pairs of vectors per group: 4 x 6 accumulators

// The sums of four rows' registers a0..a3 (each: vector b in the low half, b + 1 in the high
// half) reduced in hsum8's order, ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), eight at a
// time: y[r] = sum of a_r's low half, y[ldy + r] = of its high half.
[[gnu::always_inline]] inline void store_sums4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float* y, std::size_t ldy) {
  // s_l + s_{l+4}: each 128-bit block plus its neighbour (blocks 0 and 2 are kept).
  const auto fold = [](__m512 a) { return _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1))); };
  const __m512 t0 = fold(a0), t1 = fold(a1), t2 = fold(a2), t3 = fold(a3);
  // (l0 + l2), (l1 + l3) of rows 0, 1 (and 2, 3) in each block.
  const __m512 z01 = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z23 = _mm512_add_ps(_mm512_shuffle_ps(t2, t3, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(t2, t3, _MM_SHUFFLE(3, 2, 3, 2)));
  // (l0 + l2) + (l1 + l3): rows 0..3 in order, block 0 for vector b, block 2 for b + 1.
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)));
  _mm_storeu_ps(y, _mm512_castps512_ps128(s));
  _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(s, 2));
}

// R rows of W times 2 * NP vectors of X (pairs b, b + 1); xp: the group's chunks,
// [cols / 8][NP][16] (pack_pairs), 64-byte aligned.
template <int R, int NP>
void block_pairs(const float* w, std::size_t ldw, std::size_t cols, const float* xp, const float* x, std::size_t ldx,
                 float* y, std::size_t ldy) {
  __m512 acc[R][NP];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const std::size_t k8 = cols - cols % 8;
  for (std::size_t k = 0; k < k8; k += 8) {
    __m512 wr[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      wr[r] = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(w + r * ldw + k))));
    }
    const float* xk = xp + k / 8 * NP * 16;
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512 xb = _mm512_load_ps(xk + p * 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][p] = _mm512_fmadd_ps(wr[r], xb, acc[r][p]);
    }
  }
  if constexpr (R == 4) {
    if (k8 == cols) {
      for (int p = 0; p < NP; ++p) store_sums4(acc[0][p], acc[1][p], acc[2][p], acc[3][p], y + 2 * p * ldy, ldy);
      return;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < NP; ++p) {
      alignas(64) float sums[16];
      _mm512_store_ps(sums, acc[r][p]);
      for (int h = 0; h < 2; ++h) {
        const std::size_t b = static_cast<std::size_t>(2 * p + h);
        float s = hsum8(_mm256_load_ps(sums + 8 * h));
        for (std::size_t k = k8; k < cols; ++k) {
          s = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(w[r * ldw + k]), _mm_set_ss(x[b * ldx + k]), _mm_set_ss(s)));
        }
        y[b * ldy + static_cast<std::size_t>(r)] = s;
      }
    }
  }
}

}  // namespace

std::size_t pair_group_vectors() { return 2 * kPairs; }

std::size_t pair_groups(std::size_t batch) { return batch / (2 * kPairs); }

std::size_t pair_group_floats(std::size_t cols) { return cols / 8 * kPairs * 16; }

void pack_pairs(const float* x, std::size_t groups, std::size_t cols, std::size_t ldx, float* out) {
  const std::size_t chunks = cols / 8;
  for (std::size_t g = 0; g < groups; ++g) {
    const float* xg = x + g * 2 * kPairs * ldx;
    float* og = out + g * pair_group_floats(cols);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::size_t p = 0; p < kPairs; ++p) {
        float* dst = og + (c * kPairs + p) * 16;
        _mm256_store_ps(dst, _mm256_loadu_ps(xg + 2 * p * ldx + 8 * c));
        _mm256_store_ps(dst + 8, _mm256_loadu_ps(xg + (2 * p + 1) * ldx + 8 * c));
      }
    }
  }
}

// packed: pack_pairs of x's full groups, or null (then every vector takes the 256-bit blocks).
void linear_rows_avx512(const float* w, std::size_t rows, std::size_t cols, std::size_t ldw, const float* packed,
                        const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy) {
  const std::size_t groups = packed ? pair_groups(batch) : 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const float* xp = packed + g * pair_group_floats(cols);
    const float* xg = x + g * 2 * kPairs * ldx;
    float* yg = y + g * 2 * kPairs * ldy;
    std::size_t o = 0;
    for (; o + 4 <= rows; o += 4) block_pairs<4, kPairs>(w + o * ldw, ldw, cols, xp, xg, ldx, yg + o, ldy);
    for (; o < rows; ++o) block_pairs<1, kPairs>(w + o * ldw, ldw, cols, xp, xg, ldx, yg + o, ldy);
  }
  const std::size_t b = groups * 2 * kPairs;
  linear_rows_simd<6>(w, rows, cols, ldw, x + b * ldx, batch - b, ldx, y + b * ldy, ldy);
}

}  // namespace akv::avx512
