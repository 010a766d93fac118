// The integer attention path (attention/int8.h, AttentionMode::int8): its rounding by hand, its
// vector loops against the plain loops (bitwise: exact integer sums), and its error against exact
// decode attention.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "akv/attention/decode_attention.h"
#include "akv/attention/int8.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "attention_heads.h"

using namespace akv;
using namespace akv::test;
using attn::RowFormat;

namespace {

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::uint8_t> b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng.uniform() * 256.0);
  return b;
}

int code_of(RowFormat f, const std::uint8_t* row, std::size_t c) {
  const int b = f == RowFormat::code2 ? 2 : 4;
  return (row[c * b / 8] >> (c * b % 8)) & ((1 << b) - 1);
}

// Decode attention of n_kv heads of layout l (GQA nq) in mode m with options o.
std::vector<float> attend(const Layout& l, std::size_t n_kv, std::size_t nq, DecodeAttentionOptions o,
                          bool reference = false) {
  std::vector<std::unique_ptr<TestHead>> heads;
  std::vector<HeadView> views;
  for (std::size_t i = 0; i < n_kv; ++i) {
    heads.push_back(make_head(l, 300 + 11 * i));
    views.push_back(heads.back()->view());
  }
  const std::vector<float> q = normal(n_kv * nq * l.d, 19);
  std::vector<float> out(q.size());
  const DecodeAttentionArgs a{q.data(), n_kv * nq, l.d, views.data(), n_kv, 1.0f / std::sqrt(static_cast<float>(l.d)),
                              out.data(), nullptr};
  if (reference) {
    decode_attention_ref(a);
  } else {
    decode_attention(a, o);
  }
  return out;
}

}  // namespace

TEST_CASE("int8 key weights: block steps and codes by hand", "[attention][int8]") {
  // Block 0 holds the largest |w| (1.0): step 1/127, mult 256. Block 1's largest is 0.01:
  // mult = ceil(0.01 * 256) = 3, step 3 / (127 * 256).
  std::vector<float> w(64, 0.0f);
  w[0] = 1.0f;
  w[1] = 0.3f;    // 38.1 steps: 38
  w[2] = -0.25f;  // -31.75: -32
  w[32] = 0.01f;  // 0.01 * 127 * 256 / 3 = 108.37: 108
  w[33] = -0.004f;  // -43.35: -43
  attn::Int8Weights q;
  attn::quantize_weights_int8(w.data(), 1, 64, RowFormat::code4, q);
  CHECK(q.unit[0] == 1.0f / (127.0f * 256.0f));
  CHECK(q.mult == std::vector<std::int16_t>{256, 3});
  CHECK(q.w[0] == 127);
  CHECK(q.w[1] == 38);
  CHECK(q.w[2] == -32);
  CHECK(q.w[3] == 0);
  CHECK(q.w[32] == 108);
  CHECK(q.w[33] == -43);
  // Lane order of 4-bit blocks: even channels, then odd.
  CHECK(q.lanes[0] == 127);  // block 0 of head 0
  CHECK(q.lanes[1] == -32);
  CHECK(q.lanes[16] == 38);
  CHECK(q.lanes[32] == 108);  // block 1 of head 0
  SECTION("all zero: unit 0, codes 0") {
    std::vector<float> z(32, 0.0f);
    attn::quantize_weights_int8(z.data(), 1, 32, RowFormat::code2, q);
    CHECK(q.unit[0] == 0.0f);
    CHECK(q.w == std::vector<std::int8_t>(32, 0));
  }
  SECTION("every weight within half a step of its block") {
    const std::vector<float> x = normal(3 * 128, 4);
    attn::quantize_weights_int8(x.data(), 3, 128, RowFormat::code2, q);
    for (std::size_t h = 0; h < 3; ++h) {
      for (std::size_t c = 0; c < 128; ++c) {
        const double step = static_cast<double>(q.unit[h]) * q.mult[h * 4 + c / 32];
        CHECK(std::abs(x[h * 128 + c] - step * q.w[h * 128 + c]) <= 0.5 * step * (1 + 1e-6));
      }
    }
  }
}

