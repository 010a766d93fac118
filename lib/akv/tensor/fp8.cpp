#include "akv/tensor/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace akv {
namespace {

struct Layout {
  int exp_bits, man_bits, bias;
  bool ieee;  // an all-ones exponent holds infinity/NaN (e5m2); else only S.1111.111 is NaN (e4m3)
};

constexpr Layout layout(Fp8Format f) { return f == Fp8Format::e4m3 ? Layout{4, 3, 7, false} : Layout{5, 2, 15, true}; }

// The decoded value of every code, built once from the layout.
std::array<float, 256> decode_table(Fp8Format f) {
  const Layout l = layout(f);
  std::array<float, 256> t{};
  const int exp_mask = (1 << l.exp_bits) - 1, man_mask = (1 << l.man_bits) - 1;
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> l.man_bits) & exp_mask, m = c & man_mask;
    const float sign = (c & 0x80) ? -1.0f : 1.0f;
    float v;
    if (l.ieee && e == exp_mask) {
      v = m == 0 ? INFINITY : NAN;
    } else if (!l.ieee && e == exp_mask && m == man_mask) {
      v = NAN;
    } else if (e == 0) {
      v = std::ldexp(static_cast<float>(m), 1 - l.bias - l.man_bits);
    } else {
      v = std::ldexp(static_cast<float>(m + (1 << l.man_bits)), e - l.bias - l.man_bits);
    }
    t[static_cast<std::size_t>(c)] = sign * v;
  }
  return t;
}

const std::array<float, 256>& table(Fp8Format f) {
  static const std::array<float, 256> e4m3 = decode_table(Fp8Format::e4m3), e5m2 = decode_table(Fp8Format::e5m2);
  return f == Fp8Format::e4m3 ? e4m3 : e5m2;
}

// fp8_encode by bit arithmetic on the f32: normal results round the f32 mantissa to man_bits
// (to nearest, ties to even; a carry moves into the exponent as it should), re-biased;
// subnormal ones are a times 2^(man_bits - emin) (exact) rounded by nearbyint, as the reference
// rounds a / q. NaN and saturation as the reference.
std::uint8_t encode_bits(float x, const Layout& l, float max) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint8_t>(sign | (l.ieee ? 0x7E : 0x7F));
  const float a = std::min(std::fabs(x), max);
  std::uint32_t b;
  std::memcpy(&b, &a, 4);
  const int emin = 1 - l.bias;
  if (b < static_cast<std::uint32_t>(127 + emin) << 23) {
    const float units = std::nearbyint(a * std::ldexp(1.0f, l.man_bits - emin));
    return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(units));
  }
  const int shift = 23 - l.man_bits;
  const std::uint32_t r = b + ((1u << (shift - 1)) - 1u) + ((b >> shift) & 1u);
  return static_cast<std::uint8_t>(sign | ((r >> shift) - (static_cast<std::uint32_t>(127 - l.bias) << l.man_bits)));
}

}  // namespace

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

std::uint8_t fp8_encode(float x, Fp8Format f) {
  const Layout l = layout(f);
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | (l.ieee ? 0x7E : 0x7F));
  const float a = std::min(std::fabs(x), fp8_max(f));  // saturate (infinities too)
  // The spacing of representable values around a: 2^(e - man_bits) for a in [2^e, 2^(e+1)),
  // the subnormal spacing below the smallest normal 2^(1 - bias). a / q is exact (q a power of
  // two, a an f32 well inside the double range); nearbyint rounds half to even.
  const int emin = 1 - l.bias;
  int e = emin;
  if (a >= std::ldexp(1.0f, emin)) e = std::ilogb(a);
  const double q = std::ldexp(1.0, e - l.man_bits);
  const double units = std::nearbyint(static_cast<double>(a) / q);  // value = units * q
  if (units == 0.0) return sign;
  // Normalize: units in [2^man, 2^(man+1)] for normals (2^(man+1) carries into the next binade).
  int m = static_cast<int>(units), ex = e;
  if (m >= (2 << l.man_bits)) {
    m >>= 1;
    ++ex;
  }
  if (m < (1 << l.man_bits)) return static_cast<std::uint8_t>(sign | m);  // subnormal (ex == emin)
  const int field = ex + l.bias;
  return static_cast<std::uint8_t>(sign | (field << l.man_bits) | (m - (1 << l.man_bits)));
}

float fp8_decode(std::uint8_t code, Fp8Format f) { return table(f)[code]; }

void fp8_encode_rows(const float* src, std::size_t n, float scale, Fp8Format f, std::uint8_t* dst) {
  const Layout l = layout(f);
  const float max = fp8_max(f);
  for (std::size_t i = 0; i < n; ++i) dst[i] = encode_bits(src[i] / scale, l, max);
}

void fp8_decode_rows(const std::uint8_t* src, std::size_t n, float scale, Fp8Format f, float* dst) {
  const std::array<float, 256>& t = table(f);
  for (std::size_t i = 0; i < n; ++i) dst[i] = t[src[i]] * scale;
}

}  // namespace akv
