#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "akv/attention/block_attention.h"
#include "akv/attention/decode_attention.h"
#include "akv/attention/kernels.h"
#include "akv/attention/kv_view.h"
#include "akv/attention/sign_tables.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/quant/pack.h"
#include "akv/tensor/fp8.h"
#include "akv/tensor/ggml_quant.h"
#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"
#include "attention_heads.h"

using namespace akv;
using namespace akv::test;

namespace {

// Runs fast and reference attention for n_kv heads of layout l, GQA ratio nq; checks the
// outputs (and probabilities) agree within 1e-5 relative error per query head.
void check_against_ref(const Layout& l, std::size_t n_kv, std::size_t nq, DecodeAttentionOptions o = {},
                       float softcap = 0.0f) {
  std::vector<std::unique_ptr<TestHead>> heads;
  std::vector<HeadView> views;
  for (std::size_t i = 0; i < n_kv; ++i) {
    heads.push_back(make_head(l, 100 + 7 * i));
    views.push_back(heads.back()->view());
  }
  const std::size_t n_heads = n_kv * nq;
  const std::vector<float> q = normal(n_heads * l.d, 9);
  std::vector<float> out(n_heads * l.d), ref(out.size());
  std::vector<std::vector<float>> pf(n_heads, std::vector<float>(l.n)), pr = pf;
  std::vector<float*> pfp, prp;
  for (std::size_t h = 0; h < n_heads; ++h) {
    pfp.push_back(pf[h].data());
    prp.push_back(pr[h].data());
  }
  DecodeAttentionArgs a{q.data(), n_heads, l.d, views.data(), n_kv, 1.0f / std::sqrt(static_cast<float>(l.d)),
                        out.data(), pfp.data()};
  a.softcap = softcap;
  decode_attention(a, o);
  a.out = ref.data();
  a.probs = prp.data();
  decode_attention_ref(a);
  for (std::size_t h = 0; h < n_heads; ++h) {
    const std::vector<float> x(out.begin() + static_cast<std::ptrdiff_t>(h * l.d), out.begin() + static_cast<std::ptrdiff_t>((h + 1) * l.d));
    const std::vector<float> y(ref.begin() + static_cast<std::ptrdiff_t>(h * l.d), ref.begin() + static_cast<std::ptrdiff_t>((h + 1) * l.d));
    INFO("head " << h << " bits " << l.bits_k << "/" << l.bits_v << " n " << l.n << " quant " << l.quant_k << "/" << l.quant_v << " d " << l.d);
    CHECK(rel_err(x, y) <= 1e-5);
    if (l.n > 0) CHECK(rel_err(pf[h], pr[h]) <= 1e-5);
  }
}

// Decode attention over coded views (codes read by the vector loops) and over dense f32 views of
// the same rows as the codes decode, for GQA 1, 4, 3, 8 and 2 with every instruction set: outputs
// within tol of each other and, when `differ`, not equal (the coded loops ran, not a decoded tile);
// AVX2 == AVX-512 bitwise. Returns the best instruction set's outputs per GQA (1, 4, 3, 8, 2).
std::vector<std::vector<float>> check_coded_vs_dense(const std::vector<HeadView>& coded, const std::vector<HeadView>& dense,
                                                     std::size_t d, std::uint64_t seed, double tol, bool differ,
                                                     const std::string& what) {
  const std::size_t n_kv = coded.size();
  std::vector<std::vector<float>> best;
  for (std::size_t nq : {1, 4, 3, 8, 2}) {  // best: [0] GQA 1, [1] GQA 4
    const std::vector<float> q = normal(n_kv * nq * d, seed);
    std::vector<std::vector<float>> a(3);
    std::vector<float> b(q.size());
    for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
      if (isa > best_isa()) continue;
      set_isa(isa);
      auto& ai = a[static_cast<std::size_t>(isa)];
      ai.resize(q.size());
      decode_attention({q.data(), n_kv * nq, d, coded.data(), n_kv, 0.125f, ai.data(), nullptr}, {2, 64, 128});
      decode_attention({q.data(), n_kv * nq, d, dense.data(), n_kv, 0.125f, b.data(), nullptr}, {2, 64, 128});
      INFO(what << " gqa " << nq << " isa " << isa_name(isa));
      CHECK(rel_err(ai, b) <= tol);
      if (differ) CHECK(rel_err(ai, b) > 0);
    }
    set_isa(best_isa());
    if (!a[2].empty()) CHECK(a[2] == a[1]);
    with_other_avx512_halves([&] {  // two heads' keys (of GQA 3) in the other loops: the same bits
      std::vector<float> other(q.size());
      decode_attention({q.data(), n_kv * nq, d, coded.data(), n_kv, 0.125f, other.data(), nullptr}, {2, 64, 128});
      CHECK(other == a[1]);
    });
    best.push_back(a[static_cast<std::size_t>(best_isa())]);
  }
  return best;
}

}  // namespace

TEST_CASE("dequantize_rows equals dequantize_block_ref on a packed tensor", "[attention]") {
  for (int bits : {2, 3, 4, 8}) {
    for (QuantAxis axis : {QuantAxis::channel, QuantAxis::token}) {
      const std::size_t d = 36, n = 70;  // 36 * 3 bits: rows do not start on bytes
      const std::vector<float> x = normal(n * d, 3);
      PackedTensor t(d, DenseType::f16);
      const QuantizedBlock b1 = quantize_block_ref(x.data(), 32, d, axis, bits, 16, QuantRule::kivi);
      const QuantizedBlock b2 = quantize_block_ref(x.data() + 32 * d, 33, d, axis, bits, 16, QuantRule::bounded);
      t.append_packed(b1, {}, nullptr);
      t.append_packed(b2, {}, nullptr);
      t.append_dense(x.data() + 65 * d, 5);
      std::vector<float> got(n * d), want(n * d);
      dequantize_rows(t.view(), d, 0, n, got.data());
      dequantize_block_ref(b1, want.data());
      dequantize_block_ref(b2, want.data() + 32 * d);
      for (std::size_t i = 65 * d; i < n * d; ++i) want[i] = f16_to_f32_ref(f32_to_f16_ref(x[i]));
      INFO("bits " << bits << " axis " << quant_axis_name(axis));
      CHECK(got == want);
      CHECK(t.bytes() == packed_size(65 * d, bits) + b1.bytes() - b1.codes.size() + b2.bytes() - b2.codes.size() + 2 * 5 * d);
    }
  }
}

