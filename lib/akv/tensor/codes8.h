#pragma once
// Eight low-bit codes at a time, for the AVX2 decoders of packed rows (quant/nuq.cpp,
// tensor/turboquant.cpp): codes of `Bits` bits packed from the low bit up (code j at bits
// [j Bits, (j + 1) Bits) of the row), so eight codes fill exactly Bits bytes, and 8- or 16-entry
// tables looked up by permutes. Header-only; compiled where the including file has AVX2.
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>

namespace akv {

// The eight codes of the Bits bytes at p (Bits 1, 2, 3 or 4), as 32-bit lanes. `wide`: p may be
// read four bytes deep (3-bit rows with a byte after these three: one load instead of two).
template <int Bits>
inline __m256i codes8(const std::uint8_t* p, bool wide = false) {
  static_assert(Bits >= 1 && Bits <= 4, "codes8 unpacks 1 to 4 bits");
  // Loads of constant size only: a copy of 3 or 4 bytes chosen at run time compiled to a byte loop
  // into memory read back as one word, a failed store-to-load forward per call (3-bit nuq rows
  // decoded 4x slower).
  std::uint32_t w = 0;
  if constexpr (Bits == 3) {
    if (wide) {
      std::memcpy(&w, p, 4);
    } else {
      std::uint16_t low = 0;
      std::memcpy(&low, p, 2);
      w = low | static_cast<std::uint32_t>(p[2]) << 16;
    }
  } else {
    std::memcpy(&w, p, Bits);
  }
  const __m256i shifts = _mm256_setr_epi32(0, Bits, 2 * Bits, 3 * Bits, 4 * Bits, 5 * Bits, 6 * Bits, 7 * Bits);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts),
                          _mm256_set1_epi32((1 << Bits) - 1));
}

// Codes i .. i + 7 (i a multiple of 8) of a row of `bits`-bit codes.
inline __m256i codes8_at(const std::uint8_t* row, std::size_t i, int bits) {
  const std::uint8_t* p = row + i / 8 * static_cast<std::size_t>(bits);
  switch (bits) {
    case 1: return codes8<1>(p);
    case 2: return codes8<2>(p);
    case 3: return codes8<3>(p);
    default: return codes8<4>(p);
  }
}

// table[idx] for eight indices, table = lo (entries 0-7) and, when `sixteen`, hi (8-15): one
// permute, or two and a blend.
inline __m256 lookup8(__m256 lo, __m256 hi, __m256i idx, bool sixteen) {
  const __m256 v = _mm256_permutevar8x32_ps(lo, idx);
  if (!sixteen) return v;
  return _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7))));
}

}  // namespace akv
#endif
