#pragma once
// Deterministic random numbers, identical on every machine and thread count: xoshiro256**
// seeded through splitmix64, and our own uniform/normal transforms (the standard library's
// distributions are implementation-defined, so they are not used).
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace akv {

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Derives an independent stream id from a seed and a path of indices (layer, head, purpose...).
inline std::uint64_t stream_seed(std::uint64_t seed, std::initializer_list<std::uint64_t> path) {
  std::uint64_t s = seed;
  std::uint64_t h = splitmix64(s);
  for (std::uint64_t p : path) {
    std::uint64_t t = h ^ (p + 0x632be59bd9b4e019ull);
    h = splitmix64(t);
  }
  return h;
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
  // Standard normal (Box-Muller, both outputs used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    double u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    double a = 6.283185307179586 * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace akv
