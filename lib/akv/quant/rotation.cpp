#include "akv/quant/rotation.h"

#include <bit>
#include <cmath>
#include <vector>

#include "akv/core/errors.h"
#include "akv/core/rng.h"

namespace akv {
namespace {

std::size_t largest_power_of_two_dividing(std::size_t n) { return n == 0 ? 0 : n & (~n + 1); }

// x [n] <- H x with H the normalized Sylvester Hadamard matrix: scale, then butterflies with
// the stride doubling from 1 (llama.cpp's CPU order).
void fwht(float* x, std::size_t n) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (std::size_t j = 0; j < n; ++j) x[j] *= scale;
  for (std::size_t len = 1; len < n; len <<= 1) {
    for (std::size_t i = 0; i < n; i += 2 * len) {
      for (std::size_t j = i; j < i + len; ++j) {
        const float u = x[j], v = x[j + len];
        x[j] = u + v;
        x[j + len] = u - v;
      }
    }
  }
}

void apply_signs(const Rotation& r, float* row, std::size_t d) {
  for (std::size_t c = 0; c < d; ++c) {
    if (rotation_sign_negative(r.seed, c)) row[c] = -row[c];
  }
}

void check_shape(const Rotation& r, std::size_t d) {
  if (r.block == 0 || (r.block & (r.block - 1)) != 0 || d % r.block != 0) {
    throw InvalidInput("rotation block must be a power of two dividing head_dim " + std::to_string(d),
                       {"", "rotation.block", std::to_string(r.block)});
  }
}

}  // namespace

std::string rotation_name(RotationKind k) {
  switch (k) {
    case RotationKind::none: return "none";
    case RotationKind::hadamard: return "hadamard";
    case RotationKind::random: return "random";
  }
  return "none";
}

RotationKind parse_rotation(const std::string& s, const std::string& file, const std::string& field) {
  if (s == "none") return RotationKind::none;
  if (s == "hadamard") return RotationKind::hadamard;
  if (s == "random") return RotationKind::random;
  throw InvalidInput("unknown rotation (expected none, hadamard or random)", {file, field, s});
}

Rotation tensor_rotation(RotationKind kind, std::uint64_t seed, std::size_t head_dim, bool key) {
  if (kind == RotationKind::none) return {};
  std::size_t block = largest_power_of_two_dividing(head_dim);
  if (!key && block > 64) block = 64;
  return {kind, static_cast<std::uint32_t>(block), kind == RotationKind::random ? seed : 0};
}

bool rotation_sign_negative(std::uint64_t seed, std::size_t c) {
  return (stream_seed(seed, {0x726f74u, c}) >> 63) != 0;  // "rot"
}

void rotate_rows(const Rotation& r, float* rows, std::size_t n, std::size_t d) {
  if (!r.active()) return;
  check_shape(r, d);
  for (std::size_t i = 0; i < n; ++i) {
    float* row = rows + i * d;
    if (r.kind == RotationKind::random) apply_signs(r, row, d);
    for (std::size_t b = 0; b < d; b += r.block) fwht(row + b, r.block);
  }
}

void unrotate_rows(const Rotation& r, float* rows, std::size_t n, std::size_t d) {
  if (!r.active()) return;
  check_shape(r, d);
  for (std::size_t i = 0; i < n; ++i) {
    float* row = rows + i * d;
    for (std::size_t b = 0; b < d; b += r.block) fwht(row + b, r.block);
    if (r.kind == RotationKind::random) apply_signs(r, row, d);
  }
}

void rotate_rows_ref(const Rotation& r, float* rows, std::size_t n, std::size_t d, bool inverse) {
  if (!r.active()) return;
  check_shape(r, d);
  const std::size_t m = r.block;
  const double norm = 1.0 / std::sqrt(static_cast<double>(m));
  std::vector<double> x(d), y(d);
  for (std::size_t i = 0; i < n; ++i) {
    float* row = rows + i * d;
    const auto sign = [&](std::size_t c) {
      return r.kind == RotationKind::random && rotation_sign_negative(r.seed, c) ? -1.0 : 1.0;
    };
    for (std::size_t c = 0; c < d; ++c) x[c] = row[c] * (inverse ? 1.0 : sign(c));
    for (std::size_t b = 0; b < d; b += m) {
      for (std::size_t a = 0; a < m; ++a) {
        double s = 0.0;
        for (std::size_t c = 0; c < m; ++c) {
          s += ((std::popcount(a & c) & 1) ? -norm : norm) * x[b + c];
        }
        y[b + a] = s;
      }
    }
    for (std::size_t c = 0; c < d; ++c) row[c] = static_cast<float>(y[c] * (inverse ? sign(c) : 1.0));
  }
}

}  // namespace akv
