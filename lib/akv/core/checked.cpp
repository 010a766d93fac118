#include "akv/core/checked.h"

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

}  // namespace akv