TEST_CASE("vector score/accumulate loops: AVX2 == AVX-512 bitwise, both within 1e-6 of the scalar loops", "[attention]") {
  using attn::RowFormat;
  // (heads, chunks per row, chunks per value group): 1 and 3 heads take the one-head loops (2-
  // and 4-bit: 16 values at a time with AVX-512 when chunks are even; dense rows of one head:
  // blocks of 1, 2 or 4 rows by row size, values 16 chunks a pass with AVX-512); 15 chunks and 1
  // chunk per group fall back to 8 at a time; several heads over dense rows with one coefficient
  // group (4, 16, 16 and 3, 8, 8; 8, 6, 6) take AVX-512's 16-channel value loops; 4-bit rows with
  // AVX2 read AVX-512's lane order in half-chunks (1, 12, 6: a tail of 2 + 2 half-chunks after a
  // block of 8, and blocks across group boundaries); keys of 2 and 4 heads take AVX-512's two
  // rows per register (2 heads: not with core/isa.h's avx512_halves, nor one head's 16-wide code
  // values; both settings run; 4 heads:
  // blocks of 8 rows, then a pair, then one row; 2 heads over 15 chunks too); 37 rows leave a
  // partial block of rows. Level formats (nuq's codes read as levels[code]) take the 8-at-a-time
  // loops with a lookup per value (AVX-512's values 16 at a time where chunks and chunks per
  // group are even, 3 bits from two words), except 4-bit levels with AVX2 and a multiple of 4 chunks up to
  // 32: keys of any heads (8, 8, 2 too) and values of one or two heads a quad of chunks at a time
  // (load_quad_levels; 12 and 6: a group boundary inside a quad), and keys of one head over
  // 4-bit levels, which AVX-512 reads 16 at a time as 4-bit codes (AVX2 in their order: even and
  // odd chunks apart, quads too; 40 chunks without); fp8 bytes (every finite code) are read
  // through f16; ggml's 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: finite scales and
  // mins; shapes of whole blocks) through their codes times the block's scale (plus its min),
  // converted once per block.
  struct Shape {
    std::size_t nq, chunks, cpg;
  };
  for (const Shape sh : {Shape{4, 16, 4}, Shape{1, 16, 4}, Shape{3, 16, 2}, Shape{1, 15, 1}, Shape{2, 8, 1},
                         Shape{1, 8, 2}, Shape{1, 40, 4}, Shape{1, 12, 6}, Shape{4, 16, 16}, Shape{3, 8, 8}, Shape{8, 6, 6},
                         Shape{8, 8, 2}, Shape{2, 15, 5}}) {
    const std::size_t n = 37, chunks = sh.chunks, nq = sh.nq, cpg = sh.cpg, ng = (chunks + cpg - 1) / cpg;
    std::vector<std::uint8_t> bytes(n * chunks * 32 + 64);
    Rng rng(5);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng.uniform() * 256.0);
    std::vector<std::uint16_t> half(n * chunks * 8);  // f16 rows: finite values
    for (auto& h : half) h = f32_to_f16_ref(static_cast<float>(rng.normal()));
    std::vector<float> f32(n * chunks * 8);
    for (auto& x : f32) x = static_cast<float>(rng.normal());
    const std::vector<float> w = normal(nq * chunks * 8, 6), bias = normal(nq, 7), coef = normal(n * nq * ng, 8);
    const std::vector<float> levels = normal(16, 9);  // level formats: codes stand for these
    std::vector<std::uint8_t> e4m3 = bytes, e5m2 = bytes;  // the NaN (and e5m2's infinity) codes made finite
    for (auto& b : e4m3) b = (b & 0x7F) == 0x7F ? static_cast<std::uint8_t>(b - 1) : b;
    for (auto& b : e5m2) b = (b & 0x7C) == 0x7C ? static_cast<std::uint8_t>(b & 0xFB) : b;
    // ggml blocks: random codes (and 5th bits), each block's scale and min a finite f16.
    struct GgmlRows {
      RowFormat f;
      std::size_t bytes;
      bool min;
      std::vector<std::uint8_t> data;
    };
    std::vector<GgmlRows> ggml = {{RowFormat::q8_0, 34, false, bytes}, {RowFormat::q4_0, 18, false, bytes},
                                  {RowFormat::q4_1, 20, true, bytes},  {RowFormat::q5_0, 22, false, bytes},
                                  {RowFormat::q5_1, 24, true, bytes},  {RowFormat::iq4_nl, 18, false, bytes}};
    for (auto& g : ggml) {
      for (std::size_t blk = 0; blk < n * chunks / 4; ++blk) {
        for (std::size_t field = 0; field < (g.min ? 2u : 1u); ++field) {
          const std::uint16_t x = f32_to_f16_ref(static_cast<float>(rng.normal()));
          std::memcpy(g.data.data() + blk * g.bytes + 2 * field, &x, 2);
        }
      }
    }
    for (RowFormat f : {RowFormat::f32, RowFormat::f16, RowFormat::code2, RowFormat::code3,
                        RowFormat::code4, RowFormat::code8, RowFormat::level2, RowFormat::level3, RowFormat::level4,
                        RowFormat::e4m3, RowFormat::e5m2, RowFormat::q8_0, RowFormat::q4_0, RowFormat::q4_1,
                        RowFormat::q5_0, RowFormat::q5_1, RowFormat::iq4_nl}) {
      const GgmlRows* g = nullptr;
      for (const auto& x : ggml) g = x.f == f ? &x : g;
      if (g && chunks % 4 != 0) continue;
      const std::size_t bits = f == RowFormat::f32 ? 32 : f == RowFormat::f16 ? 16
                               : f == RowFormat::code2 || f == RowFormat::level2 ? 2
                               : f == RowFormat::code3 || f == RowFormat::level3 ? 3
                               : f == RowFormat::code4 || f == RowFormat::level4 ? 4 : 8;
      const std::uint8_t* base = f == RowFormat::f32    ? reinterpret_cast<const std::uint8_t*>(f32.data())
                                 : f == RowFormat::f16  ? reinterpret_cast<const std::uint8_t*>(half.data())
                                 : f == RowFormat::e4m3 ? e4m3.data()
                                 : f == RowFormat::e5m2 ? e5m2.data()
                                 : g                    ? g->data.data()
                                                        : bytes.data();
      float table[16];  // level formats: the codes' values repeated (level_table)
      attn::level_table(levels.data(), bits > 4 ? 4 : static_cast<int>(bits), table);
      const std::size_t stride = g ? chunks / 4 * g->bytes : chunks * bits;
      const attn::Rows rows{f, base, stride, n, chunks, table};
      std::vector<std::vector<float>> s(3), acc(3), sq(3);
      for_each_isa([&](Isa isa) {
        auto& si = s[static_cast<std::size_t>(isa)];
        auto& ai = acc[static_cast<std::size_t>(isa)];
        auto& qi = sq[static_cast<std::size_t>(isa)];
        si.assign(nq * n, 0.0f);
        ai.assign(nq * chunks * 8, 0.5f);
        qi.assign(n, 0.0f);
        attn::score_rows(rows, nq, w.data(), chunks * 8, bias.data(), si.data(), n);
        // The rows' sums of squares beside the scores: the scores unchanged (one head over 2- or
        // 4-bit codes: the 8-wide loops instead of the 16-wide, the same sums in another order;
        // 4-bit levels keep the 16-wide loops' order, sums of squares and all).
        std::vector<float> s2(nq * n);
        attn::score_rows(rows, nq, w.data(), chunks * 8, bias.data(), s2.data(), n, qi.data());
        if (nq == 1 && (f == RowFormat::code2 || f == RowFormat::code4)) {
          CHECK(rel_err(s2, si) <= 1e-6);
        } else {
          CHECK(s2 == si);
        }
        attn::accumulate_rows(rows, nq, coef.data(), ng, cpg, ai.data(), chunks * 8);
        // A row's score does not depend on the block of rows it was computed in.
        std::vector<float> one(nq);
        for (std::size_t r = 0; r < n; ++r) {
          const attn::Rows row{f, base + r * rows.stride, rows.stride, 1, chunks, table};
          attn::score_rows(row, nq, w.data(), chunks * 8, bias.data(), one.data(), 1);
          for (std::size_t h = 0; h < nq; ++h) CHECK(one[h] == si[h * n + r]);
        }
      });
      INFO("format " << static_cast<int>(f) << ", heads " << nq << ", chunks " << chunks << ", chunks per group " << cpg);
      for (std::size_t i = 1; i < 3; ++i) {
        if (s[i].empty()) continue;
        CHECK(rel_err(s[i], s[0]) <= 1e-6);
        CHECK(rel_err(acc[i], acc[0]) <= 1e-6);
        CHECK(rel_err(sq[i], sq[0]) <= 4e-6);  // up to 320 positive terms: serial against 8 lanes
      }
      if (!s[2].empty()) {
        CHECK(s[2] == s[1]);
        CHECK(acc[2] == acc[1]);
        CHECK(sq[2] == sq[1]);
      }
      with_other_avx512_halves([&] {  // two heads' keys, one head's values in the other loops: the same bits
        std::vector<float> s3(nq * n), s4(nq * n), q3(n, 0.0f);
        attn::score_rows(rows, nq, w.data(), chunks * 8, bias.data(), s3.data(), n);
        attn::score_rows(rows, nq, w.data(), chunks * 8, bias.data(), s4.data(), n, q3.data());
        std::vector<float> a3(nq * chunks * 8, 0.5f);
        attn::accumulate_rows(rows, nq, coef.data(), ng, cpg, a3.data(), chunks * 8);
        CHECK(s3 == s[1]);
        CHECK(q3 == sq[1]);
        CHECK(a3 == acc[1]);
      });
    }
  }
}

TEST_CASE("value coefficients and key weights: the vector loops give the plain loops' bits", "[attention]") {
  // Plain loops: coef = p * scale, zero sums as four partial fused sums over i % 4 (value
  // coefficients), bias as 32 over c % 32 (key weights). 4 groups take the two-rows-per-vector
  // loop, 1 and 2 the narrow one (17 heads: more than one batch of 16; 1 group of 1 head its
  // consecutive coefficients), 5 the others; row counts
  // leave every remainder of 4; 136 channels a partial round of the key weights' four
  // accumulators. One group of 2 or 4 heads: rows x heads a vector.
  for (std::size_t ng : {1, 2, 4, 5}) {
    for (std::size_t nq : {1, 2, 3, 4, 17}) {
      for (std::size_t n : {1, 3, 4, 7, 16, 61}) {
        const std::size_t ps = n + 3;
        const std::vector<float> p = normal(nq * ps, 11, 0.5, 0.3);
        const std::vector<std::uint16_t> scale = normal_f16(n * ng, 12), zero = normal_f16(n * ng, 13);
        std::vector<std::vector<float>> coef(3), zsum(3);
        for_each_isa([&](Isa isa) {
          auto& c = coef[static_cast<std::size_t>(isa)];
          auto& z = zsum[static_cast<std::size_t>(isa)];
          c.assign(n * nq * ng, -1.0f);
          z.assign(nq * ng, -1.0f);
          attn::value_coefficients(p.data(), ps, scale.data(), zero.data(), n, nq, ng, c.data(), z.data());
        });
        INFO("groups " << ng << ", heads " << nq << ", rows " << n);
        for (std::size_t i = 1; i < 3; ++i) {
          if (coef[i].empty()) continue;
          CHECK(coef[i] == coef[0]);
          CHECK(zsum[i] == zsum[0]);
        }
      }
    }
  }
  for (std::size_t cols : {8, 64, 136}) {
    for (std::size_t nq : {1, 3, 9}) {
      const std::vector<float> q = normal(nq * cols, 14);
      const std::vector<std::uint16_t> scale = normal_f16(cols, 15), zero = normal_f16(cols, 16);
      std::vector<std::vector<float>> w(3), bias(3);
      for_each_isa([&](Isa isa) {
        auto& wi = w[static_cast<std::size_t>(isa)];
        auto& bi = bias[static_cast<std::size_t>(isa)];
        wi.assign(nq * cols, -1.0f);
        bi.assign(nq, -1.0f);
        attn::key_weights(q.data(), nq, cols, scale.data(), zero.data(), wi.data(), bi.data());
      });
      INFO("cols " << cols << ", heads " << nq);
      for (std::size_t i = 1; i < 3; ++i) {
        if (w[i].empty()) continue;
        CHECK(w[i] == w[0]);
        CHECK(bias[i] == bias[0]);
      }
    }
  }
}

TEST_CASE("fused decode attention equals the reference with every instruction set", "[attention]") {
  for_each_isa([&](Isa) {
    for (int bits : {2, 4}) {
      Layout l;
      l.bits_k = l.bits_v = bits;
      check_against_ref(l, 2, 4);
    }
  });
}

