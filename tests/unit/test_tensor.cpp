#include <catch2/catch.hpp>
#include <cstring>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "akv/core/rng.h"

#include "akv/core/errors.h"
#include "akv/tensor/dtype.h"
#include "akv/tensor/fp8.h"
#include "akv/tensor/ggml_blocks.h"
#include "akv/tensor/half.h"
#include "akv/tensor/linear.h"
#include "akv/tensor/q8_dot.h"
#include "akv/tensor/rope.h"
#include "akv/tensor/tensor.h"

using namespace akv;

namespace {
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

TEST_CASE("f16 reference conversion: hand-computed values", "[tensor][half]") {
  CHECK(f32_to_f16_ref(1.0f) == 0x3c00);
  CHECK(f32_to_f16_ref(-2.0f) == 0xc000);
  CHECK(f32_to_f16_ref(0.0f) == 0x0000);
  CHECK(f32_to_f16_ref(-0.0f) == 0x8000);
  CHECK(f32_to_f16_ref(65504.0f) == 0x7bff);                 // largest finite
  CHECK(f32_to_f16_ref(65519.99f) == 0x7bff);                // rounds down
  CHECK(f32_to_f16_ref(65520.0f) == 0x7c00);                 // tie rounds to even -> Inf
  CHECK(f32_to_f16_ref(std::ldexp(1.0f, -24)) == 0x0001);    // smallest subnormal
  CHECK(f32_to_f16_ref(std::ldexp(1.0f, -25)) == 0x0000);    // tie -> even (zero)
  CHECK(f32_to_f16_ref(std::ldexp(1.5f, -25)) == 0x0001);    // above the tie
  CHECK(f32_to_f16_ref(std::ldexp(3.0f, -25)) == 0x0002);    // 1.5 ulp tie -> even (2)
  CHECK(f32_to_f16_ref(std::ldexp(1.0f, -14)) == 0x0400);    // smallest normal
  CHECK(f32_to_f16_ref(0.1f) == 0x2e66);
  CHECK(f32_to_f16_ref(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie -> even
  CHECK(f32_to_f16_ref(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie -> even (up)
  CHECK(f32_to_f16_ref(INFINITY) == 0x7c00);
  CHECK((f32_to_f16_ref(NAN) & 0x7c00) == 0x7c00);
  CHECK((f32_to_f16_ref(NAN) & 0x03ff) != 0);
  CHECK(f16_to_f32_ref(0x3c00) == 1.0f);
  CHECK(f16_to_f32_ref(0x7bff) == 65504.0f);
  CHECK(f16_to_f32_ref(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32_ref(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(std::isinf(f16_to_f32_ref(0xfc00)));
  CHECK(std::isnan(f16_to_f32_ref(0x7e00)));
}

TEST_CASE("f16 fast path equals the reference on all 65536 halves", "[tensor][half]") {
  std::vector<std::uint16_t> h(65536);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i);
  std::vector<float> fast(h.size());
  f16_to_f32(h.data(), fast.data(), h.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (bits(fast[i]) != bits(f16_to_f32_ref(h[i]))) ++mismatches;
    // Every non-NaN half survives a round trip exactly.
    if (!std::isnan(fast[i]) && f32_to_f16_ref(fast[i]) != h[i]) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("f32 -> f16 fast path equals the reference bit for bit", "[tensor][half]") {
  // Random bit patterns cover every class: normals, subnormals, overflow, Inf, NaN payloads.
  std::uint64_t s = 12345;
  std::vector<float> x(1 << 20);
  for (auto& v : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = from_bits(static_cast<std::uint32_t>(s >> 32));
  }
  // Plus values near f16 rounding boundaries (ties at every exponent).
  for (int e = -26; e < 17; ++e) {
    for (std::uint32_t m : {0x1000u, 0x0fffu, 0x1001u, 0x3000u}) {
      x.push_back(from_bits(bits(std::ldexp(1.0f, e)) | m));
    }
  }
  std::vector<std::uint16_t> fast(x.size());
  f32_to_f16(x.data(), fast.data(), x.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (fast[i] != f32_to_f16_ref(x[i])) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 conversion rounds to nearest even", "[tensor][half]") {
  CHECK(f32_to_bf16_ref(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_ref(from_bits(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(f32_to_bf16_ref(from_bits(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(f32_to_bf16_ref(from_bits(0x3f808001u)) == 0x3f81);
  CHECK(std::isnan(bf16_to_f32_ref(f32_to_bf16_ref(NAN))));
  CHECK(bf16_to_f32_ref(0x4049) == from_bits(0x40490000u));
  std::vector<float> x = {1.5f, -3.25f, 1e-20f, 3e38f};
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> y(x.size());
  f32_to_bf16(x.data(), h.data(), x.size());
  bf16_to_f32(h.data(), y.data(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) / 128);
}

TEST_CASE("round_through_f16 matches one conversion each way", "[tensor][half]") {
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 300.0f;
  std::vector<float> y = x;
  round_through_f16(y.data(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == f16_to_f32_ref(f32_to_f16_ref(x[i])));
}

TEST_CASE("dtype names round trip", "[tensor][dtype]") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) CHECK(parse_dtype(dtype_name(t)) == t);
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK_THROWS_AS(parse_dtype("int8"), InvalidInput);
}

TEST_CASE("Tensor3 indexing and Eigen slices", "[tensor]") {
  Tensor3 t(2, 3, 4);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);
  CHECK(t.at(1, 2, 3) == 23.0f);
  CHECK(t.row(1, 0)[0] == 12.0f);
  auto s = t.slice(1);
  CHECK(s.rows() == 3);
  CHECK(s.cols() == 4);
  CHECK(s(2, 1) == 21.0f);
}

TEST_CASE("RoPE matches a hand computation", "[tensor][rope]") {
  // head_dim 4, theta 100: pair 0 turns by pos rad, pair 1 by pos * 100^(-1/2) = 0.1 * pos rad.
  RopeTable table(4, 100.0, 0, 8);
  const double p = 3.0;
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::rotate_half}) {
    float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float y[4];
    std::copy(x, x + 4, y);
    apply_rope(y, 1, 3, layout, table);
    for (std::size_t i = 0; i < 2; ++i) {
      std::size_t a, b;
      rope_pair_dims(layout, 4, i, a, b);
      const double ang = p * (i == 0 ? 1.0 : 0.1);
      CHECK(y[a] == Approx(x[a] * std::cos(ang) - x[b] * std::sin(ang)).margin(1e-6));
      CHECK(y[b] == Approx(x[a] * std::sin(ang) + x[b] * std::cos(ang)).margin(1e-6));
    }
  }
}

TEST_CASE("longrope: short factors up to the original context, long past it, by hand", "[tensor][rope]") {
  // theta 10000, rotary_dim 4: theta^(0/4) = 1 and theta^(2/4) = 100 exactly, so
  // inv_freq = 1 / (ext * {1, 100}).
  RopeScaling s;
  s.kind = RopeScaling::Kind::longrope;
  s.original_max_positions = 16;
  s.short_factors = {1.0f, 2.0f};
  s.long_factors = {4.0f, 8.0f};
  CHECK(rope_inv_freq(4, 10000.0, s, 16) == std::vector<float>{1.0f, 1.0f / 200.0f});
  CHECK(rope_inv_freq(4, 10000.0, s, 17) == std::vector<float>{0.25f, 1.0f / 800.0f});
  s.long_factors = {4.0f};
  CHECK_THROWS_AS(rope_inv_freq(4, 10000.0, s, 17), InvalidInput);
  CHECK_NOTHROW(rope_inv_freq(4, 10000.0, s, 16));  // the short factors are whole
  s.short_factors = {1.0f, 0.0f};
  CHECK_THROWS_AS(rope_inv_freq(4, 10000.0, s, 16), InvalidInput);
  CHECK(rope_scaling_name(s.kind) == "longrope");
}

TEST_CASE("RoPE inverse undoes it and dot products depend on relative position",
          "[tensor][rope]") {
  const std::size_t d = 64;
  RopeTable table(d, 10000.0, 0, 600);
  std::vector<float> q(d), k(d);
  for (std::size_t i = 0; i < d; ++i) {
    q[i] = std::cos(0.7f * static_cast<float>(i));
    k[i] = std::sin(1.3f * static_cast<float>(i) + 0.2f);
  }
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::rotate_half}) {
    auto dot_at = [&](std::size_t pq, std::size_t pk) {
      std::vector<float> a = q, b = k;
      apply_rope(a.data(), 1, pq, layout, table);
      apply_rope(b.data(), 1, pk, layout, table);
      double s = 0;
      for (std::size_t i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
      return s;
    };
    CHECK(dot_at(500, 480) == Approx(dot_at(30, 10)).margin(1e-3));
    std::vector<float> a = q;
    apply_rope(a.data(), 1, 123, layout, table);
    apply_rope(a.data(), 1, 123, layout, table, true);
    for (std::size_t i = 0; i < d; ++i) CHECK(a[i] == Approx(q[i]).margin(1e-5));
  }
}

TEST_CASE("RoPE layouts are the same rotation up to a permutation", "[tensor][rope]") {
  const std::size_t d = 8;
  RopeTable table(d, 10000.0, 0, 64);
  float x[d] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, 3.0f, -2.0f};
  // Interleaved pair i = (2i, 2i+1); rotate-half pair i = (i, i + d/2).
  float inter[d], half[d];
  for (std::size_t i = 0; i < d / 2; ++i) {
    inter[2 * i] = x[i];
    inter[2 * i + 1] = x[i + d / 2];
    half[i] = x[i];
    half[i + d / 2] = x[i + d / 2];
  }
  apply_rope(inter, 1, 41, RopeLayout::interleaved, table);
  apply_rope(half, 1, 41, RopeLayout::rotate_half, table);
  for (std::size_t i = 0; i < d / 2; ++i) {
    CHECK(inter[2 * i] == half[i]);
    CHECK(inter[2 * i + 1] == half[i + d / 2]);
  }
  CHECK(parse_rope_layout("interleaved") == RopeLayout::interleaved);
  CHECK(parse_rope_layout("rotate-half") == RopeLayout::rotate_half);
  CHECK_THROWS_AS(parse_rope_layout("neox"), InvalidInput);
  CHECK_THROWS_AS(RopeTable(7, 10000.0, 0, 1), InvalidInput);
}

TEST_CASE("directed f16 rounding brackets the value", "[tensor][half]") {
  CHECK(f16_round_down(1.0f) == 1.0f);
  CHECK(f16_round_up(1.0f) == 1.0f);
  CHECK(f16_round_down(0.1f) == f16_to_f32_ref(0x2e66));  // 0.0999755859375 <= 0.1
  CHECK(f16_round_up(0.1f) == f16_to_f32_ref(0x2e67));
  CHECK(f16_round_down(-0.1f) == f16_to_f32_ref(0xae67));
  CHECK(f16_round_up(-0.1f) == f16_to_f32_ref(0xae66));
  CHECK(f16_round_up(1e-9f) == f16_to_f32_ref(0x0001));
  CHECK(f16_round_down(1e-9f) == 0.0f);
  CHECK(f16_round_down(-1e-9f) == f16_to_f32_ref(0x8001));
  CHECK(std::isinf(f16_round_up(70000.0f)));
  CHECK(f16_round_down(70000.0f) == 65504.0f);
  std::uint64_t s = 99;
  for (int i = 0; i < 100000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(static_cast<std::int64_t>(s >> 20) % 2000000) / 997.0f;
    const float lo = f16_round_down(x), hi = f16_round_up(x);
    REQUIRE(lo <= x);
    REQUIRE(hi >= x);
    // adjacent f16 values (or equal)
    REQUIRE((lo == hi || f32_to_f16_ref(hi) - f32_to_f16_ref(lo) == 1 ||
             f32_to_f16_ref(lo) - f32_to_f16_ref(hi) == 1));
  }
}

TEST_CASE("linear_rows: hand cases and the f64 dot product", "[tensor][linear]") {
  // W = [[1..10], [10..1]], x = [1 x 10, 0.5 x 10]: sums 55 and 27.5, exact in f32.
  std::vector<float> w(20), x(20, 1.0f), y(4), ref(4);
  for (int k = 0; k < 10; ++k) {
    w[static_cast<std::size_t>(k)] = static_cast<float>(k + 1);
    w[static_cast<std::size_t>(10 + k)] = static_cast<float>(10 - k);
    x[static_cast<std::size_t>(10 + k)] = 0.5f;
  }
  linear_rows(w.data(), 2, 10, 10, x.data(), 2, 10, y.data(), 2);
  CHECK(y == std::vector<float>{55.0f, 55.0f, 27.5f, 27.5f});
  // Random cases: within 2 * cols * 2^-24 * sum |w x| of the f64 dot (the float rounding bound).
  Rng rng(5);
  const std::size_t cols = 203;
  std::vector<float> a(cols), b(cols);
  for (auto& v : a) v = static_cast<float>(rng.normal());
  for (auto& v : b) v = static_cast<float>(rng.normal());
  double exact = 0, mag = 0;
  for (std::size_t k = 0; k < cols; ++k) {
    exact += static_cast<double>(a[k]) * b[k];
    mag += std::abs(static_cast<double>(a[k]) * b[k]);
  }
  float got = 0;
  linear_rows(a.data(), 1, cols, cols, b.data(), 1, cols, &got, 1);
  CHECK(std::abs(got - exact) <= 2.0 * cols * std::ldexp(1.0, -24) * mag);
}

TEST_CASE("linear_rows: fast path equals the reference bit for bit; outputs do not depend on the batch",
          "[tensor][linear]") {
  Rng rng(9);
  for (std::size_t rows : {1, 3, 4, 5, 9}) {
    for (std::size_t cols : {1, 7, 8, 9, 64, 130}) {
      for (std::size_t batch : {1, 2, 3, 4, 5, 6, 7, 13, 24, 25}) {  // AVX-512: groups of 12 vectors
        const std::size_t ldw = cols + 3, ldx = cols + 1, ldy = rows + 2;
        std::vector<float> w(rows * ldw), x(batch * ldx), y(batch * ldy, -1.0f), ref(batch * ldy, -1.0f);
        for (auto& v : w) v = static_cast<float>(rng.normal());
        for (auto& v : x) v = static_cast<float>(rng.normal());
        linear_rows(w.data(), rows, cols, ldw, x.data(), batch, ldx, y.data(), ldy);
        linear_rows_ref(w.data(), rows, cols, ldw, x.data(), batch, ldx, ref.data(), ldy);
        CHECK(y == ref);  // padding columns untouched in both
        for (const Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
          if (isa > best_isa()) continue;
          INFO(isa_name(isa));
          std::vector<float> v(batch * ldy, -1.0f);
          linear_rows_isa(isa, w.data(), rows, cols, ldw, x.data(), batch, ldx, v.data(), ldy);
          CHECK(v == ref);
          // X prepared once, W's rows in two blocks (as the threads of a product take them).
          const LinearInput in(isa, x.data(), batch, cols, ldx);
          std::vector<float> blocks(batch * ldy, -1.0f);
          const std::size_t r1 = rows / 2;
          linear_rows(w.data(), r1, ldw, in, blocks.data(), ldy);
          linear_rows(w.data() + r1 * ldw, rows - r1, ldw, in, blocks.data() + r1, ldy);
          CHECK(blocks == ref);
        }
        for (std::size_t bi = 0; bi < batch; ++bi) {
          std::vector<float> one(rows);
          linear_rows(w.data(), rows, cols, ldw, x.data() + bi * ldx, 1, ldx, one.data(), rows);
          CHECK(std::equal(one.begin(), one.end(), y.begin() + static_cast<std::ptrdiff_t>(bi * ldy)));
        }
      }
    }
  }
}

TEST_CASE("linear_rows_16: F16 and BF16 rows read in place give the bits of their f32 values", "[tensor][linear]") {
  Rng rng(19);
  for (const bool bf16 : {false, true}) {
    for (std::size_t rows : {1, 5, 9}) {
      for (std::size_t cols : {7, 64, 130}) {
        for (std::size_t batch : {1, 2, 3, 4}) {
          INFO((bf16 ? "BF16" : "F16") << " rows " << rows << " cols " << cols << " batch " << batch);
          const std::size_t ldw = cols + 3, ldx = cols + 1, ldy = rows + 2;
          // 16-bit rows at an odd byte offset, as safetensors files may place them.
          std::vector<std::uint8_t> raw(1 + 2 * rows * ldw);
          std::vector<float> w(rows * ldw), x(batch * ldx);
          for (std::size_t i = 0; i < rows * ldw; ++i) {
            const float v = static_cast<float>(rng.normal());
            const std::uint16_t h = bf16 ? f32_to_bf16_ref(v) : f32_to_f16_ref(v);
            w[i] = bf16 ? bf16_to_f32_ref(h) : f16_to_f32_ref(h);
            raw[1 + 2 * i] = static_cast<std::uint8_t>(h & 0xFF);
            raw[2 + 2 * i] = static_cast<std::uint8_t>(h >> 8);
          }
          for (auto& v : x) v = static_cast<float>(rng.normal());
          std::vector<float> ref(batch * ldy, -1.0f);
          linear_rows_ref(w.data(), rows, cols, ldw, x.data(), batch, ldx, ref.data(), ldy);
          for (const Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
            if (isa > best_isa()) continue;
            INFO(isa_name(isa));
            set_isa(isa);
            std::vector<float> y(batch * ldy, -1.0f);
            linear_rows_16(raw.data() + 1, bf16, rows, cols, ldw, x.data(), batch, ldx, y.data(), ldy);
            CHECK(y == ref);
          }
          set_isa(best_isa());
        }
      }
    }
  }
}

namespace {

// Random blocks of a ggml type: random bytes, the f16 scale fields set to finite values.
std::vector<std::uint8_t> random_blocks(const GgmlTypeInfo& t, std::size_t n_values, Rng& rng) {
  std::vector<std::uint8_t> raw(n_values / t.block * t.bytes);
  for (auto& b : raw) b = static_cast<std::uint8_t>(rng.below(256));
  std::vector<std::size_t> f16_fields = {0};
  if (t.id == 3 || t.id == 7 || t.id == 12 || t.id == 13) f16_fields = {0, 2};
  if (t.id == 14) f16_fields = {208};
  for (std::size_t b = 0; b < raw.size(); b += t.bytes) {
    for (const std::size_t f : f16_fields) {
      const std::uint16_t h = f32_to_f16_ref(static_cast<float>(rng.uniform(-0.02, 0.02)));
      raw[b + f] = static_cast<std::uint8_t>(h & 0xFF);
      raw[b + f + 1] = static_cast<std::uint8_t>(h >> 8);
    }
  }
  return raw;
}

const char* const kBlockTypes[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K"};

}  // namespace

TEST_CASE("q8_decode: a * code - c is ggml_dequantize's value bit for bit", "[tensor][q8]") {
  Rng rng(21);
  for (const char* name : kBlockTypes) {
    INFO(name);
    const GgmlTypeInfo& t = *ggml_type_info_by_name(name);
    REQUIRE(q8_decodes(t));
    const std::size_t rows = 3, cols = 512;
    const std::vector<std::uint8_t> raw = random_blocks(t, rows * cols, rng);
    std::vector<float> want(rows * cols);
    ggml_dequantize(t, raw.data(), rows * cols, want.data());
    Q8Tile tile, plain;
    q8_decode(t, raw.data(), rows, cols, tile);
    q8_decode_isa(Isa::generic, t, raw.data(), rows, cols, plain);
    CHECK(plain.q == tile.q);
    CHECK(plain.a_lo == tile.a_lo);
    CHECK(plain.a_hi == tile.a_hi);
    CHECK(plain.c == tile.c);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < rows * cols; ++i) {
      const std::size_t blk = i / 32;
      const float a = i % 32 < 16 ? tile.a_lo[blk] : tile.a_hi[blk];
      bad += bits(a * static_cast<float>(tile.q[i]) - tile.c[blk]) != bits(want[i]);
    }
    CHECK(bad == 0);
  }
  CHECK_FALSE(q8_decodes(*ggml_type_info_by_name("F16")));
  CHECK_FALSE(q8_decodes(*ggml_type_info_by_name("BF16")));
}

TEST_CASE("q8_quantize: hand case and the half-step bound", "[tensor][q8]") {
  // max |x| = 254: step 2, codes x / 2 rounded to even.
  std::vector<float> x(32, 0.0f);
  x[0] = 254.0f, x[1] = -3.0f, x[2] = 5.0f, x[3] = 1.0f, x[4] = -100.4f;
  Q8Vectors q;
  q8_quantize(x.data(), 1, 32, 32, q);
  CHECK(q.d[0] == 2.0f);
  CHECK(q.q[0] == 127);
  CHECK(q.q[1] == -2);  // -1.5 -> -2 (ties to even)
  CHECK(q.q[2] == 2);   // 2.5 -> 2
  CHECK(q.q[3] == 0);   // 0.5 -> 0
  CHECK(q.q[4] == -50);
  CHECK(q.sum[0] == 127.0f - 2 + 2 + 0 - 50);
  // An all-zero block: step 0, codes 0.
  std::vector<float> z(64, 0.0f);
  z[40] = 1e-3f;
  q8_quantize(z.data(), 1, 64, 64, q);
  CHECK(q.d[0] == 0.0f);
  CHECK(q.q[40] == 127);
  Rng rng(4);
  std::vector<float> r(5 * 96);
  for (auto& v : r) v = static_cast<float>(rng.normal() * 3.0);
  q8_quantize(r.data(), 5, 96, 96, q);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const float d = q.d[i / 32];
    CHECK(std::abs(r[i] - d * static_cast<float>(q.q[i])) <= d * 0.5f * (1.0f + 1e-6f));
  }
}

TEST_CASE("q8_rows: every kernel gives the reference's bits; the reference is within the activation bound",
          "[tensor][q8]") {
  Rng rng(33);
  for (const char* name : kBlockTypes) {
    const GgmlTypeInfo& t = *ggml_type_info_by_name(name);
    // 32-value types: 10 and 75 blocks (remainders after groups of 8); K types: 2 and 9 super-blocks.
    for (const std::size_t cols : t.block == 32 ? std::vector<std::size_t>{320, 2400} : std::vector<std::size_t>{512, 2304}) {
      INFO(name << " cols " << cols);
      const std::size_t rows = 5, batch = 6, ldy = rows + 2;
      const std::vector<std::uint8_t> raw = random_blocks(t, rows * cols, rng);
      std::vector<float> x(batch * cols), w(rows * cols);
      for (auto& v : x) v = static_cast<float>(rng.normal());
      ggml_dequantize(t, raw.data(), rows * cols, w.data());
      Q8Tile tile;
      q8_decode(t, raw.data(), rows, cols, tile);
      Q8Vectors xq, xg;
      q8_quantize(x.data(), batch, cols, cols, xq);
      q8_quantize_isa(Isa::generic, x.data(), batch, cols, cols, xg, 2);
      CHECK(xg.q == xq.q);
      CHECK(xg.d == xq.d);
      CHECK(xg.sum == xq.sum);
      std::vector<float> ref(batch * ldy, -1.0f);
      q8_rows_ref(tile, xq, ref.data(), ldy);
      for (const Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
        if (isa > best_isa()) continue;
        INFO(isa_name(isa));
        std::vector<float> y(batch * ldy, -1.0f);
        q8_rows_isa(isa, tile, xq, y.data(), ldy);
        CHECK(y == ref);  // padding untouched in both
      }
      // Straight from the blocks where a kernel reads the type: the same bits.
      std::vector<float> direct(batch * ldy, -1.0f);
      if (q8_rows_blocks(t, raw.data(), rows, xq, direct.data(), ldy)) CHECK(direct == ref);
      // A vector alone gives the bits it gets inside the batch; the rows in two tiles too.
      Q8Vectors one;
      q8_quantize(x.data() + cols, 1, cols, cols, one);
      Q8Tile top, rest;
      q8_decode(t, raw.data(), 2, cols, top);
      q8_decode(t, raw.data() + 2 * cols / t.block * t.bytes, rows - 2, cols, rest);
      std::vector<float> alone(rows);
      q8_rows(top, one, alone.data(), rows);
      q8_rows(rest, one, alone.data() + 2, rows);
      CHECK(std::equal(alone.begin(), alone.end(), ref.begin() + static_cast<std::ptrdiff_t>(ldy)));
      // Against the f64 product of the f32 weights with the unrounded activations: within the
      // activations' half steps (times sum |w|) plus f32 rounding of the block sums.
      for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t o = 0; o < rows; ++o) {
          double exact = 0, mag = 0, bound = 0;
          for (std::size_t k = 0; k < cols; ++k) {
            const double wk = w[o * cols + k];
            exact += wk * x[b * cols + k];
            mag += std::abs(wk * x[b * cols + k]);
            bound += std::abs(wk) * xq.d[b * (cols / 32) + k / 32] * 0.5;
          }
          CHECK(std::abs(ref[b * ldy + o] - exact) <= bound * (1 + 1e-5) + 1e-5 * mag);
        }
      }
    }
  }
}

namespace {

// The fp8 code nearest to x by brute force over every finite code's decoded value (ties: the
// code with an even mantissa; zero keeps x's sign), |x| beyond the largest finite value
// saturating to it: the reference fp8_encode must equal.
std::uint8_t fp8_nearest(float x, Fp8Format f) {
  if (std::isnan(x)) return static_cast<std::uint8_t>((std::signbit(x) ? 0x80 : 0) | (f == Fp8Format::e4m3 ? 0x7F : 0x7E));
  const double a = std::min<double>(std::fabs(x), fp8_max(f));
  int best = 0;
  double dist = INFINITY;
  for (int c = 0; c < 128; ++c) {
    const double v = fp8_decode(static_cast<std::uint8_t>(c), f);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(a - v);
    if (d < dist || (d == dist && (c & 1) == 0)) {
      best = c;
      dist = d;
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

}  // namespace

TEST_CASE("fp8: the OCP values of both formats", "[tensor][fp8]") {
  // OCP 8-bit floating point specification (2023), tables of e4m3 and e5m2.
  const Fp8Format e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  CHECK(fp8_decode(0x38, e4) == 1.0f);
  CHECK(fp8_decode(0x7E, e4) == 448.0f);
  CHECK(fp8_decode(0xFE, e4) == -448.0f);
  CHECK(fp8_decode(0x08, e4) == std::ldexp(1.0f, -6));   // smallest normal
  CHECK(fp8_decode(0x07, e4) == 0.875f * std::ldexp(1.0f, -6));  // largest subnormal
  CHECK(fp8_decode(0x01, e4) == std::ldexp(1.0f, -9));   // smallest subnormal
  CHECK(std::isnan(fp8_decode(0x7F, e4)));
  CHECK(fp8_decode(0x78, e4) == 256.0f);  // S.1111.000 is a number in e4m3
  CHECK(fp8_decode(0x3C, e5) == 1.0f);
  CHECK(fp8_decode(0x7B, e5) == 57344.0f);
  CHECK(fp8_decode(0x04, e5) == std::ldexp(1.0f, -14));
  CHECK(fp8_decode(0x01, e5) == std::ldexp(1.0f, -16));
  CHECK(std::isinf(fp8_decode(0x7C, e5)));
  CHECK(std::isnan(fp8_decode(0x7D, e5)));
  CHECK(fp8_max(e4) == 448.0f);
  CHECK(fp8_max(e5) == 57344.0f);
  // By hand: 1.0625 lies halfway between 1 (mantissa 000) and 1.125 (001): to even, 1.
  CHECK(fp8_encode(1.0625f, e4) == 0x38);
  CHECK(fp8_encode(1.1875f, e4) == 0x3A);  // between 1.125 (001) and 1.25 (010): to 010
  CHECK(fp8_encode(500.0f, e4) == 0x7E);   // saturates
  CHECK(fp8_encode(-INFINITY, e5) == 0xFB);
  CHECK(fp8_encode(-0.0f, e4) == 0x80);
  CHECK(fp8_encode(std::ldexp(1.0f, -11), e4) == 0x00);  // a quarter of the smallest subnormal
}

TEST_CASE("fp8: encoding equals the brute-force nearest code", "[tensor][fp8]") {
  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    INFO(fp8_format_name(f));
    std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 1e-30f, -1e-30f};
    // Every finite value, the midpoints between neighbours (ties) and one f32 ulp either side.
    for (int c = 0; c < 127; ++c) {
      const float v = fp8_decode(static_cast<std::uint8_t>(c), f), w = fp8_decode(static_cast<std::uint8_t>(c + 1), f);
      if (!std::isfinite(v) || !std::isfinite(w)) continue;
      const float mid = 0.5f * (v + w);
      for (const float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    Rng rng(11);
    for (int i = 0; i < 20000; ++i) {
      xs.push_back(static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.below(40)) - 20)));
    }
    std::size_t bad = 0;
    std::vector<std::uint8_t> rows(xs.size());  // the array form's bit arithmetic, scale 1
    fp8_encode_rows(xs.data(), xs.size(), 1.0f, f, rows.data());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      const std::uint8_t got = fp8_encode(x, f), want = fp8_nearest(x, f);
      if ((got != want || rows[i] != want) && bad++ < 5) {
        FAIL_CHECK("x = " << x << " got " << int(got) << " rows " << int(rows[i]) << " want " << int(want));
      }
    }
    CHECK(bad == 0);
    // Random f32 bit patterns (every exponent, f32 subnormals, NaN payloads): the array form
    // gives the reference's codes.
    std::vector<float> any(200000);
    for (float& x : any) {
      const auto u = static_cast<std::uint32_t>(rng.next());
      std::memcpy(&x, &u, 4);
    }
    std::vector<std::uint8_t> any_codes(any.size());
    fp8_encode_rows(any.data(), any.size(), 1.0f, f, any_codes.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < any.size(); ++i) differ += any_codes[i] != fp8_encode(any[i], f);
    CHECK(differ == 0);
    // Array forms: division by the scale, then the code; decode times the scale.
    std::vector<float> row = {1.0f, -3.5f, 100.0f, 0.01f};
    std::vector<std::uint8_t> codes(row.size());
    std::vector<float> back(row.size());
    fp8_encode_rows(row.data(), row.size(), 0.5f, f, codes.data());
    fp8_decode_rows(codes.data(), codes.size(), 0.5f, f, back.data());
    for (std::size_t i = 0; i < row.size(); ++i) {
      CHECK(codes[i] == fp8_encode(row[i] / 0.5f, f));
      CHECK(back[i] == fp8_decode(codes[i], f) * 0.5f);
    }
  }
}
