#pragma once
// Rotation before quantization (llama.cpp's attention rotation, QuaRot, TurboQuant's first step):
// a tensor's rows are multiplied by an orthonormal matrix R before they are quantized and stored,
// so outlier channels spread over a block of coordinates. Attention then needs no inverse on the
// keys (q.k = (Rq).(Rk): the query is rotated once per step) and one on its output for the values
// (sum p_t v_t = R^T sum p_t (R v_t)). docs/compress.md ("Rotation").
//
//   hadamard  R = H: the normalized Walsh-Hadamard matrix (Sylvester order, entries +-1/sqrt(n))
//             applied to each block of n consecutive channels; H is symmetric and H H = I.
//   random    R = H D: D a diagonal of random signs (one per channel, from the seed).
//
// Block n: keys the largest power of two dividing head_dim, values min(64, that), as llama.cpp
// picks them (src/llama-kv-cache.cpp, which rotates only when head_dim is a multiple of 64).
// The fast transform scales each row by 1/sqrt(n) first and then runs the butterflies with the
// stride doubling from 1 (u + v, u - v), the order of llama.cpp's CPU kernel
// (ggml_compute_forward_fwht), so the same f32 rows give the same bits.
#include <cstddef>
#include <cstdint>
#include <string>

namespace akv {

enum class RotationKind : std::uint8_t { none, hadamard, random };
std::string rotation_name(RotationKind k);
// "none", "hadamard" or "random"; InvalidInput naming `field` otherwise.
RotationKind parse_rotation(const std::string& s, const std::string& file = "", const std::string& field = "--rotate");

struct Rotation {
  RotationKind kind = RotationKind::none;
  std::uint32_t block = 0;  // channels per Hadamard block (a power of two dividing head_dim)
  std::uint64_t seed = 0;   // random: the signs' seed
  bool active() const { return kind != RotationKind::none; }
  bool operator==(const Rotation& o) const { return kind == o.kind && block == o.block && seed == o.seed; }
  bool operator!=(const Rotation& o) const { return !(*this == o); }
};

// The rotation of a key (key = true) or value tensor of head_dim channels (see above); none
// when kind is none.
Rotation tensor_rotation(RotationKind kind, std::uint64_t seed, std::size_t head_dim, bool key);

// The sign of channel c under a random rotation with this seed (true: -1).
bool rotation_sign_negative(std::uint64_t seed, std::size_t c);

// rows [n, head_dim] <- R rows (rotate) or R^T rows (unrotate), in place; head_dim a multiple
// of r.block. No-op when r is none.
void rotate_rows(const Rotation& r, float* rows, std::size_t n, std::size_t head_dim);
void unrotate_rows(const Rotation& r, float* rows, std::size_t n, std::size_t head_dim);

// Reference: the explicit matrix (entries (-1)^popcount(i & j) / sqrt(n), signs applied as a
// diagonal) in double, rounded once to f32. The fast transform equals it within
// 2 log2(n) sqrt(n) 2^-24 max|x| per element (each butterfly stage rounds once; the later
// stages can add up to 2^(stages left) such errors; tests/unit/test_quant.cpp).
void rotate_rows_ref(const Rotation& r, float* rows, std::size_t n, std::size_t head_dim, bool inverse);

}  // namespace akv