TEST_CASE("per-token keys (uniform's layout) and per-channel values through the code loops group by group: within "
          "1e-5 of the reference, AVX2 == AVX-512 bitwise", "[attention]") {
  // Keys: each group's dot products by the code loops against the query's slice, scaled per row
  // and group; 48 leaves a partial last group of 32 channels, 128 one group a row. Values: each
  // group of `group` tokens accumulated as codes, then scaled per channel; 283 rows end in a
  // partial group and a partial tile.
  for (int bits : {2, 3, 4, 8}) {
    for (std::size_t group : {32, 48, 128}) {
      for (std::size_t nq : {1, 4, 8}) {
        Layout l;
        l.bits_k = l.bits_v = bits;
        l.group = group;
        l.axis_k = QuantAxis::token;
        l.axis_v = QuantAxis::channel;
        l.quant_k = l.quant_v = 283;  // not a multiple of a tile
        std::vector<std::vector<float>> out;
        for_each_isa([&](Isa isa) {
          check_against_ref(l, 2, nq);
          if (isa == Isa::generic) return;
          std::vector<std::unique_ptr<TestHead>> heads;
          std::vector<HeadView> views;
          for (std::size_t i = 0; i < 2; ++i) {
            heads.push_back(make_head(l, 100 + 7 * i));
            views.push_back(heads.back()->view());
          }
          const std::vector<float> q = normal(2 * nq * l.d, 9);
          out.emplace_back(q.size());
          decode_attention({q.data(), 2 * nq, l.d, views.data(), 2, 0.125f, out.back().data(), nullptr}, {1, 64, 128});
        });
        INFO("bits " << bits << " group " << group << " gqa " << nq);
        if (out.size() == 2) CHECK(out[0] == out[1]);
      }
    }
  }
}

TEST_CASE("exp_shifted is within 3e-7 of std::exp", "[attention]") {
  std::vector<float> x(1003), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -80.0f * static_cast<float>(i) / 1000.0f;
  const float sum = attn::exp_shifted(x.data(), 0.5f, x.size(), y.data());
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double e = std::exp(static_cast<double>(x[i] - 0.5f));  // the float difference, as the kernel
    CHECK(std::abs(y[i] - e) <= 3e-7 * e);
    s += e;
  }
  CHECK(std::abs(sum - s) <= 1e-6 * s);
}

TEST_CASE("fused decode attention equals the reference over the dequantized cache", "[attention]") {
  SECTION("every bit width, GQA 1/4/8, KIVI layout") {
    for (int bits : {2, 3, 4, 8}) {
      for (std::size_t nq : {1, 4, 8}) {
        Layout l;
        l.bits_k = l.bits_v = bits;
        check_against_ref(l, 2, nq);
      }
    }
  }
  SECTION("mixed bits, lengths not multiples of the tile, partial key group") {
    Layout l;
    l.bits_k = 4;
    l.bits_v = 2;
    l.n = 1001;
    l.quant_k = 970;  // a partial last group
    l.quant_v = 999;
    check_against_ref(l, 3, 4, {1, 64, 256});
  }
  SECTION("empty quantized part / empty dense part / empty head") {
    Layout l;
    l.quant_k = l.quant_v = 0;
    check_against_ref(l, 2, 4);
    l.quant_k = l.quant_v = l.n = 320;
    check_against_ref(l, 2, 4);
    l.n = l.quant_k = l.quant_v = 0;
    check_against_ref(l, 1, 2);
  }
  SECTION("head_dim 64, f32 dense rows, GQA 2 and 3") {
    Layout l;
    l.d = 64;
    l.dense = DenseType::f32;
    check_against_ref(l, 2, 2);
    check_against_ref(l, 2, 3);
  }
  SECTION("outlier key channels, per-token keys, per-channel values, head_dim 36 (the plain loops' fallback)") {
    Layout l;
    l.outliers = 8;
    check_against_ref(l, 2, 4);
    l.outliers = 3;  // 125 quantized channels: not a multiple of 8
    check_against_ref(l, 2, 4);
    l.outliers = 0;
    l.axis_k = QuantAxis::token;
    l.axis_v = QuantAxis::channel;
    check_against_ref(l, 2, 4);
    l = Layout{};
    l.d = 36;
    l.group = 12;
    l.quant_k = 264;
    check_against_ref(l, 2, 2);
  }
}

TEST_CASE("decode attention with Gemma 2's logit soft-capping equals the reference; the cap binds", "[attention]") {
  // A cap of 0.3 on logits of these rows (|s| up to about 1): the capped outputs differ from the
  // uncapped ones by far more than the 1e-5 the fast path keeps to the reference.
  for (const bool dense : {false, true}) {
    Layout l;
    if (dense) l.dense = DenseType::f32;
    check_against_ref(l, 2, 4, {}, 0.3f);
  }
  Layout l;
  auto head = make_head(l, 3);
  const HeadView v = head->view();
  const std::vector<float> q = normal(l.d, 4);
  std::vector<float> capped(l.d), plain(l.d);
  DecodeAttentionArgs a{q.data(), 1, l.d, &v, 1, 1.0f / std::sqrt(static_cast<float>(l.d)), capped.data()};
  a.softcap = 0.3f;
  decode_attention(a);
  a.softcap = 0.0f;
  a.out = plain.data();
  decode_attention(a);
  CHECK(rel_err(capped, plain) > 1e-3);
}

TEST_CASE("rotated views: the query rotated and the output rotated back equal the reference over rows rotated back",
          "[attention][rotation]") {
  // The reference rotates every dequantized row back (dequantize_rows) and uses the query as
  // given; the fast path rotates the query once and the output back once.
  Layout l;
  l.rot_k = tensor_rotation(RotationKind::hadamard, 0, l.d, true);
  l.rot_v = tensor_rotation(RotationKind::hadamard, 0, l.d, false);
  CHECK(l.rot_k.block == 128);
  CHECK(l.rot_v.block == 64);
  check_against_ref(l, 2, 4);
  l.rot_k = tensor_rotation(RotationKind::random, 5, l.d, true);
  l.rot_v = {};
  check_against_ref(l, 2, 3);
  l.rot_k = {};
  l.rot_v = tensor_rotation(RotationKind::random, 9, l.d, false);
  check_against_ref(l, 1, 8, {2, 64, 128});
  SECTION("segments rotated differently are refused") {
    Layout a;
    a.rot_k = tensor_rotation(RotationKind::hadamard, 0, a.d, true);
    auto h0 = make_head(a, 1), h1 = make_head(Layout{}, 2);
    const HeadView v[2] = {h0->view(), h1->view()};
    const std::vector<float> q(a.d, 1.0f);
    std::vector<float> out(a.d);
    CHECK_THROWS_AS(decode_attention({q.data(), 1, a.d, v, 1, 1.0f, out.data(), nullptr, 2}), InvalidInput);
  }
}

TEST_CASE("fused decode attention is bitwise identical for any thread count", "[attention]") {
  Layout l;
  l.n = 5000;
  l.quant_k = 4864;
  l.quant_v = 4872;
  std::vector<std::unique_ptr<TestHead>> heads;
  std::vector<HeadView> views;
  for (std::size_t i = 0; i < 2; ++i) {
    heads.push_back(make_head(l, 40 + i));
    views.push_back(heads.back()->view());
  }
  const std::vector<float> q = normal(8 * l.d, 2);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    std::vector<float> out(8 * l.d);
    decode_attention({q.data(), 8, l.d, views.data(), 2, 0.1f, out.data(), nullptr}, {threads, 64, 1024});
    outs.push_back(out);
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
}

TEST_CASE("decode attention refuses inconsistent shapes", "[attention]") {
  Layout l;
  auto h = make_head(l, 1);
  HeadView v = h->view();
  v.value.dense.rows -= 1;
  const std::vector<float> q(4 * l.d, 0.0f);
  std::vector<float> out(4 * l.d);
  CHECK_THROWS_AS(decode_attention({q.data(), 4, l.d, &v, 1, 1.0f, out.data(), nullptr}), InvalidInput);
  v = h->view();
  CHECK_THROWS_AS(decode_attention({q.data(), 3, l.d, &v, 2, 1.0f, out.data(), nullptr}), InvalidInput);
  CHECK_THROWS_AS(decode_attention({q.data(), 4, l.d, &v, 1, 1.0f, out.data(), nullptr}, {1, 64, 100}), InvalidInput);
}

TEST_CASE("decode attention over several segments per KV head (tiers)", "[attention]") {
  // Per KV head: a 4-bit packed segment, a 2-bit packed one, an empty one, a dense f16 one.
  Layout warm, cold, hot;
  warm.n = warm.quant_k = warm.quant_v = 160;
  cold.n = cold.quant_k = cold.quant_v = 96;
  cold.bits_k = cold.bits_v = 2;
  hot.n = 75;
  hot.quant_k = hot.quant_v = 0;
  Layout none = hot;
  none.n = 0;
  const std::size_t n_kv = 2, nq = 4, d = 128, segs = 4;
  std::vector<std::unique_ptr<TestHead>> store;
  std::vector<HeadView> views;
  for (std::size_t kv = 0; kv < n_kv; ++kv) {
    for (const Layout* l : {&warm, &cold, &none, &hot}) {
      store.push_back(make_head(*l, 10 * kv + store.size()));
      views.push_back(store.back()->view());
    }
  }
  const std::vector<float> q = normal(n_kv * nq * d, 4);
  std::vector<float> out(q.size()), ref(q.size());
  const std::size_t n = warm.n + cold.n + hot.n;
  std::vector<std::vector<float>> pf(n_kv * nq, std::vector<float>(n)), pr = pf;
  std::vector<float*> pfp, prp;
  for (std::size_t h = 0; h < n_kv * nq; ++h) {
    pfp.push_back(pf[h].data());
    prp.push_back(pr[h].data());
  }
  DecodeAttentionArgs a{q.data(), n_kv * nq, d, views.data(), n_kv, 0.09f, out.data(), pfp.data(), segs};
  decode_attention(a, {2, 64, 64});
  a.out = ref.data();
  a.probs = prp.data();
  decode_attention_ref(a);
  CHECK(rel_err(out, ref) <= 1e-5);
  for (std::size_t h = 0; h < n_kv * nq; ++h) CHECK(rel_err(pf[h], pr[h]) <= 1e-5);
}

