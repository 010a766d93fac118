#include "akv/core/checked.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

namespace akv {

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const Where& where) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InvalidInput("size overflows 64 bits (" + std::to_string(a) + " x " + std::to_string(b) + ")", where);
  }
  return r;
}

std::uint64_t checked_product(std::initializer_list<std::uint64_t> factors, const Where& where) {
  std::uint64_t r = 1;
  for (std::uint64_t f : factors) r = checked_mul(r, f, where);
  return r;
}

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const Where& where) {
  std::uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw InvalidInput("size overflows 64 bits (" + std::to_string(a) + " + " + std::to_string(b) + ")", where);
  }
  return r;
}

std::size_t first_nonfinite(const float* x, std::size_t n) {
  constexpr std::size_t kBlock = 256;
  constexpr std::uint32_t kExponent = 0x7f800000u;  // all ones: an infinity or a NaN
  for (std::size_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::size_t m = std::min(kBlock, n - i0);
    std::uint32_t least = kExponent;  // the least of the exponents' complements: 0 when one is all ones
    for (std::size_t j = 0; j < m; ++j) least = std::min(least, ~std::bit_cast<std::uint32_t>(x[i0 + j]) & kExponent);
    if (least != 0) continue;
    for (std::size_t j = 0; j < m; ++j) {
      if (!std::isfinite(x[i0 + j])) return i0 + j;
    }
  }
  return n;
}

}  // namespace akv