TEST_CASE("int8 value coefficients: steps and row quads by hand, negative refused", "[attention][int8]") {
  const std::vector<float> coef = {0.5f, 1.0f, 0.25f, 0.0f, 0.75f};  // 5 rows, 1 head, 1 group
  std::vector<std::uint32_t> quads;
  std::vector<float> sigma;
  attn::quantize_coefficients_int8(coef.data(), 5, 1, 1, quads, sigma);
  CHECK(sigma[0] == 1.0f / 127.0f);
  // 63.5 -> 64, 127, 31.75 -> 32, 0; 95.25 -> 95 and three missing rows (0).
  CHECK(quads == std::vector<std::uint32_t>{64u | 127u << 8 | 32u << 16, 95u});
  CHECK(attn::coefficient_c8(quads.data(), 1, 1, 0) == 127);
  CHECK(attn::coefficient_c8(quads.data(), 1, 4, 0) == 95);
  for_each_isa([&](Isa) {  // each vector loop refuses what the plain loop refuses
    for (float bad : {-0.1f, std::nanf(""), INFINITY}) {
      for (std::size_t at : {std::size_t{0}, std::size_t{13 * 19 + 18}}) {  // a full vector's lane, a partial one's
        std::vector<float> c(16 * 19, 0.5f);  // 16 rows of 19 entries (19 heads, one group)
        c[at] = bad;
        CHECK_THROWS_AS(attn::quantize_coefficients_int8(c.data(), 16, 19, 1, quads, sigma), InvalidInput);
      }
    }
  });
  std::vector<float> many(17, 1.0f);
  CHECK_THROWS_AS(attn::quantize_coefficients_int8(many.data(), 17, 1, 1, quads, sigma), InvalidInput);
}

TEST_CASE("int8 loops: every instruction set gives the plain loops' bits, and the sums of the rounded operands",
          "[attention][int8]") {
  for (RowFormat f : {RowFormat::code2, RowFormat::code4}) {
    const std::size_t bits = f == RowFormat::code2 ? 2 : 4;
    for (std::size_t cols : {32, 64, 128, 96, 256, 512}) {
      for (std::size_t nq : {1, 2, 3, 4, 5, 8, 9}) {
        INFO("bits " << bits << " cols " << cols << " heads " << nq);
        const std::size_t n = 37, stride = cols * bits / 8;
        const std::vector<std::uint8_t> bytes = random_bytes(n * stride + kCodePadding, 7 + cols + nq);
        const std::vector<float> w = normal(nq * cols, 3 + nq), bias = normal(nq, 5);
        attn::Int8Weights q;
        attn::quantize_weights_int8(w.data(), nq, cols, f, q);
        const attn::Rows rows{f, bytes.data(), stride, n, cols / 8};
        // Values: 13 rows (an odd count, a partial last quad of rows), groups of 32, 64 or 128
        // channels by head count (the AVX-512 VNNI value loop maps 4, 2 or 1 groups onto a
        // 128-channel slice).
        const std::size_t group = cols % 128 == 0 && nq % 3 == 0 ? 128 : cols % 64 == 0 && nq % 2 == 0 ? 64 : 32;
        const std::size_t ng = cols / group, nv = 13;
        std::vector<float> coef = normal(nv * nq * ng, 11);
        for (auto& c : coef) c = std::abs(c);
        std::vector<std::uint32_t> quads;
        std::vector<float> sigma;
        attn::quantize_coefficients_int8(coef.data(), nv, nq, ng, quads, sigma);
        const attn::Rows vrows{f, bytes.data(), stride, nv, cols / 8};
        std::vector<std::vector<float>> s(3), acc(3);
        for_each_isa([&](Isa) {  // the roundings: the same codes with every instruction set
          attn::Int8Weights qi;
          attn::quantize_weights_int8(w.data(), nq, cols, f, qi);
          CHECK(qi.w == q.w);
          CHECK(qi.lanes == q.lanes);
          CHECK(qi.mult == q.mult);
          CHECK(qi.mult16 == q.mult16);
          CHECK(qi.quads == q.quads);
          CHECK(qi.unit == q.unit);
          std::vector<std::uint32_t> qi8;
          std::vector<float> si;
          attn::quantize_coefficients_int8(coef.data(), nv, nq, ng, qi8, si);
          CHECK(qi8 == quads);
          CHECK(si == sigma);
        });
        for_each_isa([&](Isa isa) {
          auto& si = s[static_cast<std::size_t>(isa)];
          auto& ai = acc[static_cast<std::size_t>(isa)];
          si.assign(nq * n, 0.0f);
          ai.assign(nq * cols, 0.25f);
          attn::score_rows_int8(rows, q, bias.data(), si.data(), n);
          attn::accumulate_rows_int8(vrows, nq, quads.data(), ng, group, sigma.data(), ai.data(), cols);
        });
        for (std::size_t i = 1; i < 3; ++i) {
          if (s[i].empty()) continue;
          CHECK(s[i] == s[0]);
          CHECK(acc[i] == acc[0]);
        }
        // Brute force in double from the rounded operands.
        double worst_s = 0, worst_a = 0;
        for (std::size_t h = 0; h < nq; ++h) {
          for (std::size_t r = 0; r < n; ++r) {
            double dot = bias[h];
            for (std::size_t c = 0; c < cols; ++c) {
              dot += static_cast<double>(q.unit[h]) * q.mult[h * (cols / 32) + c / 32] * q.w[h * cols + c] *
                     code_of(f, bytes.data() + r * stride, c);
            }
            worst_s = std::max(worst_s, std::abs(s[0][h * n + r] - dot) / std::max(1.0, std::abs(dot)));
          }
          for (std::size_t c = 0; c < cols; ++c) {
            double sum = 0.25;
            for (std::size_t r = 0; r < nv; ++r) {
              const auto c8 = static_cast<int>(attn::coefficient_c8(quads.data(), nq * ng, r, h * ng + c / group));
              sum += static_cast<double>(sigma[h * ng + c / group]) * c8 * code_of(f, bytes.data() + r * stride, c);
            }
            worst_a = std::max(worst_a, std::abs(acc[0][h * cols + c] - sum) / std::max(1.0, std::abs(sum)));
          }
        }
        CHECK(worst_s <= 1e-6);
        CHECK(worst_a <= 1e-6);
      }
    }
  }
}