namespace {

// Per KV head a 4-bit packed segment of 256 rows, an empty one and a dense f16 one of 75 (views,
// three per head), and per KV head 331 dense f16 rows in one segment (flat_views): the caches of
// the masked-attention tests (visible rows, a first row).
struct MaskedHeads {
  explicit MaskedHeads(std::size_t n_kv) {
    Layout warm, hot;
    warm.n = warm.quant_k = warm.quant_v = 256;
    hot.n = 75;
    hot.quant_k = hot.quant_v = 0;
    Layout none = hot;
    none.n = 0;
    Layout dense = hot;
    dense.n = 331;
    for (std::size_t kv = 0; kv < n_kv; ++kv) {
      for (const Layout* l : {&warm, &none, &hot}) {
        store.push_back(make_head(*l, 10 * kv + store.size()));
        views.push_back(store.back()->view());
      }
    }
    for (std::size_t kv = 0; kv < n_kv; ++kv) {
      flat.push_back(make_head(dense, 40 + kv));
      flat_views.push_back(flat.back()->view());
    }
  }
  std::vector<std::unique_ptr<TestHead>> store, flat;
  std::vector<HeadView> views, flat_views;
};

}  // namespace

TEST_CASE("decode attention with visible rows: each query head over the first rows of its KV head", "[attention]") {
  // Visible counts inside each segment and on their boundaries, over partitions of 64 rows.
  const std::size_t n_kv = 2, nq = 6, d = 128, segs = 3, n = 331;
  const MaskedHeads m(n_kv);
  const std::vector<HeadView>& views = m.views;
  const std::vector<HeadView>& flat_views = m.flat_views;
  const std::vector<float> q = normal(n_kv * nq * d, 5);
  const std::vector<std::size_t> visible = {1, 63, 64, 65, 256, 257, 331, 300, 128, 2, 330, 200};
  std::vector<float> out(q.size()), ref(q.size()), alone(d);
  DecodeAttentionArgs a{q.data(), n_kv * nq, d, views.data(), n_kv, 0.09f, out.data(), nullptr, segs};
  a.visible = visible.data();
  decode_attention(a, {2, 64, 64});
  a.out = ref.data();
  decode_attention_ref(a);
  CHECK(rel_err(out, ref) <= 1e-5);
  // Dense f16 rows: each head against the fast path of that head alone over its first visible
  // rows (the view cut there).
  decode_attention({q.data(), n_kv * nq, d, flat_views.data(), n_kv, 0.09f, out.data(), nullptr, 1, visible.data()},
                   {2, 64, 64});
  for (std::size_t h = 0; h < n_kv * nq; ++h) {
    HeadView cut = flat_views[h / nq];
    cut.key.dense.rows = cut.value.dense.rows = visible[h];
    decode_attention({q.data() + h * d, 1, d, &cut, 1, 0.09f, alone.data(), nullptr}, {2, 64, 64});
    const std::vector<float> x(out.begin() + static_cast<std::ptrdiff_t>(h * d), out.begin() + static_cast<std::ptrdiff_t>((h + 1) * d));
    INFO("head " << h << " visible " << visible[h]);
    CHECK(rel_err(x, alone) <= 1e-6);
  }
  // Counts outside 1..rows, and probabilities beside visible rows, are refused.
  std::vector<std::size_t> bad = visible;
  bad[3] = 0;
  a.visible = bad.data();
  CHECK_THROWS_AS(decode_attention(a), InvalidInput);
  bad[3] = n + 1;
  CHECK_THROWS_AS(decode_attention(a), InvalidInput);
  std::vector<std::vector<float>> pr(n_kv * nq, std::vector<float>(n));
  std::vector<float*> prp;
  for (auto& v : pr) prp.push_back(v.data());
  a.visible = visible.data();
  a.probs = prp.data();
  CHECK_THROWS_AS(decode_attention(a), InvalidInput);
}

TEST_CASE("decode attention with a first row: each query head over rows [first, visible) of its KV head",
          "[attention]") {
  // Windows starting in each segment, on tile and segment boundaries, one row wide.
  const std::size_t n_kv = 2, nq = 6, d = 128, segs = 3;
  const MaskedHeads m(n_kv);
  const std::vector<HeadView>& views = m.views;
  const std::vector<HeadView>& flat_views = m.flat_views;
  const std::vector<float> q = normal(n_kv * nq * d, 7);
  const std::vector<std::size_t> visible = {1, 63, 100, 65, 256, 331, 331, 300, 128, 2, 330, 200};
  const std::vector<std::size_t> first = {0, 62, 36, 64, 255, 256, 250, 0, 127, 1, 300, 64};
  std::vector<float> out(q.size()), ref(q.size());
  DecodeAttentionArgs a{q.data(), n_kv * nq, d, views.data(), n_kv, 0.09f, out.data(), nullptr, segs};
  a.visible = visible.data();
  a.first = first.data();
  decode_attention(a, {2, 64, 64});
  a.out = ref.data();
  decode_attention_ref(a);
  CHECK(rel_err(out, ref) <= 1e-5);
  // Each head against the reference of that head alone over its rows [first, visible): the dense
  // f16 segment cut to them.
  DecodeAttentionArgs b{q.data(), n_kv * nq, d, flat_views.data(), n_kv, 0.09f, out.data(), nullptr, 1, visible.data()};
  b.first = first.data();
  decode_attention(b, {2, 64, 64});
  std::vector<float> alone(d);
  for (std::size_t h = 0; h < n_kv * nq; ++h) {
    HeadView cut = flat_views[h / nq];
    const std::size_t rows = visible[h] - first[h];
    cut.key.dense.data = static_cast<const std::uint16_t*>(cut.key.dense.data) + first[h] * d;
    cut.value.dense.data = static_cast<const std::uint16_t*>(cut.value.dense.data) + first[h] * d;
    cut.key.dense.rows = cut.value.dense.rows = rows;
    decode_attention_ref({q.data() + h * d, 1, d, &cut, 1, 0.09f, alone.data(), nullptr});
    const std::vector<float> x(out.begin() + static_cast<std::ptrdiff_t>(h * d), out.begin() + static_cast<std::ptrdiff_t>((h + 1) * d));
    INFO("head " << h << " rows [" << first[h] << ", " << visible[h] << ")");
    CHECK(rel_err(x, alone) <= 1e-5);
  }
  // A first row the head does not see is refused.
  std::vector<std::size_t> bad = first;
  bad[0] = 1;
  a.first = bad.data();
  CHECK_THROWS_AS(decode_attention(a), InvalidInput);
}

TEST_CASE("exp_weights: exp_shifted with the weights below 2^-100 set to 0", "[attention]") {
  std::vector<float> x(1003), y(x.size()), w(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -100.0f * static_cast<float>(i) / 1000.0f;
  attn::exp_shifted(x.data(), 0.0f, x.size(), y.data());
  const float sum = attn::exp_weights(x.data(), 0.0f, x.size(), w.data());
  double s = 0;
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool tiny = std::exp(static_cast<double>(x[i])) < std::ldexp(1.0, -100) * (1 - 1e-6);
    if (y[i] >= attn::kMinWeight) CHECK(w[i] == y[i]);
    if (tiny) CHECK(w[i] == 0.0f);
    zeros += w[i] == 0.0f;
    s += w[i];
  }
  CHECK(zeros >= 300);  // exp(x) < 2^-100 from x = -69.3 on
  CHECK(zeros <= 310);
  CHECK(std::abs(sum - s) <= 1e-6 * s);
  CHECK(attn::kMinWeight == static_cast<float>(std::ldexp(1.0, -100)));
}

TEST_CASE("softmax and log_softmax: hand-computed values, f32 and f64 inputs agree", "[attention][block]") {
  // s = {0, ln 2, ln 3}: p = {1, 2, 3} / 6.
  const double sd[3] = {0.0, std::log(2.0), std::log(3.0)};
  double p[3], lp[3];
  softmax(sd, 3, p);
  CHECK(p[0] == Approx(1.0 / 6).epsilon(1e-15));
  CHECK(p[1] == Approx(2.0 / 6).epsilon(1e-15));
  CHECK(p[2] == Approx(3.0 / 6).epsilon(1e-15));
  log_softmax(sd, 3, lp);
  for (int j = 0; j < 3; ++j) CHECK(lp[j] == Approx(std::log(p[j])).epsilon(1e-14));
  // Large logits do not overflow (max subtracted), and f32 input is promoted exactly.
  const float sf[2] = {1000.0f, 1000.0f};
  double pf[2];
  softmax(sf, 2, pf);
  CHECK(pf[0] == 0.5);
  CHECK(pf[1] == 0.5);
}

