#include "akv/core/sort.h"

#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace akv {
namespace {

constexpr int kDigitBits = 11;
constexpr std::uint64_t kDigitMask = (1u << kDigitBits) - 1;
constexpr int kPasses = (64 + kDigitBits - 1) / kDigitBits;
constexpr std::uint64_t kSign = std::uint64_t{1} << 63;

// Unsigned keys in the values' order: negatives' bits inverted, positives' sign bit set.
// same_zero: -0 takes +0's key.
std::uint64_t key_of(double v, bool same_zero) {
  if (std::isnan(v)) throw std::logic_error("sort: NaN");
  if (same_zero && v == 0.0) v = 0.0;
  const auto b = std::bit_cast<std::uint64_t>(v);
  return (b & kSign) ? ~b : b | kSign;
}

double value_of(std::uint64_t k) { return std::bit_cast<double>((k & kSign) ? k & ~kSign : ~k); }

// Stable LSD radix sort of keys, payload (when not null) moved alongside.
void radix_sort(std::vector<std::uint64_t>& keys, std::vector<std::uint32_t>* payload) {
  const std::size_t n = keys.size();
  if (n < 2) return;
  std::vector<std::array<std::size_t, kDigitMask + 1>> count(kPasses);
  for (const std::uint64_t k : keys) {
    for (int p = 0; p < kPasses; ++p) ++count[p][(k >> (p * kDigitBits)) & kDigitMask];
  }
  std::vector<std::uint64_t> keys_to(n);
  std::vector<std::uint32_t> payload_to(payload ? n : 0);
  for (int p = 0; p < kPasses; ++p) {
    const int shift = p * kDigitBits;
    std::array<std::size_t, kDigitMask + 1>& c = count[p];
    if (c[(keys[0] >> shift) & kDigitMask] == n) continue;  // one digit for all: the order stands
    std::size_t at = 0;
    for (std::size_t& b : c) {
      const std::size_t m = b;
      b = at;
      at += m;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t to = c[(keys[i] >> shift) & kDigitMask]++;
      keys_to[to] = keys[i];
      if (payload) payload_to[to] = (*payload)[i];
    }
    keys.swap(keys_to);
    if (payload) payload->swap(payload_to);
  }
}

}  // namespace

void sort_values(std::vector<double>& x) {
  std::vector<std::uint64_t> keys(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) keys[i] = key_of(x[i], false);
  radix_sort(keys, nullptr);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = value_of(keys[i]);
}

std::vector<std::uint32_t> stable_order(const std::vector<double>& x) {
  if (x.size() >= (std::uint64_t{1} << 32)) throw std::logic_error("stable_order: 2^32 values or more");
  std::vector<std::uint64_t> keys(x.size());
  std::vector<std::uint32_t> order(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    keys[i] = key_of(x[i], true);
    order[i] = static_cast<std::uint32_t>(i);
  }
  radix_sort(keys, &order);
  return order;
}

}  // namespace akv
