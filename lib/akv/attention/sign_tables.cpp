#include "akv/attention/sign_tables.h"

#include <algorithm>
#include <stdexcept>

#include "akv/attention/kernels.h"
#include "akv/core/isa.h"

#if defined(__SSE__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace akv::attn {
namespace {

constexpr std::size_t kEntries = 256;
constexpr std::size_t kNibbleHeads = 2;  // up to this many heads: nibble tables

// Rows [i, n) one at a time, each lane in its own add chain (the loops below do the same adds).
void tail_rows(const float* table, std::size_t lanes, std::size_t chunks, const std::uint8_t* bits, std::size_t stride,
               std::size_t i, std::size_t n, std::size_t used, float* out, std::size_t os) {
  float acc[8];
  for (; i < n; ++i) {
    const std::uint8_t* row = bits + i * stride;
    std::copy_n(table + lanes * row[0], lanes, acc);
    for (std::size_t k = 1; k < chunks; ++k) {
      const float* e = table + (k * kEntries + row[k]) * lanes;
      for (std::size_t h = 0; h < lanes; ++h) acc[h] += e[h];
    }
    for (std::size_t h = 0; h < used; ++h) out[h * os + i] = acc[h];
  }
}

// Four heads a group (an SSE register, the lanes above the group's heads zero): eight rows at a
// time (eight chains of adds in flight), transposed four rows at a time into each head's sums.
std::size_t rows4(const float* table, std::size_t chunks, const std::uint8_t* bits, std::size_t stride, std::size_t n,
                  std::size_t used, float* out, std::size_t os) {
  std::size_t i = 0;
#ifdef __SSE2__
  for (; i + 8 <= n; i += 8) {
    const std::uint8_t* r[8];
    __m128 a[8];
    for (std::size_t j = 0; j < 8; ++j) {
      r[j] = bits + (i + j) * stride;
      a[j] = _mm_loadu_ps(table + 4 * r[j][0]);
    }
    for (std::size_t k = 1; k < chunks; ++k) {
      const float* t = table + 4 * kEntries * k;
      for (std::size_t j = 0; j < 8; ++j) a[j] = _mm_add_ps(a[j], _mm_loadu_ps(t + 4 * r[j][k]));
    }
    _MM_TRANSPOSE4_PS(a[0], a[1], a[2], a[3]);
    _MM_TRANSPOSE4_PS(a[4], a[5], a[6], a[7]);
    for (std::size_t h = 0; h < used; ++h) {
      _mm_storeu_ps(out + h * os + i, a[h]);
      _mm_storeu_ps(out + h * os + i + 4, a[h + 4]);
    }
  }
#endif
  return i;
}

// Eight heads a group: eight rows at a time, transposed into each head's eight sums.
std::size_t rows8(const float* table, std::size_t chunks, const std::uint8_t* bits, std::size_t stride, std::size_t n,
                  std::size_t used, float* out, std::size_t os) {
  std::size_t i = 0;
#ifdef __AVX__
  for (; i + 8 <= n; i += 8) {
    const std::uint8_t* r[8];
    __m256 a[8];
    for (std::size_t j = 0; j < 8; ++j) {
      r[j] = bits + (i + j) * stride;
      a[j] = _mm256_loadu_ps(table + 8 * r[j][0]);
    }
    for (std::size_t k = 1; k < chunks; ++k) {
      const float* t = table + 8 * kEntries * k;
      for (std::size_t j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_loadu_ps(t + 8 * r[j][k]));
    }
    __m256 u[8], s[8];
    for (std::size_t j = 0; j < 8; j += 2) {
      u[j] = _mm256_unpacklo_ps(a[j], a[j + 1]);
      u[j + 1] = _mm256_unpackhi_ps(a[j], a[j + 1]);
    }
    for (std::size_t j = 0; j < 8; j += 4) {
      s[j] = _mm256_shuffle_ps(u[j], u[j + 2], 0x44);
      s[j + 1] = _mm256_shuffle_ps(u[j], u[j + 2], 0xEE);
      s[j + 2] = _mm256_shuffle_ps(u[j + 1], u[j + 3], 0x44);
      s[j + 3] = _mm256_shuffle_ps(u[j + 1], u[j + 3], 0xEE);
    }
    for (std::size_t h = 0; h < used; ++h) {  // head h: rows 0-3 from s[h % 4] of rows 0-3, 4-7 from s[h % 4 + 4]
      const __m256 x = h < 4 ? _mm256_permute2f128_ps(s[h], s[h + 4], 0x20) : _mm256_permute2f128_ps(s[h - 4], s[h], 0x31);
      _mm256_storeu_ps(out + h * os + i, x);
    }
  }
#endif
  return i;
}

// A chunk's table: entry 0 is 0, entry 2^j + b (b < 2^j) is entry b plus bit j's weights, L lanes
// at a time (loops of known length, no entry waiting for the one before).
template <std::size_t L>
void build_table(const float (&bit)[8][8], float* t) {
  for (std::size_t h = 0; h < L; ++h) t[h] = 0.0f;
  for (std::size_t j = 0; j < 8; ++j) {
    const std::size_t half = std::size_t{1} << j;
    for (std::size_t b = 0; b < half; ++b) {
      for (std::size_t h = 0; h < L; ++h) t[(half + b) * L + h] = t[b * L + h] + bit[j][h];
    }
  }
}

}  // namespace