TEST_CASE("causal block attention: fast path within 1e-5 of the f64 reference, blocks and prefixes", "[attention][block]") {
  // 300 queries (three blocks of 128) at positions 100..399 over 400 keys, and a subset of keys.
  const std::size_t nk = 400, nq = 300, d = 32;
  Rng rng(11);
  std::vector<float> q(nq * d), k(nk * d), v(nk * d);
  for (auto* x : {&q, &k, &v}) {
    for (float& f : *x) f = static_cast<float>(rng.normal());
  }
  std::vector<std::size_t> visible(nq);
  for (std::size_t i = 0; i < nq; ++i) visible[i] = 100 + i + 1;
  visible[0] = 0;  // a query that sees nothing
  CausalBlock b;
  b.q = q.data();
  b.k = k.data();
  b.visible = visible.data();
  b.nq = nq;
  b.nk = nk;
  b.d = d;
  // Reference outputs: f64 logits, softmax, P V in f64.
  std::vector<double> ref(nq * d, 0.0);
  causal_logits_ref(b, [&](std::size_t i, const double* s, std::size_t n) {
    if (n == 0) return;
    std::vector<double> p(n);
    softmax(s, n, p.data());
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t c = 0; c < d; ++c) ref[i * d + c] += p[j] * v[j * d + c];
    }
  });
  std::vector<float> out(nq * d, -1.0f);
  std::size_t rows_seen = 0;
  std::ptrdiff_t last = -1;
  causal_attention(b, v.data(), out.data(), [&](std::size_t i, const float* s, const double* p, double lse, std::size_t n) {
    CHECK(static_cast<std::ptrdiff_t>(i) > last);  // queries in order
    last = static_cast<std::ptrdiff_t>(i);
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += p[j];
    CHECK(sum == Approx(1.0).epsilon(1e-12));
    std::vector<double> logp(n);  // s - lse: log_softmax's, bit for bit
    log_softmax(s, n, logp.data());
    for (std::size_t j = 0; j < n; ++j) CHECK(static_cast<double>(s[j]) - lse == logp[j]);
    CHECK(n == visible[i]);
    ++rows_seen;
  });
  CHECK(rows_seen == nq - 1);  // every query but the one that sees nothing
  double worst = 0;
  for (std::size_t i = 0; i < nq * d; ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]));
  CHECK(worst < 1e-5);
  for (std::size_t c = 0; c < d; ++c) CHECK(out[c] == 0.0f);  // visible 0: zero output
  // Logits: fast f32 within 1e-5 of the f64 reference, row by row.
  std::vector<std::vector<double>> ls(nq);
  causal_logits_ref(b, [&](std::size_t i, const double* s, std::size_t n) { ls[i].assign(s, s + n); });
  double lw = 0;
  causal_logits(b, [&](std::size_t i, const float* s, std::size_t n) {
    REQUIRE(n == ls[i].size());
    for (std::size_t j = 0; j < n; ++j) lw = std::max(lw, std::fabs(s[j] - ls[i][j]));
  });
  CHECK(lw < 1e-5);
}

TEST_CASE("causal block attention: the online-softmax (flash) path within 1e-5 of the f64 reference", "[attention][block]") {
  // Query tiles of 64 and key tiles of 256: counts on both sides of each edge; peaked logits
  // (queries scaled by 4) so that the running maximum moves between key tiles.
  Rng rng(12);
  const std::size_t d = 64;
  for (const std::size_t nq : {1, 63, 64, 65, 300}) {
    for (const double qscale : {1.0, 4.0}) {
      const std::size_t nk = nq + 250;
      INFO("nq " << nq << " q scale " << qscale);
      std::vector<float> q(nq * d), k(nk * d), v(nk * d);
      for (float& f : q) f = static_cast<float>(qscale * rng.normal());
      for (auto* x : {&k, &v}) {
        for (float& f : *x) f = static_cast<float>(rng.normal());
      }
      std::vector<std::size_t> visible(nq);
      for (std::size_t i = 0; i < nq; ++i) visible[i] = 250 + i + 1;
      if (nq > 1) visible[0] = 0;  // a query that sees nothing
      const CausalBlock b{q.data(), k.data(), visible.data(), nq, nk, d};
      std::vector<float> ref(nq * d), flash(nq * d, -1.0f), again(nq * d);
      causal_attention_ref(b, v.data(), ref.data());
      causal_attention_flash(b, v.data(), flash.data());
      causal_attention_flash(b, v.data(), again.data());
      CHECK(again == flash);
      float vmax = 0, worst = 0;
      for (const float x : v) vmax = std::max(vmax, std::fabs(x));
      for (std::size_t i = 0; i < nq * d; ++i) worst = std::max(worst, std::fabs(flash[i] - ref[i]));
      CHECK(worst <= 1e-5f * vmax);
      if (nq > 1) {
        for (std::size_t c = 0; c < d; ++c) CHECK(flash[c] == 0.0f);  // visible 0: zero output
      }
    }
  }
}

TEST_CASE("causal block attention: a sliding window (first visible key) in the flash path and the reference", "[attention][block]") {
  // Query i at position 200 + i sees keys max(0, 200 + i + 1 - W) .. 200 + i: windows inside one
  // key tile, across tiles and wider than the prompt. The reference with `first` equals it on the
  // window's keys alone (a block whose keys start at first[i]); flash within 1e-5 * max |v|.
  Rng rng(21);
  const std::size_t d = 32, nq = 130, nk = 200 + nq;
  std::vector<float> q(nq * d), k(nk * d), v(nk * d);
  for (auto* x : {&q, &k, &v}) {
    for (float& f : *x) f = static_cast<float>(2.0 * rng.normal());
  }
  float vmax = 0;
  for (const float x : v) vmax = std::max(vmax, std::fabs(x));
  for (const std::size_t window : {1, 7, 64, 300, 1000}) {
    INFO("window " << window);
    std::vector<std::size_t> visible(nq), first(nq);
    for (std::size_t i = 0; i < nq; ++i) {
      visible[i] = 200 + i + 1;
      first[i] = visible[i] > window ? visible[i] - window : 0;
    }
    CausalBlock b{q.data(), k.data(), visible.data(), nq, nk, d};
    b.first = first.data();
    if (window == 64) b.softcap = 1.5f;  // Gemma 2's soft-capping, binding on these logits
    std::vector<float> ref(nq * d), flash(nq * d), alone(d);
    causal_attention_ref(b, v.data(), ref.data());
    causal_attention_flash(b, v.data(), flash.data());
    double worst_alone = 0, worst_flash = 0;
    for (std::size_t i = 0; i < nq; ++i) {
      const std::size_t n = visible[i] - first[i];
      CausalBlock one{q.data() + i * d, k.data() + first[i] * d, &n, 1, n, d};
      one.softcap = b.softcap;
      causal_attention_ref(one, v.data() + first[i] * d, alone.data());
      for (std::size_t c = 0; c < d; ++c) {
        worst_alone = std::max(worst_alone, static_cast<double>(std::fabs(alone[c] - ref[i * d + c])));
        worst_flash = std::max(worst_flash, static_cast<double>(std::fabs(flash[i * d + c] - ref[i * d + c])));
      }
    }
    CHECK(worst_alone == 0.0);
    CHECK(worst_flash <= 1e-5 * vmax);
  }
}

TEST_CASE("PackedTensor: blocks inserted and erased in the middle equal the same blocks appended in order", "[attention][packed]") {
  const std::size_t d = 16, B = 32;
  Rng rng(5);
  std::vector<std::vector<float>> blocks(5, std::vector<float>(B * d));
  for (auto& b : blocks) {
    for (float& x : b) x = static_cast<float>(rng.normal());
  }
  for (QuantAxis axis : {QuantAxis::channel, QuantAxis::token}) {
    const std::size_t g = axis == QuantAxis::channel ? B : 8;
    auto q = [&](std::size_t i) { return quantize_block(blocks[i].data(), B, d, axis, 3, g, QuantRule::kivi); };
    // Built out of order: 1, then 3 after it, 0 in front, 2 between 1 and 3, 4 (to be erased)
    // in the middle; then 4 erased.
    PackedTensor mixed(d, DenseType::f16);
    mixed.insert_packed(0, q(1));
    mixed.insert_packed(B, q(3));
    mixed.insert_packed(0, q(0));
    mixed.insert_packed(2 * B, q(2));
    mixed.insert_packed(2 * B, q(4));
    mixed.erase_packed(2 * B, B);
    PackedTensor ordered(d, DenseType::f16);
    for (std::size_t i = 0; i < 4; ++i) ordered.append_packed(q(i), {}, nullptr);
    const QuantizedBlock a = mixed.packed_block(), b = ordered.packed_block();
    CHECK(a.rows == 4 * B);
    CHECK(a.codes == b.codes);
    CHECK(a.scale == b.scale);
    CHECK(a.zero == b.zero);
    CHECK(mixed.bytes() == ordered.bytes());
    std::vector<float> x(4 * B * d), y(4 * B * d);
    dequantize_rows(mixed.view(), d, 0, 4 * B, x.data());
    dequantize_rows(ordered.view(), d, 0, 4 * B, y.data());
    CHECK(x == y);
    // A block that does not start on a group (channel axis) or byte boundary is refused.
    if (axis == QuantAxis::channel) CHECK_THROWS_AS(mixed.insert_packed(B / 2, q(4)), InvalidInput);
    CHECK_THROWS_AS(mixed.erase_packed(4 * B - 1, 2), InvalidInput);
  }
  // Dense f16 rows in the middle.
  PackedTensor dense(d, DenseType::f16);
  std::vector<std::uint16_t> r0(2 * d, 1), r1(d, 2);
  dense.insert_dense_f16(0, r0.data(), 2);
  dense.insert_dense_f16(1, r1.data(), 1);
  CHECK(dense.dense_f16(1)[0] == 2);
  CHECK(dense.dense_f16(2)[0] == 1);
  dense.erase_dense(0, 2);
  CHECK(dense.dense_rows() == 1);
  CHECK(dense.dense_f16(0)[0] == 1);
}

