#include "akv/tensor/q8_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "akv/core/parallel.h"
#include "akv/tensor/ggml_fields.h"
#include "akv/tensor/half.h"

#if defined(__AVX2__)
#define AKV_Q8_NS avx2
#include "akv/tensor/q8_dot_simd.h"
#undef AKV_Q8_NS
#endif

namespace akv {
namespace {

using ggml::f16_at;
using ggml::scale_min_k4;

// One 32-value block's outputs: codes q[32], scales and offset.
struct BlockOut {
  std::int8_t* q;
  float* a_lo;
  float* a_hi;
  float* c;
  void scales(float lo, float hi, float off) const { *a_lo = lo, *a_hi = hi, *c = off; }
};

// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: element j in the low nibble of byte j, j + 16 in the high
// nibble (ggml_blocks.h); the 5-bit types add bit j of qh.
void small_block(std::uint32_t id, const std::uint8_t* b, const BlockOut& o) {
  const ggml::SmallBlock f = ggml::small_block_fields(id, b);
  for (std::size_t j = 0; j < 16; ++j) {
    int lo = f.qs[j] & 0x0F, hi = f.qs[j] >> 4;
    if (id == 20) {
      o.q[j] = kIq4nlValues[lo];
      o.q[j + 16] = kIq4nlValues[hi];
      continue;
    }
    if (f.five) {
      lo |= static_cast<int>((f.qh >> j) & 1u) << 4;
      hi |= static_cast<int>((f.qh >> (j + 16)) & 1u) << 4;
    }
    o.q[j] = static_cast<std::int8_t>(lo - f.offset);
    o.q[j + 16] = static_cast<std::int8_t>(hi - f.offset);
  }
  o.scales(f.d, f.d, f.has_min ? -f.m : 0.0f);
}

void q8_0_block(const std::uint8_t* b, const BlockOut& o) {
  const float d = f16_at(b);
  std::memcpy(o.q, b + 2, 32);
  o.scales(d, d, 0.0f);
}

// Q4_K / Q5_K: the scales of the 8 blocks of 32 (o[g]) and their codes (the plain loop).
void k4_scales(const std::uint8_t* b, const BlockOut* o) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (std::size_t g = 0; g < 8; ++g) {
    int sc = 0, m = 0;
    scale_min_k4(g, b + 4, sc, m);
    o[g].scales(d * static_cast<float>(sc), d * static_cast<float>(sc), dmin * static_cast<float>(m));
  }
}

void k4_codes(const std::uint8_t* b, const BlockOut* o, bool five) {
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + (five ? 48 : 16);
  for (std::size_t g = 0; g < 8; ++g) {
    const std::uint8_t* chunk = qs + 32 * (g / 2);
    const int shift = g % 2 == 0 ? 0 : 4;
    for (std::size_t l = 0; l < 32; ++l) {
      int q = (chunk[l] >> shift) & 0x0F;
      if (five) q |= ((qh[l] >> g) & 1) << 4;
      o[g].q[l] = static_cast<std::int8_t>(q);
    }
  }
}

// Q6_K: 8 blocks of 32, each with two 16-value scales; codes by the plain loop.
void q6_k_scales(const std::uint8_t* b, const BlockOut* o) {
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (std::size_t g = 0; g < 8; ++g) {  // block g: elements 32 g .. 32 g + 31, scales 2g and 2g + 1
    o[g].scales(d * static_cast<float>(sc[2 * g]), d * static_cast<float>(sc[2 * g + 1]), 0.0f);
  }
}

void q6_k_codes(const std::uint8_t* b, const BlockOut* o) {
  for (std::size_t half = 0; half < 2; ++half) {
    const std::uint8_t* l4 = b + 64 * half;
    const std::uint8_t* h2 = b + 128 + 32 * half;
    for (std::size_t k = 0; k < 4; ++k) {  // block 4 half + k: elements 32 k .. 32 k + 31 of the half
      const std::uint8_t* src = l4 + (k % 2 == 0 ? 0 : 32);
      const int nib = k < 2 ? 0 : 4, hshift = 2 * static_cast<int>(k);
      for (std::size_t l = 0; l < 32; ++l) {
        const int q = ((src[l] >> nib) & 0x0F) | (((h2[l] >> hshift) & 3) << 4);
        o[4 * half + k].q[l] = static_cast<std::int8_t>(q - 32);
      }
    }
  }
}

// The contribution t_b of one block (q8_dot.h), spelled out: this file builds without fused
// multiply-adds, as the vector kernels compute it.
float block_term(const std::int8_t* w, const std::int8_t* x, float a_lo, float a_hi, float c, float dx, float xsum) {
  std::int32_t lo = 0, hi = 0;
  for (std::size_t j = 0; j < 16; ++j) lo += static_cast<std::int32_t>(w[j]) * x[j];
  for (std::size_t j = 16; j < 32; ++j) hi += static_cast<std::int32_t>(w[j]) * x[j];
  return dx * ((a_lo * static_cast<float>(lo) + a_hi * static_cast<float>(hi)) - c * xsum);
}

float dot_ref(const Q8Tile& w, std::size_t o, const Q8Vectors& x, std::size_t b) {
  const std::size_t nb = w.cols / kQ8Block, nb8 = nb - nb % 8;
  const std::int8_t* wq = w.q.data() + o * w.cols;
  const std::int8_t* xq = x.q.data() + b * x.cols;
  const std::size_t wb = o * nb, xb = b * nb;
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const auto term = [&](std::size_t k) {
    return block_term(wq + k * kQ8Block, xq + k * kQ8Block, w.a_lo[wb + k], w.a_hi[wb + k], w.c[wb + k], x.d[xb + k],
                      x.sum[xb + k]);
  };
  for (std::size_t k = 0; k < nb8; ++k) s[k % 8] += term(k);
  float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (std::size_t k = nb8; k < nb; ++k) r += term(k);
  return r;
}

void check_shapes(const Q8Tile& w, const Q8Vectors& x) {
  if (w.cols != x.cols || w.cols % kQ8Block != 0) throw std::logic_error("q8_rows: shape mismatch");
}

}  // namespace