// Random normal keys and values are the hard case for a relative error (the output, an average
// of many random rows, is small): there the integer path adds 1-2% to the exact output, a fifth
// of what 4-bit codes themselves cost against the unquantized cache (10%; 2 bits: 50-60%).
TEST_CASE("int8 decode attention: error a fraction of the cache's own, bitwise equal across vector ISAs and threads",
          "[attention][int8]") {
  DecodeAttentionOptions o;
  o.mode = AttentionMode::int8;
  for (int bits : {2, 4}) {
    for (std::size_t nq : {1, 4, 8}) {
      Layout l;
      l.bits_k = l.bits_v = bits;
      l.n = 1500;
      l.quant_k = 1344;
      l.quant_v = 1400;
      Layout plain = l;  // the same rows unquantized
      plain.quant_k = plain.quant_v = 0;
      plain.dense = DenseType::f32;
      INFO("bits " << bits << " gqa " << nq);
      const std::vector<float> exact = attend(l, 2, nq, {}), unquantized = attend(plain, 2, nq, {});
      std::vector<std::vector<float>> outs(3);  // per instruction set
      for_each_isa([&](Isa isa) {
        for (int threads : {1, 3}) {
          o.threads = threads;
          o.partition = 512;
          const std::vector<float> out = attend(l, 2, nq, o);
          auto& first = outs[static_cast<std::size_t>(isa)];
          if (first.empty()) first = out;
          CHECK(out == first);
        }
      });
      // The vector loops give the same bits; the plain loops' exact parts (softmax, dense rows)
      // sum in another order.
      if (!outs[2].empty()) CHECK(outs[2] == outs[1]);
      if (!outs[1].empty()) CHECK(rel_err(outs[1], outs[0]) <= 1e-5);
      const std::vector<float>& best = outs[static_cast<std::size_t>(best_isa())];
      const double e_int8 = rel_err(best, exact), e_cache = rel_err(exact, unquantized);
      INFO("int8 vs exact " << e_int8 << ", exact vs unquantized " << e_cache);
      CHECK(e_int8 > 0.0);  // the integer path did run
      CHECK(e_int8 <= 0.03);
      CHECK(e_int8 <= 0.25 * e_cache);
      CHECK(rel_err(best, unquantized) <= 1.05 * e_cache);
    }
  }
}

TEST_CASE("int8 mode leaves other layouts exact", "[attention][int8]") {
  DecodeAttentionOptions o;
  o.mode = AttentionMode::int8;
  for (int bits : {3, 8}) {  // codes the integer loops do not read
    Layout l;
    l.bits_k = l.bits_v = bits;
    CHECK(attend(l, 2, 4, o) == attend(l, 2, 4, {}));
  }
  Layout l;
  l.quant_k = l.quant_v = 0;  // dense only
  CHECK(attend(l, 2, 4, o) == attend(l, 2, 4, {}));
  l = Layout{};
  l.d = 48;  // 48 channels: not a multiple of 32
  l.group = 16;
  l.quant_k = 288;
  CHECK(attend(l, 2, 4, o) == attend(l, 2, 4, {}));
}

TEST_CASE("attention path names", "[attention][int8]") {
  CHECK(parse_attention_mode("exact") == AttentionMode::exact);
  CHECK(parse_attention_mode("int8") == AttentionMode::int8);
  CHECK(std::string(attention_mode_name(AttentionMode::int8)) == "int8");
  CHECK_THROWS_AS(parse_attention_mode("int4"), InvalidInput);
}