TEST_CASE("PackedTensor: rows dropped from the front one at a time leave the others in place", "[attention][cache]") {
  // Row r holds the value r in every channel; drops interleave with appends, swap-removals,
  // insertions and erasures, checked against a plain list of the live rows after every change.
  const std::size_t d = 4;
  for (const DenseType type : {DenseType::f32, DenseType::f16}) {
    PackedTensor t(d, type);
    std::vector<float> live;
    auto row_value = [&](std::size_t i) {
      if (type == DenseType::f32) return t.dense_f32(i)[d - 1];
      return f16_to_f32_ref(t.dense_f16(i)[d - 1]);
    };
    auto check = [&] {
      REQUIRE(t.dense_rows() == live.size());
      for (std::size_t i = 0; i < live.size(); ++i) CHECK(row_value(i) == live[i]);
      const TensorView v = t.view();
      CHECK(v.dense.rows == live.size());
      if (!live.empty()) {
        const float first = type == DenseType::f32 ? static_cast<const float*>(v.dense.data)[0]
                                                   : f16_to_f32_ref(static_cast<const std::uint16_t*>(v.dense.data)[0]);
        CHECK(first == live[0]);
      }
      CHECK(t.bytes() == (type == DenseType::f32 ? 4 : 2) * d * live.size());
    };
    float next = 0;
    auto append = [&](std::size_t n) {
      for (std::size_t i = 0; i < n; ++i, next += 1) {
        const std::vector<float> r(d, next);
        t.append_dense(r.data(), 1);
        live.push_back(next);
      }
    };
    append(10);
    for (std::size_t step = 0; step < 40; ++step) {
      t.drop_dense_front(1);
      live.erase(live.begin());
      check();
      append(step % 3 == 0 ? 2 : 1);
      check();
    }
    t.swap_remove_dense(2);
    live[2] = live.back();
    live.pop_back();
    check();
    t.drop_dense_front(3);
    live.erase(live.begin(), live.begin() + 3);
    check();
    if (type == DenseType::f16) {
      const std::vector<std::uint16_t> r(d, f32_to_f16_ref(100.0f));
      t.insert_dense_f16(1, r.data(), 1);
      live.insert(live.begin() + 1, 100.0f);
      check();
    }
    t.erase_dense(1, 2);
    live.erase(live.begin() + 1, live.begin() + 3);
    check();
    t.drop_dense_front(live.size());
    live.clear();
    check();
    append(3);
    check();
  }
}

TEST_CASE("sign tables: each head's weights over a row's set bits, bit for bit the plain sums in their order",
          "[attention][qjl]") {
  // The plain loops: per chunk (8 bits; one or two heads: per nibble, 4 bits) the weights of its
  // set bits from the lowest up, the chunks' sums added in order (sign_tables.h, kernels.h
  // nibble_sums); equal bit for bit at any head count (nibble tables, 4 and 8 lanes, padded
  // groups, rows past the last block, head_dim not a multiple of 32) on every instruction set,
  // and within 1e-5 of double sums (an independent check of the order's rounding: at most ~d
  // additions of unit-size weights).
  Rng rng(5);
  for (const std::size_t d : {8, 24, 64, 72, 128, 136, 200}) {
    const std::size_t chunks = d / 8, stride = chunks + 3, n = 37;
    std::vector<std::uint8_t> bits((n - 1) * stride + chunks);  // ends with the last row's bits (ASan)
    for (auto& b : bits) b = static_cast<std::uint8_t>(rng.next() >> 56);
    for (const std::size_t nq : {1, 2, 3, 4, 5, 8, 9, 12}) {
      const std::size_t ws = d + 5, part = nq <= 2 ? 4 : 8;
      const std::vector<float> w = normal(nq * ws, 40 + nq);
      for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
        if (isa > best_isa()) continue;
        set_isa(isa);
        const attn::SignTables t(w.data(), ws, nq, d);
        CHECK(t.lanes() == (nq > 4 ? 8u : nq > 2 ? 4u : 1u));
        std::vector<float> out(nq * (n + 1), -1.0f);
        t.sums(bits.data(), stride, n, out.data(), n + 1);
        for (std::size_t h = 0; h < nq; ++h) {
          for (std::size_t i = 0; i < n; ++i) {
            float s = 0.0f;
            double exact = 0.0;
            for (std::size_t k = 0; k < d / part; ++k) {
              float e = 0.0f;
              for (std::size_t j = 0; j < part; ++j) {
                const std::size_t c = part * k + j;
                if ((bits[i * stride + c / 8] >> (c % 8)) & 1u) {
                  e += w[h * ws + c];
                  exact += w[h * ws + c];
                }
              }
              s = k == 0 ? e : s + e;
            }
            INFO("head_dim " << d << " heads " << nq << " head " << h << " row " << i << " isa " << isa_name(isa));
            CHECK(out[h * (n + 1) + i] == s);
            CHECK(std::fabs(out[h * (n + 1) + i] - exact) <= 1e-5 * static_cast<double>(d));
          }
          CHECK(out[h * (n + 1) + n] == -1.0f);  // nothing written past a head's n sums
        }
      }
      set_isa(best_isa());
    }
  }
  CHECK_THROWS_AS(attn::SignTables(nullptr, 12, 1, 12), std::invalid_argument);
  CHECK_THROWS_AS(attn::nibble_sums(nullptr, 1, 3, nullptr, 2, 0, nullptr, 0), std::invalid_argument);
}

TEST_CASE("decode attention over TurboQuant QJL keys (S q against the sign bits) agrees with their read-back rows "
          "within 1e-5", "[attention][ggml][qjl]") {
  // The fast path scores q . x_mse plus each row's QJL term from S q summed over the row's sign
  // bits by sign tables (nibble tables for one or two heads, 16-byte runs transposed at head_dim
  // 128; byte tables from three; the tensor's last row read to its end, no further: ASan); the
  // reference reads the rows back (x_mse + sqrt(pi/2)/d gamma S^T signs). The same products in
  // another order: within 1e-5; avx2 and avx512 give the same bits, generic (the plain loops,
  // another order of the sums) within 2e-6: the levels' dot product times the row's norm, scores
  // of up to ~10 at head_dim 128 through the softmax (measured 1.1e-6).
  const std::size_t n_kv = 2, n = 301;
  for (const int bits : {2, 3, 4}) {
    for (const std::size_t d : {64, 128}) {
      const TqType kt{TqKind::key_qjl, bits, d};
      const GgmlTypeInfo& kinfo = *tq_type_info(kt);
      std::vector<std::vector<std::uint8_t>> kb(n_kv);
      std::vector<std::vector<float>> vf(n_kv);
      std::vector<HeadView> heads(n_kv);
      for (std::size_t h = 0; h < n_kv; ++h) {
        const std::vector<float> k = normal(n * d, 50 + h);
        vf[h] = normal(n * d, 60 + h);
        kb[h].resize(n * tq_row_bytes(kt));
        tq_encode_rows(kt, k.data(), n, kb[h].data());
        heads[h].key.ggml = {&kinfo, kb[h].data(), n};
        heads[h].value.dense = {DenseType::f32, vf[h].data(), n};
      }
      for (std::size_t nq : {1, 2, 3, 4, 8}) {  // the sign bits by nibble tables (1, 2), by byte tables (3 on)
        const std::vector<float> q = normal(n_kv * nq * d, 7);
        std::vector<float> a(q.size()), vec(q.size()), generic(q.size()), ref(q.size());
        bool have_vec = false;
        for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
          if (isa > best_isa()) continue;
          set_isa(isa);
          decode_attention({q.data(), n_kv * nq, d, heads.data(), n_kv, 0.125f, a.data(), nullptr}, {2, 64, 128});
          INFO("bits " << bits << " head_dim " << d << " gqa " << nq << " isa " << isa_name(isa));
          if (isa == Isa::generic) {
            generic = a;
            continue;
          }
          if (have_vec) CHECK(a == vec);
          vec = a;
          have_vec = true;
          CHECK(rel_err(a, generic) <= 2e-6);
        }
        set_isa(best_isa());
        decode_attention_ref({q.data(), n_kv * nq, d, heads.data(), n_kv, 0.125f, ref.data(), nullptr});
        INFO("bits " << bits << " head_dim " << d << " gqa " << nq);
        CHECK(rel_err(a, ref) <= 1e-5);
      }
      // A row whose norm is f16 infinity: its tile is decoded (the levels times the norm, the QJL
      // term from per-head sign tables: qjl_keys), as attention over the rows read back
      // (tq_decode_rows, dense f32) reads it: the row's score is NaN and gets weight 0 in both.
      std::vector<std::uint8_t> bad_bytes = kb[0];
      const std::uint16_t inf = 0x7C00;
      std::memcpy(bad_bytes.data() + 100 * tq_row_bytes(kt) + tq_code_bytes(kt), &inf, 2);
      std::vector<HeadView> bad = heads, bad_dense = heads;
      bad[0].key.ggml.blocks = bad_bytes.data();
      std::vector<float> bad_rows(n * d);
      tq_decode_rows(kt, bad_bytes.data(), n, bad_rows.data());
      bad_dense[0].key = TensorView{};
      bad_dense[0].key.dense = {DenseType::f32, bad_rows.data(), n};
      for (std::size_t nq : {1, 4}) {
        const std::vector<float> q = normal(n_kv * nq * d, 8);
        std::vector<float> x(q.size()), y(q.size());
        decode_attention({q.data(), n_kv * nq, d, bad.data(), n_kv, 0.125f, x.data(), nullptr}, {2, 64, 128});
        decode_attention({q.data(), n_kv * nq, d, bad_dense.data(), n_kv, 0.125f, y.data(), nullptr}, {2, 64, 128});
        INFO("non-finite norm, bits " << bits << " head_dim " << d << " gqa " << nq);
        for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::isnan(x[i]) == std::isnan(y[i]));
        CHECK(rel_err(x, y) <= 1e-5);
      }
    }
  }
}