void q8_quantize_isa(Isa isa, const float* x, std::size_t batch, std::size_t cols, std::size_t ldx, Q8Vectors& out,
                     int threads) {
  if (cols % kQ8Block != 0) throw std::logic_error("q8_quantize: cols must be a multiple of 32");
  const std::size_t nb = cols / kQ8Block;
  out.batch = batch;
  out.cols = cols;
  out.q.resize(batch * cols);
  out.d.resize(batch * nb);
  out.sum.resize(batch * nb);
  const bool vector = std::min(isa, best_isa()) >= Isa::avx2;
  parallel_for(batch, batch >= 16 ? threads : 1, [&](std::size_t b) {
    for (std::size_t k = 0; k < nb; ++k) {
      const float* v = x + b * ldx + k * kQ8Block;
      std::int8_t* q = out.q.data() + b * cols + k * kQ8Block;
#if defined(__AVX2__)
      if (vector) {
        avx2::q8_quantize_block_simd(v, q, &out.d[b * nb + k], &out.sum[b * nb + k]);
        continue;
      }
#endif
      float amax = 0.0f;
      for (std::size_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      int sum = 0;
      for (std::size_t j = 0; j < kQ8Block; ++j) {
        const float r = std::clamp(std::nearbyint(v[j] * id), -127.0f, 127.0f);
        q[j] = static_cast<std::int8_t>(r);
        sum += q[j];
      }
      out.d[b * nb + k] = d;
      out.sum[b * nb + k] = static_cast<float>(sum);
    }
  });
  (void)vector;
}

void q8_quantize(const float* x, std::size_t batch, std::size_t cols, std::size_t ldx, Q8Vectors& out, int threads) {
  q8_quantize_isa(active_isa(), x, batch, cols, ldx, out, threads);
}

bool q8_decodes(const GgmlTypeInfo& type) {
  switch (type.id) {
    case 2: case 3: case 6: case 7: case 8: case 12: case 13: case 14: case 20: return true;
    default: return false;
  }
}

void q8_decode_isa(Isa isa, const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, std::size_t cols,
                   Q8Tile& out) {
  if (!q8_decodes(type) || cols % type.block != 0 || cols % kQ8Block != 0) {
    throw std::logic_error("q8_decode: unsupported type or shape");
  }
  const std::size_t nb = cols / kQ8Block, n_blocks = rows * nb;
  out.rows = rows;
  out.cols = cols;
  out.q.resize(rows * cols);
  out.a_lo.resize(n_blocks);
  out.a_hi.resize(n_blocks);
  out.c.resize(n_blocks);
  const bool vector = std::min(isa, best_isa()) >= Isa::avx2;
  const auto block_out = [&](std::size_t k) {
    return BlockOut{out.q.data() + k * kQ8Block, &out.a_lo[k], &out.a_hi[k], &out.c[k]};
  };
  if (type.block == kQ8Block) {
    for (std::size_t k = 0; k < n_blocks; ++k) {
      const std::uint8_t* b = src + k * type.bytes;
#if defined(__AVX2__)
      if (vector && type.id == 2) {
        const float d = f16_at(b);
        avx2::q4_0_codes_simd(b + 2, out.q.data() + k * kQ8Block);
        block_out(k).scales(d, d, 0.0f);
        continue;
      }
#endif
      if (type.id == 8) q8_0_block(b, block_out(k));
      else small_block(type.id, b, block_out(k));
    }
    return;
  }
  for (std::size_t s = 0; s < n_blocks / 8; ++s) {  // super-blocks of 256 = 8 blocks
    const BlockOut o[8] = {block_out(8 * s),     block_out(8 * s + 1), block_out(8 * s + 2), block_out(8 * s + 3),
                           block_out(8 * s + 4), block_out(8 * s + 5), block_out(8 * s + 6), block_out(8 * s + 7)};
    const std::uint8_t* b = src + s * type.bytes;
    if (type.id == 14) q6_k_scales(b, o);
    else k4_scales(b, o);
#if defined(__AVX2__)
    if (vector && type.id == 14) {
      avx2::q6_k_codes_simd(b, o[0].q);
      continue;
    }
    if (vector && type.id == 12) {
      avx2::q4_k_codes_simd(b + 16, o[0].q);
      continue;
    }
#endif
    if (type.id == 14) q6_k_codes(b, o);
    else k4_codes(b, o, type.id == 13);
  }
  (void)vector;
}

void q8_decode(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, std::size_t cols, Q8Tile& out) {
  q8_decode_isa(active_isa(), type, src, rows, cols, out);
}

void q8_rows_ref(const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy) {
  check_shapes(w, x);
  for (std::size_t b = 0; b < x.batch; ++b) {
    for (std::size_t o = 0; o < w.rows; ++o) y[b * ldy + o] = dot_ref(w, o, x, b);
  }
}

void q8_rows_isa(Isa isa, const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy) {
  check_shapes(w, x);
#if defined(__AVX2__)
  if (std::min(isa, best_isa()) >= Isa::avx2) return avx2::q8_rows_simd(w, x, y, ldy);
#endif
  (void)isa;
  q8_rows_ref(w, x, y, ldy);
}

bool q8_rows_blocks(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t rows, const Q8Vectors& x, float* y,
                    std::size_t ldy) {
  if (x.cols % type.block != 0) throw std::logic_error("q8_rows_blocks: shape mismatch");
#if defined(__AVX2__)
  if (active_isa() >= Isa::avx2) return avx2::q8_rows_fused_simd(type.id, src, rows, x.cols / type.block * type.bytes, x, y, ldy);
#endif
  (void)src, (void)rows, (void)y, (void)ldy;
  return false;
}

void q8_rows(const Q8Tile& w, const Q8Vectors& x, float* y, std::size_t ldy) { q8_rows_isa(active_isa(), w, x, y, ldy); }

}  // namespace akv
