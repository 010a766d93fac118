#include "akv/quant/nuq_avx512.h"

#include <immintrin.h>

#include <cstring>

namespace akv {
namespace {

// Sixteen codes of Bits bits (2, 3 or 4) from the 2 Bits bytes at p, packed from the low bit up;
// `wide`: Bits + 4 bytes may be read.
template <int Bits>
__m512i load_codes16(const std::uint8_t* p, bool wide) {
  // Two words of eight codes (Bits bytes each, read as 32 bits where the row allows), each
  // broadcast over eight 32-bit lanes and shifted by Bits i.
  std::uint32_t w0 = 0, w1 = 0;
  if (wide) {
    std::memcpy(&w0, p, 4);
    std::memcpy(&w1, p + Bits, 4);
  } else {
    std::memcpy(&w0, p, Bits);
    std::memcpy(&w1, p + Bits, Bits);
  }
  const __m512i words = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(w0))),
                                           _mm256_set1_epi32(static_cast<int>(w1)), 1);
  const __m512i shifts = _mm512_setr_epi32(0, Bits, 2 * Bits, 3 * Bits, 4 * Bits, 5 * Bits, 6 * Bits, 7 * Bits, 0, Bits,
                                           2 * Bits, 3 * Bits, 4 * Bits, 5 * Bits, 6 * Bits, 7 * Bits);
  return _mm512_and_si512(_mm512_srlv_epi32(words, shifts), _mm512_set1_epi32((1 << Bits) - 1));
}

inline __m512 decode_level(__m512 lv, __m512 rg, __m512 off) {
  const __m512 x = _mm512_add_ps(_mm512_mul_ps(lv, rg), off);
  const __m512 y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_EQ_OQ), x);
  return _mm512_cvtph_ps(_mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <int Bits>
std::size_t decode(const float* levels16, const std::uint8_t* packed, const float* range, const float* offset,
                   bool per_row, std::size_t n, float* o) {
  __m512 table = _mm512_loadu_ps(levels16);
  if (per_row) table = decode_level(table, _mm512_set1_ps(range[0]), _mm512_set1_ps(offset[0]));
  const std::size_t bytes = (n * Bits + 7) / 8;
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const std::size_t at = j / 8 * Bits;
    const __m512 lv = _mm512_permutexvar_ps(load_codes16<Bits>(packed + at, at + Bits + 4 <= bytes), table);
    _mm512_storeu_ps(o + j, per_row ? lv : decode_level(lv, _mm512_loadu_ps(range + j), _mm512_loadu_ps(offset + j)));
  }
  return j;
}

}  // namespace

std::size_t nuq_decode_values_avx512(const float* levels16, int bits, const std::uint8_t* packed, const float* range,
                                     const float* offset, bool per_row, std::size_t n, float* o) {
  switch (bits) {
    case 2: return decode<2>(levels16, packed, range, offset, per_row, n, o);
    case 3: return decode<3>(levels16, packed, range, offset, per_row, n, o);
    case 4: return decode<4>(levels16, packed, range, offset, per_row, n, o);
    default: return 0;
  }
}

}  // namespace akv