TEST_CASE("decode attention over TurboQuant rows: the vector loops within 1e-5 of the read-back rows, AVX2 == AVX-512 "
          "bitwise; a non-finite norm decodes its tile", "[attention][ggml][turboquant]") {
  // Keys TQ<b> and TQ<b>NC, values TQV<b>, and each kind in the other tensor; the loops read the
  // codes (levels[code], or the code for value rows) and scale each row's sum by its norm
  // (times the norm correction) or scale and minimum: the same products as attention over
  // tq_decode_rows's rows in another order (within 1e-5, and not equal: the loops ran).
  const std::size_t n_kv = 2, n = 301;
  struct Pair {
    TqKind k, v;
  };
  for (const int bits : {2, 3, 4}) {
    for (const std::size_t d : {64, 128}) {
      for (const Pair kinds : {Pair{TqKind::key, TqKind::value}, Pair{TqKind::key_nc, TqKind::value},
                               Pair{TqKind::value, TqKind::key_nc}}) {
        const TqType kt{kinds.k, bits, d}, vt{kinds.v, bits, d};
        std::vector<std::vector<std::uint8_t>> kb(n_kv), vb(n_kv);
        std::vector<std::vector<float>> kf(n_kv, std::vector<float>(n * d)), vf = kf;
        std::vector<HeadView> coded(n_kv), dense(n_kv);
        for (std::size_t h = 0; h < n_kv; ++h) {
          const std::vector<float> k = normal(n * d, 90 + h), v = normal(n * d, 95 + h);
          kb[h].resize(n * tq_row_bytes(kt));
          vb[h].resize(n * tq_row_bytes(vt));
          tq_encode_rows(kt, k.data(), n, kb[h].data());
          tq_encode_rows(vt, v.data(), n, vb[h].data());
          tq_decode_rows(kt, kb[h].data(), n, kf[h].data());
          tq_decode_rows(vt, vb[h].data(), n, vf[h].data());
          coded[h].key.ggml = {tq_type_info(kt), kb[h].data(), n};
          coded[h].value.ggml = {tq_type_info(vt), vb[h].data(), n};
          dense[h].key.dense = {DenseType::f32, kf[h].data(), n};
          dense[h].value.dense = {DenseType::f32, vf[h].data(), n};
        }
        check_coded_vs_dense(coded, dense, d, 8, 1e-5, true,
                             std::string(tq_type_info(kt)->name) + "/" + tq_type_info(vt)->name);
        // A row whose norm (or scale) is f16 infinity: its tile is decoded, as the reference
        // decodes it (the same non-finite outputs, the same values elsewhere).
        std::vector<std::vector<std::uint8_t>> kbad = kb;
        const std::uint16_t inf = 0x7C00;
        std::memcpy(kbad[0].data() + 100 * tq_row_bytes(kt) + tq_code_bytes(kt), &inf, 2);
        std::vector<HeadView> bad = coded;
        bad[0].key.ggml.blocks = kbad[0].data();
        std::vector<float> kdec(n * d);
        tq_decode_rows(kt, kbad[0].data(), n, kdec.data());
        std::vector<HeadView> bad_dense = dense;
        bad_dense[0].key.dense = {DenseType::f32, kdec.data(), n};
        const std::vector<float> q = normal(n_kv * d, 9);
        std::vector<float> x(q.size()), y(q.size());
        decode_attention({q.data(), n_kv, d, bad.data(), n_kv, 0.125f, x.data(), nullptr}, {2, 64, 128});
        decode_attention({q.data(), n_kv, d, bad_dense.data(), n_kv, 0.125f, y.data(), nullptr}, {2, 64, 128});
        for (std::size_t i = 0; i < d; ++i) {
          CHECK(std::isfinite(x[i]) == std::isfinite(y[i]));
          CHECK(std::isnan(x[i]) == std::isnan(y[i]));
        }
        CHECK(rel_err(std::vector<float>(x.begin() + d, x.end()), std::vector<float>(y.begin() + d, y.end())) <= 1e-5);
      }
    }
  }
}

