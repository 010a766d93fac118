#pragma once
// Sizes computed from counts that a file declares (untrusted): products and sums that throw
// InvalidInput naming the file and field instead of wrapping past 2^64. Readers bound the result
// by the real file size (or a stated maximum) before allocating.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "akv/core/errors.h"

namespace akv {

// a / b rounded up (b > 0; a + b far below 2^64: sizes of real tensors, no check).
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// a * b; InvalidInput (`where`, with the operands) on overflow.
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const Where& where);
// The product of all factors.
std::uint64_t checked_product(std::initializer_list<std::uint64_t> factors, const Where& where);
// a + b; InvalidInput on overflow.
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const Where& where);

}  // namespace akv
