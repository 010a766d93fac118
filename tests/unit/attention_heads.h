#pragma once
// Test fixtures of the attention module: KV heads with packed and dense parts, random data, the
// relative error, and a loop over the instruction sets (test_attention, test_int8_attention).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "akv/attention/kernels.h"
#include "akv/attention/kv_view.h"
#include "akv/core/isa.h"
#include "akv/core/rng.h"
#include "akv/kv/stored_tensor.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"

namespace akv::test {

struct Layout {
  std::size_t d = 128, n = 300, quant_k = 256, quant_v = 290;
  int bits_k = 4, bits_v = 4;
  std::size_t group = 32, outliers = 0;
  QuantAxis axis_k = QuantAxis::channel, axis_v = QuantAxis::token;
  DenseType dense = DenseType::f16;
  Rotation rot_k, rot_v;  // the stored rows read as rotated rows (quant/rotation.h)
};

// One KV head's keys and values: the first quant_k / quant_v rows packed, the rest dense.
struct TestHead {
  PackedTensor key, value;
  HeadView view() const { return {key.view(), value.view()}; }
};

inline std::vector<float> normal(std::size_t n, std::uint64_t seed, double mean = 0.0, double sd = 1.0) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(mean + sd * rng.normal());
  return x;
}

// f16 bits of normal(n, seed): finite scales and zeros as the caches store them.
inline std::vector<std::uint16_t> normal_f16(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint16_t> h;
  for (float v : normal(n, seed)) h.push_back(f32_to_f16_ref(v));
  return h;
}

inline void fill(PackedTensor& t, const std::vector<float>& x, std::size_t n_quant, int bits,
          QuantAxis axis, std::size_t group, std::size_t d, std::size_t n_out) {
  std::vector<std::uint16_t> chans;
  for (std::size_t j = 0; j < n_out; ++j) chans.push_back(static_cast<std::uint16_t>(3 + 5 * j));
  const std::size_t cols = d - n_out;
  std::vector<float> in(n_quant * cols);
  std::vector<std::uint16_t> out(n_quant * n_out);
  for (std::size_t r = 0; r < n_quant; ++r) {
    for (std::size_t c = 0, a = 0, o = 0; c < d; ++c) {
      if (o < n_out && chans[o] == c) {
        out[r * n_out + o++] = f32_to_f16_ref(x[r * d + c]);
      } else {
        in[r * cols + a++] = x[r * d + c];
      }
    }
  }
  // Two blocks when possible, to exercise appending (the first of whole groups).
  const std::size_t split = axis == QuantAxis::channel ? (n_quant / 2) / group * group : n_quant / 2;
  for (auto [r0, r1] : {std::pair{std::size_t{0}, split}, std::pair{split, n_quant}}) {
    if (r1 == r0) continue;
    const QuantizedBlock b = quantize_block(in.data() + r0 * cols, r1 - r0, cols, axis, bits, group, QuantRule::kivi);
    t.append_packed(b, chans, out.data() + r0 * n_out);
  }
  t.append_dense(x.data() + n_quant * d, x.size() / d - n_quant);
}

inline std::unique_ptr<TestHead> make_head(const Layout& l, std::uint64_t seed) {
  auto h = std::make_unique<TestHead>();
  h->key = PackedTensor(l.d, l.dense);
  h->value = PackedTensor(l.d, l.dense);
  std::vector<float> k = normal(l.n * l.d, seed), v = normal(l.n * l.d, seed + 1);
  for (std::size_t t = 0; t < l.n; ++t) k[t * l.d + 3] += 6.0f;  // an outlier-like channel
  fill(h->key, k, l.quant_k, l.bits_k, l.axis_k, l.group, l.d, l.outliers);
  fill(h->value, v, l.quant_v, l.bits_v, l.axis_v, l.group, l.d, 0);
  h->key.set_rotation(l.rot_k);
  h->value.set_rotation(l.rot_v);
  return h;
}

inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Runs fn once per instruction set this build and CPU have, then restores the best.
template <typename Fn>
void for_each_isa(Fn&& fn) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
    if (isa > best_isa()) continue;
    set_isa(isa);
    INFO("isa " << isa_name(isa));
    fn(isa);
  }
  set_isa(best_isa());
}

// Runs fn() with AVX-512 and the other choice of core/isa.h's avx512_halves (which loops read
// two query heads' keys), then restores both settings; false (fn not run) without AVX-512.
template <class Fn>
bool with_other_avx512_halves(Fn&& fn) {
  if (best_isa() != Isa::avx512) return false;
  const bool halves = avx512_halves();
  set_avx512_halves(!halves);
  set_isa(Isa::avx512);
  fn();
  set_avx512_halves(halves);
  set_isa(best_isa());
  return true;
}

}  // namespace akv::test
