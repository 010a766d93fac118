#include "akv/core/sort.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace akv {
namespace {

constexpr int kDigitBits = 11;
constexpr std::uint64_t kDigitMask = (1u << kDigitBits) - 1;

// Unsigned keys in the values' order: negatives' bits inverted, positives' sign bit set (K:
// uint64_t for doubles, uint32_t for floats). same_zero: -0 takes +0's key.
template <class K, class F>
K key_of(F v, bool same_zero) {
  constexpr K kSign = K{1} << (8 * sizeof(K) - 1);
  if (std::isnan(v)) throw std::logic_error("sort: NaN");
  if (same_zero && v == 0) v = 0;
  const auto b = std::bit_cast<K>(v);
  return (b & kSign) ? ~b : b | kSign;
}

template <class F, class K>
F value_of(K k) {
  constexpr K kSign = K{1} << (8 * sizeof(K) - 1);
  return std::bit_cast<F>((k & kSign) ? static_cast<K>(k & ~kSign) : static_cast<K>(~k));
}

// Stable LSD radix sort of keys, payload (when not null) moved alongside.
template <class K>
void radix_sort(std::vector<K>& keys, std::vector<std::uint32_t>* payload) {
  constexpr int kPasses = (8 * static_cast<int>(sizeof(K)) + kDigitBits - 1) / kDigitBits;
  const std::size_t n = keys.size();
  if (n < 2) return;
  std::vector<std::array<std::size_t, kDigitMask + 1>> count(kPasses);
  for (const K k : keys) {
    for (int p = 0; p < kPasses; ++p) ++count[p][(k >> (p * kDigitBits)) & kDigitMask];
  }
  std::vector<K> keys_to(n);
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

// Whether every value is one a float holds exactly (nuq's normalized rows): such values sort by
// 32-bit keys in three passes of half the bytes. NaN is not one of them (it goes on to the
// double keys, which refuse it).
bool f32_exact(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double v) {
    return std::isinf(v) || (std::fabs(v) <= std::numeric_limits<float>::max() && static_cast<double>(static_cast<float>(v)) == v);
  });
}

// x sorted through keys of type K made from F-typed values.
template <class K, class F>
void sort_as(std::vector<double>& x) {
  std::vector<K> keys(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) keys[i] = key_of<K>(static_cast<F>(x[i]), false);
  radix_sort(keys, nullptr);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(value_of<F>(keys[i]));
}

// order (the identity) permuted into x's stable ascending order through keys of type K made
// from F-typed values, -0 and +0 taking one key.
template <class K, class F>
void order_as(const std::vector<double>& x, std::vector<std::uint32_t>& order) {
  std::vector<K> keys(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) keys[i] = key_of<K>(static_cast<F>(x[i]), true);
  radix_sort(keys, &order);
}

}  // namespace

void sort_values(std::vector<double>& x) {
  if (f32_exact(x)) {
    sort_as<std::uint32_t, float>(x);
  } else {
    sort_as<std::uint64_t, double>(x);
  }
}

std::vector<std::uint32_t> stable_order(const std::vector<double>& x) {
  if (x.size() >= (std::uint64_t{1} << 32)) throw std::logic_error("stable_order: 2^32 values or more");
  std::vector<std::uint32_t> order(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  if (f32_exact(x)) {
    order_as<std::uint32_t, float>(x, order);
  } else {
    order_as<std::uint64_t, double>(x, order);
  }
  return order;
}

}  // namespace akv