SignTables::SignTables(const float* w, std::size_t ws, std::size_t nq, std::size_t d)
    : nq_(nq), chunks_(d / 8), lanes_(nq > 4 ? 8 : nq > kNibbleHeads ? 4 : 1) {
  if (nq == 0 || d == 0 || d % 8 != 0) throw std::invalid_argument("SignTables: nq >= 1 and d a multiple of 8");
  if (lanes_ == 1) {  // nibble tables (kernels.h nibble_sums): entry 2^j + m (m < 2^j) is entry m plus bit j's weight
    table_.reset(new float[nq * 16 * (d / 4)]);
    for (std::size_t h = 0; h < nq; ++h) {
      for (std::size_t k = 0; k < d / 4; ++k) {
        float* t = table_.get() + 16 * (h * (d / 4) + k);
        t[0] = 0.0f;
        for (std::size_t j = 0; j < 4; ++j) {
          const std::size_t half = std::size_t{1} << j;
          for (std::size_t m = 0; m < half; ++m) t[half + m] = t[m] + w[h * ws + 4 * k + j];
        }
      }
    }
    return;
  }
  const std::size_t groups = (nq + lanes_ - 1) / lanes_, block = kEntries * lanes_;
  table_.reset(new float[groups * chunks_ * block]);
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t k = 0; k < chunks_; ++k) {
      float bit[8][8] = {};  // bit j's weight per lane
      for (std::size_t h = 0; h < lanes_ && g * lanes_ + h < nq; ++h) {
        for (std::size_t j = 0; j < 8; ++j) bit[j][h] = w[(g * lanes_ + h) * ws + 8 * k + j];
      }
      float* t = table_.get() + (g * chunks_ + k) * block;
      if (lanes_ == 8) {
        build_table<8>(bit, t);
      } else {
        build_table<4>(bit, t);
      }
    }
  }
}

void SignTables::sums(const std::uint8_t* bits, std::size_t stride, std::size_t n, float* out, std::size_t os) const {
  if (lanes_ == 1) return nibble_sums(table_.get(), nq_, 2 * chunks_, bits, stride, n, out, os);
  for (std::size_t g = 0; g * lanes_ < nq_; ++g) {
    const float* table = table_.get() + g * chunks_ * kEntries * lanes_;
    const std::size_t used = std::min(lanes_, nq_ - g * lanes_);
    float* o = out + g * lanes_ * os;
    std::size_t i = 0;  // the generic instruction set: the plain loops (the same adds)
    if (active_isa() != Isa::generic) {
      i = lanes_ == 8 ? rows8(table, chunks_, bits, stride, n, used, o, os) : rows4(table, chunks_, bits, stride, n, used, o, os);
    }
    tail_rows(table, lanes_, chunks_, bits, stride, i, n, used, o, os);
  }
}

}  // namespace akv::attn
