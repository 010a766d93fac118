#pragma once
// Software prefetch of code/value rows ahead of use, shared by the attention's vector loops
// (kernels_simd.h, int8_simd.h; internal).
#include <cstddef>
#include <cstdint>

namespace akv::attn {

// With several query heads per KV head, rows are prefetched this many rows ahead of use (into
// the next tile): the FMAs between two rows keep the out-of-order window from reaching far
// enough ahead for DRAM latency, and 4 KB pages stop the hardware prefetchers at every page.
// With one head the loops are bandwidth-bound and the hardware prefetchers do better alone
// (measured: dense f16 at GQA 1 20% slower with the prefetches, GQA 4 22% faster).
constexpr std::size_t kPrefetchRows = 32;

[[gnu::always_inline]] inline void prefetch_row(const std::uint8_t* row, std::size_t stride) {
  const std::uint8_t* p = row + kPrefetchRows * stride;
  for (std::size_t b = 0; b < stride; b += 64) __builtin_prefetch(p + b, 0, 3);
}

}  // namespace akv::attn
