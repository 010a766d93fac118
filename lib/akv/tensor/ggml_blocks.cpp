#include "akv/tensor/ggml_blocks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "akv/core/isa.h"
#include "akv/tensor/fp8.h"
#include "akv/tensor/ggml_fields.h"
#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"

namespace akv {
namespace {

using ggml::f16_at;
using ggml::scale_min_k4;

constexpr std::size_t kQK = 256;  // elements per K-quant super-block

constexpr std::array<GgmlTypeInfo, 12> kTypes = {{
    {0, "F32", 1, 4},
    {1, "F16", 1, 2},
    {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},
    {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},
    {12, "Q4_K", kQK, 144},
    {13, "Q5_K", kQK, 176},
    {14, "Q6_K", kQK, 210},
    {20, "IQ4_NL", 32, 18},
    {30, "BF16", 1, 2},
}};

// The 8-bit float cache types (tensor/fp8.h): not ggml's, so outside kTypes (a GGUF file never
// names them); found by name only.
constexpr std::array<GgmlTypeInfo, 2> kFp8Types = {{
    {kFp8E4m3Id, "FP8_E4M3", 1, 1},
    {kFp8E5m2Id, "FP8_E5M2", 1, 1},
}};

// Q4_0, Q4_1, Q5_0, Q5_1: 32 elements, element j in the low nibble of byte j, j + 16 in the high
// nibble; the 5-bit types add bit j of qh as the 5th bit of element j.
void small_block(std::uint32_t id, const std::uint8_t* b, float* y) {
  const ggml::SmallBlock f = ggml::small_block_fields(id, b);
  for (std::size_t j = 0; j < 32; ++j) {
    int q = j < 16 ? f.qs[j] & 0x0F : f.qs[j - 16] >> 4;
    if (f.five) q |= static_cast<int>((f.qh >> j) & 1u) << 4;
    const float v = static_cast<float>(q - f.offset) * f.d;
    y[j] = f.has_min ? v + f.m : v;
  }
}

#if defined(__AVX2__)
// Elements 8 part .. 8 part + 7 of a 32-element block in the low 8 bytes: lo holds elements
// 0..15 (the low nibbles), hi 16..31 (the high ones), one byte each.
inline __m128i part8(__m128i lo, __m128i hi, int part) {
  const __m128i src = part < 2 ? lo : hi;
  return part % 2 ? _mm_srli_si128(src, 8) : src;
}

// small_block and IQ4_NL's loop, 8 elements a vector: the same conversion, product and sum per
// element (this unit contracts nothing: the same bits).
void small_block_avx2(std::uint32_t id, const std::uint8_t* b, float* y) {
  const ggml::SmallBlock f = ggml::small_block_fields(id, b);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(f.qs)), nib = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(qs, nib), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nib);
  const __m256 d = _mm256_set1_ps(f.d), m = _mm256_set1_ps(f.m);
  const __m256i offset = _mm256_set1_epi32(f.offset), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int part = 0; part < 4; ++part) {
    __m256i q = _mm256_cvtepu8_epi32(part8(lo, hi, part));
    if (f.five) {  // bit 8 part + lane of qh as the 5th bit
      const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(f.qh >> (8 * part))), lane),
                                           _mm256_set1_epi32(1));
      q = _mm256_or_si256(q, _mm256_slli_epi32(bit, 4));
    }
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, offset)), d);
    if (f.has_min) v = _mm256_add_ps(v, m);
    _mm256_storeu_ps(y + 8 * part, v);
  }
}

void iq4_nl_block_avx2(const std::uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(ggml::f16_at(b));
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)), nib = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, nib));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), nib));
  for (int part = 0; part < 4; ++part) {
    const __m256i v = _mm256_cvtepi8_epi32(part8(lo, hi, part));
    _mm256_storeu_ps(y + 8 * part, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
  }
}

void q8_0_block_avx2(const std::uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(ggml::f16_at(b));
  for (int part = 0; part < 4; ++part) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * part));
    _mm256_storeu_ps(y + 8 * part, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
  }
}