TEST_CASE("decode attention over fp8 rows: the vector loops within 1e-5 of the decoded rows, AVX2 == AVX-512 bitwise; "
          "an e4m3 NaN code decodes its tile", "[attention][ggml][fp8]") {
  // e4m3 and e5m2 keys and values with a scale (folded into the query and the probabilities)
  // or without; the loops read each byte through f16 exactly, so only the order of the products
  // differs from attention over fp8_decode_rows's rows.
  const std::size_t n_kv = 2, d = 64, n = 301;
  for (const char* kname : {"FP8_E4M3", "FP8_E5M2"}) {
    for (const char* vname : {"FP8_E4M3", "FP8_E5M2"}) {
      for (const float scale : {1.0f, 0.37f}) {
        const GgmlTypeInfo& kt = *ggml_type_info_by_name(kname);
        const GgmlTypeInfo& vt = *ggml_type_info_by_name(vname);
        const Fp8Format kf = *fp8_format_of(kt), vf = *fp8_format_of(vt);
        std::vector<std::vector<std::uint8_t>> kb(n_kv, std::vector<std::uint8_t>(n * d)), vb = kb;
        std::vector<std::vector<float>> kd(n_kv, std::vector<float>(n * d)), vd = kd;
        std::vector<HeadView> coded(n_kv), dense(n_kv);
        for (std::size_t h = 0; h < n_kv; ++h) {
          const std::vector<float> k = normal(n * d, 110 + h), v = normal(n * d, 115 + h);
          fp8_encode_rows(k.data(), n * d, scale, kf, kb[h].data());
          fp8_encode_rows(v.data(), n * d, scale, vf, vb[h].data());
          fp8_decode_rows(kb[h].data(), n * d, scale, kf, kd[h].data());
          fp8_decode_rows(vb[h].data(), n * d, scale, vf, vd[h].data());
          coded[h].key.ggml = {&kt, kb[h].data(), n, scale};
          coded[h].value.ggml = {&vt, vb[h].data(), n, scale};
          dense[h].key.dense = {DenseType::f32, kd[h].data(), n};
          dense[h].value.dense = {DenseType::f32, vd[h].data(), n};
        }
        check_coded_vs_dense(coded, dense, d, 10, 1e-5, scale != 1.0f,
                             std::string(kname) + "/" + vname + " scale " + std::to_string(scale));
        {  // rows their writer knows finite (GgmlRowsView::finite): no scan for NaN codes, the same outputs
          std::vector<HeadView> known = coded;
          for (HeadView& hv : known) hv.key.ggml.finite = hv.value.ggml.finite = true;
          const std::vector<float> q = normal(n_kv * 4 * d, 12);
          std::vector<float> x(q.size()), y(q.size());
          decode_attention({q.data(), n_kv * 4, d, coded.data(), n_kv, 0.125f, x.data(), nullptr}, {2, 64, 128});
          decode_attention({q.data(), n_kv * 4, d, known.data(), n_kv, 0.125f, y.data(), nullptr}, {2, 64, 128});
          CHECK(x == y);
        }
        // An e4m3 NaN code (which the loads would read as 480) in a key or a value row: its tile
        // decoded, as attention over the decoded rows reads it (a NaN score gets weight 0; a NaN
        // value makes that channel of its heads' outputs NaN).
        for (const bool key : {true, false}) {
          if ((key ? kf : vf) != Fp8Format::e4m3) continue;
          std::vector<std::uint8_t> bad_bytes = key ? kb[0] : vb[0];
          bad_bytes[100 * d + 3] = 0x7F;
          std::vector<float> bad_rows(n * d);
          fp8_decode_rows(bad_bytes.data(), n * d, scale, key ? kf : vf, bad_rows.data());
          std::vector<HeadView> bad = coded, bad_dense = dense;
          (key ? bad[0].key : bad[0].value).ggml.blocks = bad_bytes.data();
          (key ? bad_dense[0].key : bad_dense[0].value).dense.data = bad_rows.data();
          const std::vector<float> q = normal(n_kv * d, 11);
          std::vector<float> x(q.size()), y(q.size());
          decode_attention({q.data(), n_kv, d, bad.data(), n_kv, 0.125f, x.data(), nullptr}, {2, 64, 128});
          decode_attention({q.data(), n_kv, d, bad_dense.data(), n_kv, 0.125f, y.data(), nullptr}, {2, 64, 128});
          INFO((key ? "key" : "value") << " NaN code, " << kname << "/" << vname << " scale " << scale);
          for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::isnan(x[i]) == std::isnan(y[i]));
          if (key) CHECK(rel_err(x, y) <= 1e-5);
          if (!key) CHECK(std::isnan(x[3]));  // channel 3 of the first head
          if (!key) CHECK(rel_err(std::vector<float>(x.begin() + d, x.end()), std::vector<float>(y.begin() + d, y.end())) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("decode attention over ggml blocks equals it over their dequantized rows, bitwise; within 1e-5 of the reference",
          "[attention][ggml]") {
  const std::size_t n_kv = 2, d = 64, n = 301;  // 301 rows: a partial tile and a partial partition
  for (const char* kname : {"Q4_0", "Q8_0", "IQ4_NL", "Q5_1"}) {
    for (const char* vname : {"Q4_1", "Q5_0", "Q8_0"}) {
      const GgmlTypeInfo& kt = *ggml_type_info_by_name(kname);
      const GgmlTypeInfo& vt = *ggml_type_info_by_name(vname);
      std::vector<std::vector<std::uint8_t>> kb(n_kv), vb(n_kv);
      std::vector<std::vector<float>> kf(n_kv, std::vector<float>(n * d)), vf = kf;
      std::vector<HeadView> blocks(n_kv), dense(n_kv);
      for (std::size_t h = 0; h < n_kv; ++h) {
        const std::vector<float> k = normal(n * d, 30 + h), v = normal(n * d, 40 + h);
        kb[h].resize(n * d / kt.block * kt.bytes);
        vb[h].resize(n * d / vt.block * vt.bytes);
        for (std::size_t r = 0; r < n; ++r) {
          ggml_quantize(kt, k.data() + r * d, d, kb[h].data() + r * d / kt.block * kt.bytes);
          ggml_quantize(vt, v.data() + r * d, d, vb[h].data() + r * d / vt.block * vt.bytes);
        }
        ggml_dequantize(kt, kb[h].data(), n * d, kf[h].data());
        ggml_dequantize(vt, vb[h].data(), n * d, vf[h].data());
        blocks[h].key.ggml = {&kt, kb[h].data(), n};
        blocks[h].value.ggml = {&vt, vb[h].data(), n};
        dense[h].key.dense = {DenseType::f32, kf[h].data(), n};
        dense[h].value.dense = {DenseType::f32, vf[h].data(), n};
      }
      for (std::size_t nq : {1, 4}) {
        const std::vector<float> q = normal(n_kv * nq * d, 5);
        std::vector<float> a(q.size()), b(q.size()), ref(q.size());
        for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
          if (isa > best_isa()) continue;
          set_isa(isa);
          decode_attention({q.data(), n_kv * nq, d, blocks.data(), n_kv, 0.125f, a.data(), nullptr}, {2, 64, 128});
          decode_attention({q.data(), n_kv * nq, d, dense.data(), n_kv, 0.125f, b.data(), nullptr}, {2, 64, 128});
          INFO(kname << "/" << vname << " gqa " << nq << " isa " << isa_name(isa));
          CHECK(a == b);
        }
        set_isa(best_isa());
        decode_attention_ref({q.data(), n_kv * nq, d, blocks.data(), n_kv, 0.125f, ref.data(), nullptr});
        CHECK(rel_err(a, ref) <= 1e-5);
      }
    }
  }
  // llama mode: the query of ggml block keys rounded to Q8_0 first. Same output as exact attention
  // over the query rounded by ggml's reference Q8_0 quantizer (which differs only at exact ties),
  // and not the same as exact attention over the query as given.
  {
    const GgmlTypeInfo& q4 = *ggml_type_info_by_name("Q4_0");
    const GgmlTypeInfo& q8 = *ggml_type_info_by_name("Q8_0");
    std::vector<std::uint8_t> kb(n * d / 32 * q4.bytes), vb(n * d / 32 * q8.bytes), qb(d / 32 * q8.bytes);
    const std::vector<float> k = normal(n * d, 61), v = normal(n * d, 62);
    for (std::size_t r = 0; r < n; ++r) {
      ggml_quantize(q4, k.data() + r * d, d, kb.data() + r * d / 32 * q4.bytes);
      ggml_quantize(q8, v.data() + r * d, d, vb.data() + r * d / 32 * q8.bytes);
    }
    HeadView h;
    h.key.ggml = {&q4, kb.data(), n};
    h.value.ggml = {&q8, vb.data(), n};
    const std::vector<float> q = normal(4 * d, 63, 0.0, 3.0);
    std::vector<float> rounded(q.size());
    for (std::size_t i = 0; i < 4; ++i) {
      ggml_quantize(q8, q.data() + i * d, d, qb.data());
      ggml_dequantize(q8, qb.data(), d, rounded.data() + i * d);
    }
    std::vector<float> llama(q.size()), want(q.size()), plain(q.size());
    decode_attention({q.data(), 4, d, &h, 1, 0.125f, llama.data(), nullptr}, {1, 64, 4096, AttentionMode::llama});
    decode_attention({rounded.data(), 4, d, &h, 1, 0.125f, want.data(), nullptr});
    decode_attention({q.data(), 4, d, &h, 1, 0.125f, plain.data(), nullptr});
    CHECK(rel_err(llama, want) <= 1e-6);
    CHECK(rel_err(llama, plain) > 1e-5);
    HeadView f16;  // dense keys: the query stays as given
    const std::vector<std::uint16_t> kf = normal_f16(n * d, 64), vf = normal_f16(n * d, 65);
    f16.key.dense = {DenseType::f16, kf.data(), n};
    f16.value.dense = {DenseType::f16, vf.data(), n};
    decode_attention({q.data(), 4, d, &f16, 1, 0.125f, llama.data(), nullptr}, {1, 64, 4096, AttentionMode::llama});
    decode_attention({q.data(), 4, d, &f16, 1, 0.125f, plain.data(), nullptr});
    CHECK(llama == plain);
  }
  // head_dim must hold whole blocks; ggml rows stand alone.
  std::vector<std::uint8_t> raw(18 * 4);
  HeadView bad;
  bad.key.ggml = {ggml_type_info_by_name("Q4_0"), raw.data(), 1};
  bad.value.ggml = bad.key.ggml;
  std::vector<float> q(48), out(48);
  CHECK_THROWS_AS(decode_attention({q.data(), 1, 48, &bad, 1, 0.1f, out.data(), nullptr}), InvalidInput);
}

TEST_CASE("decode attention over nuq codes: the level loops within the f16 rounding of the decoded rows, AVX2 == "
          "AVX-512 bitwise; key tables per channel or per row", "[attention][nuq]") {
  const std::size_t n_kv = 2, d = 64, n = 301;
  // Keys per channel (thresholds of the rows themselves) or per row, values per row or per
  // channel; a sink row, 2-4 bits. The level loops read levels[code] x range + offset in f32,
  // which nuq_decode rounds to f16 (relative 2^-11 per value): the outputs agree within 1e-3 of
  // attention over the decoded rows. The last row is read from a padded copy (ASan checks it).
  for (int bits : {2, 3, 4}) {
    for (const bool keys_per_channel : {true, false}) {
      std::vector<NuqTable> kt(n_kv), vt(n_kv);
      std::vector<NuqRows> kr(n_kv), vr(n_kv);
      std::vector<std::vector<float>> kf(n_kv, std::vector<float>(n * d)), vf = kf;
      std::vector<HeadView> coded(n_kv), dense(n_kv);
      for (std::size_t h = 0; h < n_kv; ++h) {
        const std::vector<float> k = normal(n * d, 70 + h), v = normal(n * d, 80 + h);
        kt[h] = nuq_table(calibrate_nuq(k.data(), n, d, bits, keys_per_channel, 0.99, 1), 0.99, 1, 0,
                          keys_per_channel ? d : 0);
        vt[h] = nuq_table(calibrate_nuq(v.data(), n, d, bits, !keys_per_channel, 0.99, 1), 0.99, 1, 0,
                          keys_per_channel ? 0 : d);
        nuq_encode(kt[h], k.data(), n, d, kr[h]);
        nuq_encode(vt[h], v.data(), n, d, vr[h]);
        kr[h].codes.shrink_to_fit();
        vr[h].codes.shrink_to_fit();
        coded[h].key.nuq = kr[h].view(kt[h]);
        coded[h].value.nuq = vr[h].view(vt[h]);
        CHECK(!kr[h].outlier_value.empty());
        dequantize_rows(coded[h].key, d, 0, n, kf[h].data());
        dequantize_rows(coded[h].value, d, 0, n, vf[h].data());
        dense[h].key.dense = {DenseType::f32, kf[h].data(), n};
        dense[h].value.dense = {DenseType::f32, vf[h].data(), n};
        CHECK(coded[h].rows() == n);
      }
      const auto best = check_coded_vs_dense(coded, dense, d, 6, 1e-3, true,
                                             "bits " + std::to_string(bits) + " keys per channel " +
                                                 std::to_string(keys_per_channel));
      for (std::size_t i = 0; i < 2; ++i) {  // GQA 1 and 4: the fast path against the f64 reference
        const std::size_t nq = i == 0 ? 1 : 4;
        const std::vector<float> q = normal(n_kv * nq * d, 6);
        std::vector<float> ref(q.size());
        decode_attention_ref({q.data(), n_kv * nq, d, coded.data(), n_kv, 0.125f, ref.data(), nullptr});
        CHECK(rel_err(best[i], ref) <= 1e-3);
      }
      // A value row whose range is NaN (in the range scan's vector part, then in its tail) is
      // not read by the level loops: the tensor is decoded, that row's coded values 0
      // (nuq_decode), as the dense rows of the same decode are read.
      for (const std::size_t row : {std::size_t{100}, n - 3}) {
        if (!keys_per_channel) break;  // values per row only
        NuqRows bad = vr[0];
        bad.range[row - 1] = std::numeric_limits<float>::quiet_NaN();  // row 0 is the sink row
        std::vector<HeadView> c2 = coded, d2 = dense;
        c2[0].value.nuq = bad.view(vt[0]);
        std::vector<float> vd(n * d);
        dequantize_rows(c2[0].value, d, 0, n, vd.data());
        d2[0].key = coded[0].key;  // the same scores
        d2[0].value.dense = {DenseType::f32, vd.data(), n};
        const std::vector<float> q = normal(n_kv * 4 * d, 12);
        std::vector<float> x(q.size()), y(q.size());
        decode_attention({q.data(), n_kv * 4, d, c2.data(), n_kv, 0.125f, x.data(), nullptr}, {2, 64, 128});
        decode_attention({q.data(), n_kv * 4, d, d2.data(), n_kv, 0.125f, y.data(), nullptr}, {2, 64, 128});
        INFO("bits " << bits << " row " << row);
        CHECK(std::equal(x.begin(), x.begin() + 4 * d, y.begin()));  // KV head 0's query heads
      }
    }
  }
}
