#pragma once
// Sizes computed from counts that a file declares (untrusted): products and sums that throw
// InvalidInput naming the file and field instead of wrapping past 2^64. Readers bound the result
// by the real file size (or a stated maximum) before allocating. And the finiteness of values.
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

// The index of the first NaN or infinity among x[0, n), n when every value is finite: the check
// of values read from files and of activations, a block of values at a time by one vectorized
// test, then the block that holds one scanned.
std::size_t first_nonfinite(const float* x, std::size_t n);

}  // namespace akv