// The 32-element types' blocks with AVX2 (the plain loops' bits); false for the others.
bool dequantize_avx2(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t blocks, float* dst) {
  switch (type.id) {
    case 2:
    case 3:
    case 6:
    case 7:
      for (std::size_t k = 0; k < blocks; ++k) small_block_avx2(type.id, src + k * type.bytes, dst + k * 32);
      return true;
    case 8:
      for (std::size_t k = 0; k < blocks; ++k) q8_0_block_avx2(src + k * type.bytes, dst + k * 32);
      return true;
    case 20:
      for (std::size_t k = 0; k < blocks; ++k) iq4_nl_block_avx2(src + k * type.bytes, dst + k * 32);
      return true;
    default:
      return false;
  }
}
#endif

void k4_block(const std::uint8_t* b, float* y, bool five) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;                // Q5_K only
  const std::uint8_t* qs = b + (five ? 48 : 16);
  for (std::size_t g = 0; g < 8; ++g) {
    int sc = 0, m = 0;
    scale_min_k4(g, scales, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const std::uint8_t* chunk = qs + 32 * (g / 2);
    for (std::size_t l = 0; l < 32; ++l) {
      int q = g % 2 == 0 ? chunk[l] & 0x0F : chunk[l] >> 4;
      if (five) q |= ((qh[l] >> g) & 1) << 4;
      y[32 * g + l] = dl * static_cast<float>(q) - ml;
    }
  }
}

void q6_k_block(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (std::size_t half = 0; half < 2; ++half) {
    const std::uint8_t* l4 = ql + 64 * half;
    const std::uint8_t* h2 = qh + 32 * half;
    float* out = y + 128 * half;
    for (std::size_t l = 0; l < 32; ++l) {
      const int q[4] = {(l4[l] & 0x0F) | (((h2[l] >> 0) & 3) << 4), (l4[l + 32] & 0x0F) | (((h2[l] >> 2) & 3) << 4),
                        (l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4), (l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)};
      for (std::size_t k = 0; k < 4; ++k) {
        const std::size_t i = 32 * k + l;  // element within the half
        const float dl = d * static_cast<float>(sc[8 * half + i / 16]);
        out[i] = dl * static_cast<float>(q[k] - 32);
      }
    }
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;  // fp8 and TurboQuant types are cache-only: by name
}

const GgmlTypeInfo* ggml_type_info_by_name(const std::string& name) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (name == t.name) return &t;
  }
  for (const GgmlTypeInfo& t : kFp8Types) {
    if (name == t.name) return &t;
  }
  for (const GgmlTypeInfo& t : tq_type_table()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::optional<Fp8Format> fp8_format_of(const GgmlTypeInfo& type) {
  if (type.id == kFp8E4m3Id) return Fp8Format::e4m3;
  if (type.id == kFp8E5m2Id) return Fp8Format::e5m2;
  return std::nullopt;
}

std::string ggml_type_name(std::uint32_t id) {
  const GgmlTypeInfo* t = ggml_type_info(id);
  return t ? std::string(t->name) : "type " + std::to_string(id);
}

std::string ggml_supported_types() {
  std::string out;
  for (const GgmlTypeInfo& t : kTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

namespace {

// The first of n values of type T (an f32, f16 or bf16 bit pattern) whose exponent bits `mask`
// are all set (Inf or NaN), or n. Chunks are scanned without an early exit, which the compiler
// vectorizes (a model's weights are checked at load: 158 MB in ~10 ms instead of ~100 ms).
template <typename T>
std::size_t first_all_ones(const std::uint8_t* src, std::size_t n, T mask) {
  constexpr std::size_t kChunk = 4096;
  T chunk[kChunk];
  for (std::size_t c = 0; c < n; c += kChunk) {
    const std::size_t len = std::min(kChunk, n - c);
    std::memcpy(chunk, src + c * sizeof(T), len * sizeof(T));
    unsigned bad = 0;
    for (std::size_t i = 0; i < len; ++i) bad |= static_cast<unsigned>((chunk[i] & mask) == mask);
    if (!bad) continue;
    for (std::size_t i = 0; i < len; ++i) {
      if ((chunk[i] & mask) == mask) return c + i;
    }
  }
  return n;
}

}  // namespace

std::size_t ggml_first_nonfinite(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n) {
  auto bits16 = [&](const std::uint8_t* p) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  };
  if (const auto f = fp8_format_of(type)) {  // e4m3: NaN is S.1111.111; e5m2: Inf and NaN are S.11111.xx
    const unsigned all_ones = *f == Fp8Format::e4m3 ? 0x7Fu : 0x7Cu;
    for (std::size_t i = 0; i < n; ++i) {
      if ((src[i] & all_ones) == all_ones) return i;
    }
    return n;
  }
  if (const auto t = tq_type_of(type)) return tq_first_nonfinite(*t, src, n);
  switch (type.id) {
    case 0: return first_all_ones<std::uint32_t>(src, n, 0x7F800000u);
    case 1: return first_all_ones<std::uint16_t>(src, n, 0x7C00);
    case 30: return first_all_ones<std::uint16_t>(src, n, 0x7F80);
    default: {
      // f16 fields of each block: d (all), m / dmin (Q4_1, Q5_1, Q4_K, Q5_K), Q6_K's d at 208.
      const bool second = type.id == 3 || type.id == 7 || type.id == 12 || type.id == 13;
      const std::size_t first = type.id == 14 ? 208 : 0;
      for (std::size_t k = 0; k < n / type.block; ++k) {
        const std::uint8_t* b = src + k * type.bytes;
        if (f16_nonfinite(bits16(b + first)) || (second && f16_nonfinite(bits16(b + 2)))) {
          return k * type.block;
        }
      }
      return n;
    }
  }
}

void ggml_dequantize_scaled(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n, float scale, float* dst) {
  if (const auto f = fp8_format_of(type)) {
    fp8_decode_rows(src, n, scale, *f, dst);
    return;
  }
  if (scale != 1.0f) throw std::logic_error("ggml_dequantize_scaled: a scale with a ggml type");
  ggml_dequantize(type, src, n, dst);
}

void ggml_dequantize(const GgmlTypeInfo& type, const std::uint8_t* src, std::size_t n, float* dst) {
  const std::size_t blocks = n / type.block;
  if (const auto f = fp8_format_of(type)) {
    fp8_decode_rows(src, n, 1.0f, *f, dst);
    return;
  }
  if (const auto t = tq_type_of(type)) {
    tq_decode_rows(*t, src, n / t->head_dim, dst);
    return;
  }
#if defined(__AVX2__)
  if (active_isa() >= Isa::avx2 && dequantize_avx2(type, src, blocks, dst)) return;
#endif
  switch (type.id) {
    case 0:
      std::memcpy(dst, src, n * 4);
      return;
    case 1:
      for (std::size_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      return;
    case 30:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32_ref(h);
      }
      return;
    case 8:
      for (std::size_t k = 0; k < blocks; ++k) {
        const std::uint8_t* b = src + k * type.bytes;
        const float d = f16_at(b);
        for (std::size_t j = 0; j < 32; ++j) dst[k * 32 + j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
      }
      return;
    case 12:
    case 13:
      for (std::size_t k = 0; k < blocks; ++k) k4_block(src + k * type.bytes, dst + k * kQK, type.id == 13);
      return;
    case 14:
      for (std::size_t k = 0; k < blocks; ++k) q6_k_block(src + k * type.bytes, dst + k * kQK);
      return;
    case 20:
      for (std::size_t k = 0; k < blocks; ++k) {
        const std::uint8_t* b = src + k * type.bytes;
        const float d = f16_at(b);
        for (std::size_t j = 0; j < 16; ++j) {
          dst[k * 32 + j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 0x0F]);
          dst[k * 32 + j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
        }
      }
      return;
    default:
      for (std::size_t k = 0; k < blocks; ++k) small_block(type.id, src + k * type.bytes, dst + k * 32);
      return;
  }
}

}  // namespace akv
