#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/core/rng.h"
#include "akv/quant/affine.h"
#include "akv/quant/nuq.h"
#include "akv/quant/outliers.h"
#include "akv/quant/pack.h"
#include "akv/quant/rotation.h"
#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"

using namespace akv;

namespace {
std::vector<std::uint8_t> random_codes(std::size_t n, int bits, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::uint8_t> c(n);
  for (auto& v : c) v = static_cast<std::uint8_t>(r.below(1u << bits));
  return c;
}

std::vector<float> random_block(std::size_t n, std::uint64_t seed, bool outlier_channel = false,
                                std::size_t cols = 1) {
  Rng r(seed);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(r.normal());
    if (outlier_channel && i % cols == 3) x[i] = 10.0f + 3.0f * x[i];
  }
  return x;
}
}  // namespace

TEST_CASE("bit packing: hand-computed streams", "[quant][pack]") {
  std::uint8_t out[8];
  const std::uint8_t c3[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  pack_codes_ref(c3, 8, 3, out);  // 0x1F58D1 little-endian
  CHECK(out[0] == 0xD1);
  CHECK(out[1] == 0x58);
  CHECK(out[2] == 0x1F);
  const std::uint8_t c4[3] = {1, 2, 15};
  pack_codes_ref(c4, 3, 4, out);
  CHECK(out[0] == 0x21);
  CHECK(out[1] == 0x0F);
  const std::uint8_t c2[5] = {1, 2, 3, 0, 3};
  pack_codes_ref(c2, 5, 2, out);
  CHECK(out[0] == 0x39);
  CHECK(out[1] == 0x03);
  CHECK(packed_size(10, 3) == 4);
  CHECK(packed_size(8, 3) == 3);
  CHECK(packed_size(5, 2) == 2);
  CHECK(packed_size(0, 4) == 0);
}

TEST_CASE("bit packing: fast path equals reference, round trips", "[quant][pack]") {
  for (int bits : {2, 3, 4, 8}) {
    for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 100u, 1001u}) {
      auto codes = random_codes(n, bits, 1000 * static_cast<std::uint64_t>(bits) + n);
      std::vector<std::uint8_t> ref(packed_size(n, bits) + 1, 0xAA), fast = ref;
      pack_codes_ref(codes.data(), n, bits, ref.data());
      pack_codes(codes.data(), n, bits, fast.data());
      INFO("bits " << bits << " n " << n);
      CHECK(ref == fast);
      CHECK(ref.back() == 0xAA);  // nothing written past packed_size
      std::vector<std::uint8_t> back_ref(n), back_fast(n);
      unpack_codes_ref(ref.data(), n, bits, back_ref.data());
      unpack_codes(ref.data(), n, bits, back_fast.data());
      CHECK(back_ref == codes);
      CHECK(back_fast == codes);
    }
  }
  CHECK_THROWS_AS(check_bits(5, "--bits-key"), InvalidInput);
  CHECK_THROWS_WITH(check_bits(5, "--bits-key"), Catch::Contains("--bits-key = 5"));
}

TEST_CASE("group parameters bracket the range in f16", "[quant][affine]") {
  GroupParams p = group_params(0.0f, 15.0f, 4);
  CHECK(p.zero == 0.0f);
  CHECK(p.scale == 1.0f);
  p = group_params(2.5f, 2.5f, 3);  // constant group, f16-exact value
  CHECK(p.zero == 2.5f);
  CHECK(p.scale == 0.0f);
  p = group_params(-0.1f, 0.3f, 2);
  CHECK(p.zero <= -0.1f);
  CHECK(p.zero + 3 * p.scale >= 0.3f);
  CHECK(f16_to_f32_ref(f32_to_f16_ref(p.scale)) == p.scale);
  CHECK(f16_to_f32_ref(f32_to_f16_ref(p.zero)) == p.zero);
  CHECK_THROWS_AS(group_params(-1.0f, 1e6f, 4), InvalidInput);
}

TEST_CASE("quantize_block: fast path equals reference bit for bit", "[quant][affine]") {
  for (QuantRule rule : {QuantRule::kivi, QuantRule::bounded})
  for (int bits : {2, 3, 4, 8}) {
    for (QuantAxis axis : {QuantAxis::channel, QuantAxis::token}) {
      for (std::size_t rows : {1u, 31u, 32u, 33u, 100u}) {
        for (std::size_t cols : {8u, 64u, 67u}) {
          for (std::size_t group : {5u, 32u}) {
            auto x = random_block(rows * cols, rows * 131 + cols * 7 + group, true, cols);
            QuantizedBlock r = quantize_block_ref(x.data(), rows, cols, axis, bits, group, rule);
            QuantizedBlock f = quantize_block(x.data(), rows, cols, axis, bits, group, rule);
            INFO("rule " << quant_rule_name(rule) << " bits " << bits << " axis " << quant_axis_name(axis) << " rows " << rows
                         << " cols " << cols << " group " << group);
            REQUIRE(r.n_groups() == r.scale.size());
            CHECK(r.codes == f.codes);
            CHECK(r.scale == f.scale);
            CHECK(r.zero == f.zero);
            std::vector<float> dr(rows * cols), df(rows * cols);
            dequantize_block_ref(r, dr.data());
            dequantize_block(r, df.data());
            CHECK(dr == df);
          }
        }
      }
    }
  }
}

TEST_CASE("quantize_block, bounded rule: every element within scale/2 of its input", "[quant][affine]") {
  const std::size_t rows = 77, cols = 40;  // neither a multiple of the group size
  auto x = random_block(rows * cols, 5, true, cols);
  for (int bits : {2, 3, 4, 8}) {
    for (QuantAxis axis : {QuantAxis::channel, QuantAxis::token}) {
      const std::size_t group = 16;
      QuantizedBlock q = quantize_block(x.data(), rows, cols, axis, bits, group, QuantRule::bounded);
      std::vector<float> y(rows * cols);
      dequantize_block(q, y.data());
      std::size_t bad = 0;
      for (std::size_t t = 0; t < rows; ++t) {
        for (std::size_t c = 0; c < cols; ++c) {
          const std::size_t g = axis == QuantAxis::channel
                                    ? (t / group) * cols + c
                                    : t * ((cols + group - 1) / group) + c / group;
          const float scale = f16_to_f32_ref(q.scale[g]);
          const float zero = f16_to_f32_ref(q.zero[g]);
          const float x0 = x[t * cols + c];
          // scale/2 from rounding, plus f32 arithmetic: a few ulps of the group's magnitude.
          const float mag = std::fabs(zero) + static_cast<float>((1 << bits) - 1) * scale;
          const float bound = 0.5f * scale + 4 * std::numeric_limits<float>::epsilon() * mag;
          if (std::fabs(y[t * cols + c] - x0) > bound) ++bad;
        }
      }
      INFO("bits " << bits << " axis " << quant_axis_name(axis));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("quantize_block: constant f16 groups are exact; error falls with bits", "[quant][affine]") {
  for (QuantRule rule : {QuantRule::kivi, QuantRule::bounded}) {
  INFO("rule " << quant_rule_name(rule));
  std::vector<float> c(64 * 8, 1.25f);
  for (int bits : {2, 3, 4, 8}) {
    QuantizedBlock q = quantize_block(c.data(), 64, 8, QuantAxis::channel, bits, 32, rule);
    std::vector<float> y(c.size());
    dequantize_block(q, y.data());
    CHECK(y == c);
    CHECK(q.scale[0] == 0);
  }
  auto x = random_block(256 * 64, 9);
  double prev = INFINITY;
  for (int bits : {2, 3, 4, 8}) {
    QuantizedBlock q = quantize_block(x.data(), 256, 64, QuantAxis::token, bits, 32, rule);
    std::vector<float> y(x.size());
    dequantize_block(q, y.data());
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      ref += x[i] * x[i];
    }
    INFO("bits " << bits << " relative MSE " << err / ref);
    CHECK(err / ref < prev);
    prev = err / ref;
    CHECK(q.bytes() == packed_size(256 * 64, bits) + 2 * 2 * 256 * 2);
  }
  CHECK(prev < 1e-4);  // 8 bits
  }
}

TEST_CASE("quantize_block, kivi rule: a hand-computed group in fp16 arithmetic", "[quant][affine]") {
  // One channel of 4 tokens, 2 bits. In f16: 0.1 -> 0.0999755859375, 0.2 -> 0.199951171875,
  // 0.3 -> 0.300048828125, 0.7 -> 0.7001953125. zero = min = 0.0999755859375;
  // max - min = 0.6002197265625 -> f16 0.60009765625 (1229 x 2^-11); / 3 = 0.200032552...
  // -> f16 0.2000732421875 (1639 x 2^-13). Codes: (0.2 - min) = 0.0999755859375,
  // / scale = 0.49969... -> 0; (0.3 - min) = 0.2000732421875 -> 1.0 -> 1;
  // (0.7 - min) -> f16 0.60009765625, / scale = 2.99939... -> f16 3.0 -> 3.
  const std::vector<float> x = {0.1f, 0.2f, 0.3f, 0.7f};
  for (bool ref : {true, false}) {
    const QuantizedBlock q = ref ? quantize_block_ref(x.data(), 4, 1, QuantAxis::channel, 2, 4, QuantRule::kivi)
                                 : quantize_block(x.data(), 4, 1, QuantAxis::channel, 2, 4, QuantRule::kivi);
    REQUIRE(q.scale.size() == 1);
    CHECK(f16_to_f32_ref(q.zero[0]) == 0.0999755859375f);
    CHECK(f16_to_f32_ref(q.scale[0]) == 0.2000732421875f);
    std::uint8_t codes[4];
    unpack_codes_ref(q.codes.data(), 4, 2, codes);
    CHECK(std::vector<int>(codes, codes + 4) == std::vector<int>{0, 0, 1, 3});
  }
  // The bounded rule rounds the other way: zero <= min and scale covering the range.
  const QuantizedBlock b = quantize_block_ref(x.data(), 4, 1, QuantAxis::channel, 2, 4, QuantRule::bounded);
  CHECK(f16_to_f32_ref(b.zero[0]) <= 0.1f);
  CHECK(f16_to_f32_ref(b.zero[0]) + 3 * f16_to_f32_ref(b.scale[0]) >= 0.7f);
  CHECK(parse_quant_rule("kivi") == QuantRule::kivi);
  CHECK_THROWS_WITH(parse_quant_rule("exact"), Catch::Contains("quant_rule = exact"));
  CHECK_THROWS_AS(group_params_kivi(-60000.0f, 60000.0f, 2), InvalidInput);  // range overflows f16
}

TEST_CASE("quantize_block: bad arguments", "[quant][affine][bad]") {
  std::vector<float> x(64, 1.0f);
  for (QuantRule rule : {QuantRule::kivi, QuantRule::bounded}) {
    x[9] = 1.0f;
    CHECK_THROWS_AS(quantize_block(x.data(), 8, 8, QuantAxis::channel, 5, 32, rule), InvalidInput);
    CHECK_THROWS_AS(quantize_block_ref(x.data(), 8, 8, QuantAxis::channel, 1, 32, rule), InvalidInput);
    CHECK_THROWS_AS(quantize_block(x.data(), 8, 8, QuantAxis::token, 4, 0, rule), InvalidInput);
    x[9] = 1e9f;
    CHECK_THROWS_AS(quantize_block(x.data(), 8, 8, QuantAxis::token, 4, 8, rule), InvalidInput);
    CHECK_THROWS_AS(quantize_block_ref(x.data(), 8, 8, QuantAxis::token, 4, 8, rule), InvalidInput);
  }
  CHECK_THROWS_AS(parse_quant_axis("row"), InvalidInput);
}

TEST_CASE("outlier split and merge: channels out in order, inverse of each other") {
  // x [2, 5] with channels 1 and 3 as outliers.
  const std::vector<float> x = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14};
  const std::vector<std::uint16_t> channels = {1, 3};
  std::vector<float> in(2 * 3), out(2 * 2), back(x.size());
  akv::split_outliers(x.data(), 2, 5, channels, in.data(), out.data());
  CHECK(in == std::vector<float>{0, 2, 4, 10, 12, 14});
  CHECK(out == std::vector<float>{1, 3, 11, 13});
  akv::merge_outliers(in.data(), out.data(), 2, 5, channels, back.data());
  CHECK(back == x);
  CHECK(akv::outlier_count(0.0, 64) == 0);
  CHECK(akv::outlier_count(0.05, 64) == 4);  // ceil(3.2)
  CHECK(akv::outlier_count(0.0625, 32) == 2);  // exactly 2, not 3
}

TEST_CASE("rotation: hand-computed Hadamard blocks, block sizes, signs", "[quant][rotation]") {
  // H_4 [1 2 3 4] with entries +-1/2: [5, -1, -2, 0] (exact in f32).
  float x[4] = {1, 2, 3, 4};
  rotate_rows({RotationKind::hadamard, 4, 0}, x, 1, 4);
  CHECK(std::vector<float>(x, x + 4) == std::vector<float>{5, -1, -2, 0});
  unrotate_rows({RotationKind::hadamard, 4, 0}, x, 1, 4);  // H H = I
  CHECK(std::vector<float>(x, x + 4) == std::vector<float>{1, 2, 3, 4});
  // Two blocks of 2: [1 2 | 3 4] -> [3, -1, 7, -1] / sqrt(2) (within one rounding of each step).
  float y[4] = {1, 2, 3, 4};
  rotate_rows({RotationKind::hadamard, 2, 0}, y, 1, 4);
  const double want[4] = {3, -1, 7, -1};
  for (int i = 0; i < 4; ++i) CHECK(y[i] == Approx(want[i] / std::sqrt(2.0)).epsilon(1e-6));
  // llama.cpp's block sizes: keys the largest power of two dividing head_dim, values <= 64.
  CHECK(tensor_rotation(RotationKind::hadamard, 0, 128, true).block == 128);
  CHECK(tensor_rotation(RotationKind::hadamard, 0, 128, false).block == 64);
  CHECK(tensor_rotation(RotationKind::hadamard, 0, 256, true).block == 256);
  CHECK(tensor_rotation(RotationKind::hadamard, 0, 96, true).block == 32);
  CHECK(tensor_rotation(RotationKind::hadamard, 0, 8, false).block == 8);
  CHECK(!tensor_rotation(RotationKind::none, 0, 128, true).active());
  CHECK(tensor_rotation(RotationKind::hadamard, 7, 64, true).seed == 0);  // no signs, no seed
  // Random signs: deterministic per seed, about half negative, seeds differ.
  std::size_t neg = 0, differ = 0;
  for (std::size_t c = 0; c < 4096; ++c) {
    neg += rotation_sign_negative(1, c) ? 1 : 0;
    differ += rotation_sign_negative(1, c) != rotation_sign_negative(2, c) ? 1 : 0;
    CHECK(rotation_sign_negative(1, c) == rotation_sign_negative(1, c));
  }
  CHECK(neg > 1900);
  CHECK(neg < 2200);
  CHECK(differ > 1900);
  CHECK(parse_rotation("random") == RotationKind::random);
  CHECK_THROWS_AS(parse_rotation("walsh"), InvalidInput);
  float z[6] = {};
  CHECK_THROWS_AS(rotate_rows({RotationKind::hadamard, 4, 0}, z, 1, 6), InvalidInput);  // 4 does not divide 6
}

TEST_CASE("rotation: the fast transform within its bound of the explicit matrix; inverse; norms kept",
          "[quant][rotation]") {
  for (RotationKind kind : {RotationKind::hadamard, RotationKind::random}) {
    for (std::uint32_t n : {2u, 8u, 64u, 128u, 256u}) {
      const std::size_t d = 256, rows = 5;
      const Rotation r{kind, n, kind == RotationKind::random ? 11u : 0u};
      std::vector<float> x = random_block(rows * d, 40 + n, true, d);
      for (bool inverse : {false, true}) {
        std::vector<float> fast = x, ref = x;
        if (inverse) {
          unrotate_rows(r, fast.data(), rows, d);
        } else {
          rotate_rows(r, fast.data(), rows, d);
        }
        rotate_rows_ref(r, ref.data(), rows, d, inverse);
        for (std::size_t i = 0; i < rows; ++i) {
          double m = 0, nx = 0, nf = 0;
          for (std::size_t c = 0; c < d; ++c) {
            m = std::max(m, std::fabs(static_cast<double>(x[i * d + c])));
            nx += static_cast<double>(x[i * d + c]) * x[i * d + c];
            nf += static_cast<double>(fast[i * d + c]) * fast[i * d + c];
          }
          const double bound = 2.0 * std::log2(n) * std::sqrt(n) * 0x1p-24 * m + 0x1p-24 * m;
          double worst = 0;
          for (std::size_t c = 0; c < d; ++c) worst = std::max(worst, std::fabs(static_cast<double>(fast[i * d + c]) - ref[i * d + c]));
          INFO("kind " << rotation_name(kind) << " n " << n << " inverse " << inverse);
          CHECK(worst <= bound);
          CHECK(std::fabs(std::sqrt(nf) - std::sqrt(nx)) <= 1e-5 * std::sqrt(nx));  // orthonormal
        }
        std::vector<float> back = fast;
        if (inverse) {
          rotate_rows(r, back.data(), rows, d);
        } else {
          unrotate_rows(r, back.data(), rows, d);
        }
        for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(back[i] - x[i]) <= 1e-5f * (1.0f + std::fabs(x[i])));
      }
    }
  }
}

TEST_CASE("rotation spreads an outlier channel: per-token 4-bit error falls", "[quant][rotation]") {
  // Rows with one channel ~20x the others: per-token groups spend their range on it. The
  // rotated rows' quantization error (measured after rotating back) must be clearly lower.
  const std::size_t n = 64, d = 128;
  const std::vector<float> x = random_block(n * d, 5, true, d);
  auto error = [&](const Rotation& r) {
    std::vector<float> y = x, back(n * d);
    rotate_rows(r, y.data(), n, d);
    dequantize_block(quantize_block(y.data(), n, d, QuantAxis::token, 4, 32, QuantRule::kivi), back.data());
    unrotate_rows(r, back.data(), n, d);
    double e = 0, s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      e += (back[i] - x[i]) * (back[i] - x[i]);
      s += x[i] * x[i];
    }
    return e / s;
  };
  const double plain = error({}), rotated = error(tensor_rotation(RotationKind::hadamard, 0, d, true));
  INFO("plain " << plain << " rotated " << rotated);
  CHECK(rotated < plain / 1.5);  // measured 1.8x lower
}

TEST_CASE("rotation: bit for bit ggml's CPU Walsh-Hadamard kernel (llama.cpp's KV rotation)", "[quant][rotation][golden]") {
  // data/golden/ggml-fwht.json: rows rotated by ggml_compute_forward_fwht (llama.cpp de3ff81), by
  // scripts/dev/golden/ggml_fwht.py.
  std::ifstream f(std::string(AKV_SOURCE_DIR) + "/data/golden/ggml-fwht.json");
  REQUIRE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);
  REQUIRE(doc.at("cases").size() == 2);
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::size_t n = c.at("block").get<std::size_t>(), rows = c.at("rows").get<std::size_t>();
    const auto x_bits = c.at("x_bits").get<std::vector<std::uint32_t>>();
    const auto y_bits = c.at("y_bits").get<std::vector<std::uint32_t>>();
    REQUIRE(x_bits.size() == n * rows);
    std::vector<float> x(n * rows);
    std::memcpy(x.data(), x_bits.data(), x.size() * sizeof(float));
    rotate_rows({RotationKind::hadamard, static_cast<std::uint32_t>(n), 0}, x.data(), rows, n);
    std::vector<std::uint32_t> got(x.size());
    std::memcpy(got.data(), x.data(), x.size() * sizeof(float));
    INFO("block " << n);
    CHECK(got == y_bits);
  }
}

namespace {
std::vector<float> hex_floats(const nlohmann::json& a) {
  std::vector<float> out;
  for (const auto& h : a) {
    const auto bits = static_cast<std::uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16));
    float x;
    std::memcpy(&x, &bits, 4);
    out.push_back(x);
  }
  return out;
}
std::vector<float> hex_f16s(const nlohmann::json& a) {
  std::vector<float> out;
  for (const auto& h : a) out.push_back(f16_to_f32_ref(static_cast<std::uint16_t>(std::stoul(h.get<std::string>(), nullptr, 16))));
  return out;
}
}  // namespace

TEST_CASE("turboquant: row bytes of vLLM's presets; hand-packed 3-bit indices; value rows", "[quant][turboquant]") {
  // vLLM's tests/quantization/test_turboquant.py PRESET_EXPECTED at head_dim 128: keys 66 (4-bit),
  // 50 (3-bit); values 68 (4-bit), 52 (3-bit).
  CHECK(tq_row_bytes({TqKind::key_nc, 4, 128}) == 66);
  CHECK(tq_row_bytes({TqKind::key_nc, 3, 128}) == 50);
  CHECK(tq_row_bytes({TqKind::value, 4, 128}) == 68);
  CHECK(tq_row_bytes({TqKind::value, 3, 128}) == 52);
  CHECK(tq_type_info({TqKind::key, 3, 96}) == nullptr);  // not a power of two
  const GgmlTypeInfo* t = tq_type_info({TqKind::value, 3, 8});
  REQUIRE(t);
  CHECK(std::string(t->name) == "TQV3_8");
  CHECK(tq_type_of(*t)->bits == 3);
  CHECK(ggml_type_info_by_name("TQV3_8") == t);
  // Values 0..7 in 3 bits: q = trunc((x - 0) / 1 + 0.5); codes 0..7 pack to 0x88 0xc6 0xfa (index i
  // at bits 3i..3i+2), then f16 scale 1 (0x3c00) and min 0.
  const float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  std::uint8_t row[7];
  tq_encode_rows({TqKind::value, 3, 8}, x, 1, row);
  const std::uint8_t want[7] = {0x88, 0xc6, 0xfa, 0x00, 0x3c, 0x00, 0x00};
  CHECK(std::memcmp(row, want, 7) == 0);
  float back[8];
  tq_decode_rows({TqKind::value, 3, 8}, row, 1, back);
  CHECK(std::memcmp(back, x, sizeof x) == 0);
}

TEST_CASE("turboquant: the vector read-back equals the plain loops bit for bit", "[quant][turboquant]") {
  for (const TqKind kind : {TqKind::key, TqKind::key_nc, TqKind::value}) {
    for (const int bits : {2, 3, 4}) {
      for (const std::size_t d : {8, 64, 128}) {
        const TqType t{kind, bits, d};
        const std::size_t n = 5;
        const std::vector<float> x = random_block(n * d, 40 + static_cast<std::uint64_t>(bits) + d, true, d);
        std::vector<std::uint8_t> stored(n * tq_row_bytes(t));
        tq_encode_rows(t, x.data(), n, stored.data());
        std::vector<float> plain(n * d), vec(n * d);
        set_isa(Isa::generic);
        tq_decode_rows(t, stored.data(), n, plain.data());
        set_isa(best_isa());
        tq_decode_rows(t, stored.data(), n, vec.data());
        INFO("kind " << static_cast<int>(kind) << " bits " << bits << " head_dim " << d << " isa " << isa_name(best_isa()));
        CHECK(std::memcmp(plain.data(), vec.data(), plain.size() * sizeof(float)) == 0);
      }
    }
  }
}

namespace {
// A key_qjl row's fields: level index i, sign bit j, f16 gamma.
std::uint32_t qjl_index(const TqType& t, const std::uint8_t* row, std::size_t i) {
  const auto b = static_cast<std::size_t>(t.bits - 1);
  std::uint32_t v = 0;
  for (std::size_t k = 0; k < b; ++k) v |= ((row[(i * b + k) / 8] >> ((i * b + k) % 8)) & 1u) << k;
  return v;
}
bool qjl_sign(const TqType& t, const std::uint8_t* row, std::size_t j) {
  const std::size_t at = (t.head_dim * static_cast<std::size_t>(t.bits - 1) + 7) / 8 + 2;
  return (row[at + j / 8] >> (j % 8)) & 1u;
}
float qjl_gamma(const TqType& t, const std::uint8_t* row) {
  std::uint16_t h;
  std::memcpy(&h, row + tq_row_bytes(t) - 2, 2);
  return f16_to_f32_ref(h);
}
}  // namespace

TEST_CASE("turboquant qjl: row layout, names, and the read-back by brute force", "[quant][turboquant][qjl]") {
  // (b - 1) bits of levels + f16 norm + head_dim sign bits + f16 gamma: 3 bits at 128: 32 + 2 + 16 + 2.
  CHECK(tq_row_bytes({TqKind::key_qjl, 3, 128}) == 52);
  CHECK(tq_row_bytes({TqKind::key_qjl, 2, 64}) == 8 + 2 + 8 + 2);
  const GgmlTypeInfo* info = tq_type_info({TqKind::key_qjl, 4, 64});
  REQUIRE(info);
  CHECK(std::string(info->name) == "TQ4J_64");
  CHECK(tq_type_of(*info)->kind == TqKind::key_qjl);
  CHECK(tq_codebook(64, 1).centroids.size() == 2);  // the 1-bit levels of tq2j
  for (const int bits : {2, 3, 4}) {
    for (const std::size_t d : {8, 64, 128}) {
      const TqType t{TqKind::key_qjl, bits, d};
      const std::size_t n = 4;
      const std::vector<float> x = random_block(n * d, 70 + static_cast<std::uint64_t>(bits) + d, true, d);
      std::vector<std::uint8_t> stored(n * tq_row_bytes(t));
      tq_encode_rows(t, x.data(), n, stored.data());
      std::vector<float> back(n * d);
      tq_decode_rows(t, stored.data(), n, back.data());
      const std::vector<float>& S = tq_qjl_matrix(d);
      const TqCodebook& cb = tq_codebook(d, bits - 1);
      INFO("bits " << bits << " head_dim " << d);
      for (std::size_t r = 0; r < n; ++r) {
        const std::uint8_t* row = stored.data() + r * tq_row_bytes(t);
        std::uint16_t h;
        std::memcpy(&h, row + (d * static_cast<std::size_t>(bits - 1) + 7) / 8, 2);
        const double norm = f16_to_f32_ref(h), gamma = qjl_gamma(t, row);
        // Independently in double: x_mse, the residual's norm and signs, and the read-back.
        std::vector<double> xm(d), res(d);
        double rr = 0;
        for (std::size_t i = 0; i < d; ++i) {
          xm[i] = norm * cb.centroids[qjl_index(t, row, i)];
          res[i] = x[r * d + i] - xm[i];
          rr += res[i] * res[i];
        }
        CHECK(std::fabs(gamma - std::sqrt(rr)) <= 1e-3 * std::sqrt(rr) + 1e-7);
        for (std::size_t j = 0; j < d; ++j) {
          double p = 0, back_j = 0;
          for (std::size_t i = 0; i < d; ++i) p += S[j * d + i] * res[i];
          if (std::fabs(p) > 1e-4 * std::sqrt(rr * d)) CHECK(qjl_sign(t, row, j) == (p >= 0));
          for (std::size_t k = 0; k < d; ++k) back_j += S[k * d + j] * (qjl_sign(t, row, k) ? 1.0 : -1.0);
          back_j = xm[j] + std::sqrt(3.141592653589793 / 2) / static_cast<double>(d) * gamma * back_j;
          CHECK(std::fabs(back[r * d + j] - back_j) <= 1e-5 * (1.0 + std::fabs(back_j)));
        }
      }
    }
  }
  // A non-finite gamma is found as the norm is.
  const TqType t{TqKind::key_qjl, 3, 8};
  std::vector<std::uint8_t> two(2 * tq_row_bytes(t));
  const std::vector<float> x = random_block(16, 3);
  tq_encode_rows(t, x.data(), 2, two.data());
  CHECK(tq_first_nonfinite(t, two.data(), 16) == 16);
  const std::uint16_t inf = 0x7c00;
  std::memcpy(two.data() + 2 * tq_row_bytes(t) - 2, &inf, 2);
  CHECK(tq_first_nonfinite(t, two.data(), 16) == 8);
  const std::uint16_t nan = 0xfe01, big = 0x7bff;  // a negative NaN; the largest finite f16
  std::memcpy(two.data() + tq_code_bytes(t), &nan, 2);
  CHECK(tq_first_nonfinite(t, two.data(), 16) == 0);
  std::memcpy(two.data() + tq_code_bytes(t), &big, 2);
  std::memcpy(two.data() + 2 * tq_row_bytes(t) - 2, &big, 2);
  CHECK(tq_first_nonfinite(t, two.data(), 16) == 16);
}

TEST_CASE("turboquant qjl: the vector projection encodes the plain loop's signs, bit for bit", "[quant][turboquant][qjl]") {
  // S r as 8 (head_dim 8, 16, 32) or 64 outputs in registers (AVX2) against the plain loop (generic):
  // the same products and sums, so the same sign bits and bytes.
  for (const int bits : {2, 4}) {
    for (const std::size_t d : {8, 16, 32, 64, 128, 256}) {
      const TqType t{TqKind::key_qjl, bits, d};
      const std::size_t n = 7;
      const std::vector<float> x = random_block(n * d, 130 + static_cast<std::uint64_t>(bits) + d, true, d);
      std::vector<std::uint8_t> plain(n * tq_row_bytes(t)), vec(plain.size());
      set_isa(Isa::generic);
      tq_encode_rows(t, x.data(), n, plain.data());
      set_isa(best_isa());
      tq_encode_rows(t, x.data(), n, vec.data());
      INFO("bits " << bits << " head_dim " << d << " isa " << isa_name(best_isa()));
      CHECK(plain == vec);
    }
  }
}

TEST_CASE("turboquant qjl: levels read back by the vector loops equal the plain loop's; sign tables give q . row",
          "[quant][turboquant][qjl]") {
  for (const int bits : {2, 3, 4}) {
    for (const std::size_t d : {8, 64, 128}) {
      const TqType t{TqKind::key_qjl, bits, d};
      const std::size_t n = 5;
      const std::vector<float> x = random_block(n * d, 90 + static_cast<std::uint64_t>(bits) + d, true, d);
      std::vector<std::uint8_t> stored(n * tq_row_bytes(t));
      tq_encode_rows(t, x.data(), n, stored.data());
      std::vector<float> plain(n * d), vec(n * d), back(n * d);
      set_isa(Isa::generic);
      tq_qjl_decode_levels(t, stored.data(), n, plain.data());
      set_isa(best_isa());
      tq_qjl_decode_levels(t, stored.data(), n, vec.data());
      INFO("bits " << bits << " head_dim " << d);
      CHECK(std::memcmp(plain.data(), vec.data(), plain.size() * sizeof(float)) == 0);
      // x_mse plus the QJL term from the sign tables = q . (the row read back), to f32 rounding.
      tq_decode_rows(t, stored.data(), n, back.data());
      const std::vector<float> q = random_block(2 * d, 7);
      const TqQjlQuery qs[2] = {tq_qjl_query(t, q.data()), tq_qjl_query(t, q.data() + d)};
      // S q: each sum over i in order, a product then an add (the plain loop's bits at any width).
      const std::vector<float>& S = tq_qjl_matrix(d);
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t j = 0; j < d; ++j) {
          float a = 0.0f;
          for (std::size_t i = 0; i < d; ++i) {
            volatile float term = S[j * d + i] * q[h * d + i];  // not fused into the sum (turboquant.cpp: -ffp-contract=off)
            a += term;
          }
          CHECK(qs[h].sq[j] == a);
        }
      }
      std::vector<float> s(2 * n, 0.0f);
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < d; ++i) s[h * n + r] += q[h * d + i] * vec[r * d + i];
        }
      }
      tq_qjl_add_scores(t, qs, 2, stored.data(), n, s.data(), n);
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t r = 0; r < n; ++r) {
          double want = 0, mag = 0;
          for (std::size_t i = 0; i < d; ++i) {
            want += static_cast<double>(q[h * d + i]) * back[r * d + i];
            mag += std::fabs(static_cast<double>(q[h * d + i]) * back[r * d + i]);
          }
          CHECK(std::fabs(s[h * n + r] - want) <= 1e-5 * mag);
        }
      }
    }
  }
}

TEST_CASE("turboquant qjl: the inner-product estimate is unbiased over random projections", "[quant][turboquant][qjl]") {
  // E_S[<q, x^>] = <q, x> (TurboQuant's Theorem 2): the mean over 3000 Gaussian S of the estimate
  // lies within 4 standard errors of the exact product, while x_mse's own product is biased by
  // more than that. A wrong scale (sqrt(pi/2) / d) or sign convention fails it.
  const std::size_t d = 64;
  const TqType t{TqKind::key_qjl, 2, d};
  const std::vector<float> x = random_block(d, 11), q = random_block(d, 12);
  double exact = 0;
  for (std::size_t i = 0; i < d; ++i) exact += static_cast<double>(q[i]) * x[i];
  Rng rng(99);
  std::vector<float> S(d * d), back(d);
  std::vector<std::uint8_t> row(tq_row_bytes(t));
  double sum = 0, sum2 = 0, mse_dot = 0;
  const int trials = 3000;
  for (int k = 0; k < trials; ++k) {
    for (float& v : S) v = static_cast<float>(rng.normal());
    tq_qjl_encode_rows(t, S.data(), x.data(), 1, row.data());
    tq_qjl_decode_rows(t, S.data(), row.data(), 1, back.data());
    double e = 0;
    for (std::size_t i = 0; i < d; ++i) e += static_cast<double>(q[i]) * back[i];
    sum += e;
    sum2 += e * e;
    if (k == 0) {
      std::vector<float> mse(d);
      tq_decode_rows({TqKind::key, 1, d}, row.data(), 1, mse.data());  // the same levels and norm
      for (std::size_t i = 0; i < d; ++i) mse_dot += static_cast<double>(q[i]) * mse[i];
    }
  }
  const double mean = sum / trials, se = std::sqrt((sum2 / trials - mean * mean) / trials);
  INFO("exact " << exact << " mean " << mean << " se " << se << " x_mse " << mse_dot);
  CHECK(std::fabs(mean - exact) < 4 * se);
  CHECK(std::fabs(mse_dot - exact) > 4 * se);
}

TEST_CASE("turboquant qjl: indices, signs, residual norms and scores as turboquant-pytorch's", "[quant][turboquant][qjl][golden]") {
  // data/golden/turboquant-qjl.json: turboquant-pytorch's TurboQuantCompressorV2 run unmodified
  // (levels: vLLM's solve_lloyd_max), given to akv as rows x Pi^T with projection S Pi^T
  // (scripts/dev/golden/turboquant_qjl.py). akv reads |x| back as f16 before the residual (what it
  // stores), the reference uses the f32 norm and scores with its x_mse rounded to f16: an index may
  // differ only within 1e-5 of a midpoint, a sign only where the projection is within 1e-3 of |r|
  // |S_j| of zero, gamma by two f16 steps, a score by 2e-3 |q| |x|. A coordinate exactly on a
  // midpoint takes the upper level in akv (vLLM's count of midpoints <= y), the lower in the
  // reference's argmin (the zero row: every y = 0).
  std::ifstream f(std::string(AKV_SOURCE_DIR) + "/data/golden/turboquant-qjl.json");
  REQUIRE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);
  REQUIRE(doc.at("cases").size() == 4);
  std::size_t near_ties = 0, near_zero = 0;
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::size_t d = c.at("head_dim").get<std::size_t>(), n = c.at("rows").get<std::size_t>();
    const std::size_t nq = c.at("queries").get<std::size_t>();
    const TqType t{TqKind::key_qjl, c.at("bits").get<int>(), d};
    INFO("head_dim " << d << " bits " << t.bits);
    const std::vector<float> x = hex_floats(c.at("x")), x_rot = hex_floats(c.at("x_rot")), S = hex_floats(c.at("s_rot"));
    const std::vector<float> q = hex_floats(c.at("q")), q_rot = hex_floats(c.at("q_rot")), y = hex_floats(c.at("y"));
    const std::vector<float> proj = hex_floats(c.at("projected")), gamma = hex_f16s(c.at("residual_norm_f16"));
    const std::vector<float> scores = hex_floats(c.at("scores"));
    const auto index = c.at("index").get<std::vector<std::uint32_t>>();
    const auto signs = c.at("signs").get<std::vector<int>>();
    std::vector<std::uint8_t> stored(n * tq_row_bytes(t));
    tq_qjl_encode_rows(t, S.data(), x_rot.data(), n, stored.data());
    std::vector<float> back(n * d);
    tq_qjl_decode_rows(t, S.data(), stored.data(), n, back.data());
    const TqCodebook& cb = tq_codebook(d, t.bits - 1);
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint8_t* row = stored.data() + r * tq_row_bytes(t);
      for (std::size_t i = 0; i < d; ++i) {
        if (qjl_index(t, row, i) == index[r * d + i]) continue;
        float gap = 1.0f;
        for (float m : cb.midpoints) gap = std::min(gap, std::fabs(y[r * d + i] - m));
        CHECK(gap < 1e-5f);
        if (gap > 0.0f) ++near_ties;  // exact ties (the zero row's y = 0 on the middle midpoint) go up in akv
      }
      const float g = qjl_gamma(t, row);
      CHECK(std::fabs(g - gamma[r]) <= std::ldexp(std::fabs(gamma[r]), -9));
      for (std::size_t j = 0; j < d; ++j) {
        if (qjl_sign(t, row, j) == (signs[r * d + j] > 0)) continue;
        double sn = 0;
        for (std::size_t i = 0; i < d; ++i) sn += static_cast<double>(S[j * d + i]) * S[j * d + i];
        CHECK(std::fabs(proj[r * d + j]) <= 1e-3 * gamma[r] * std::sqrt(sn));
        ++near_zero;
      }
      double xn = 0;
      for (std::size_t i = 0; i < d; ++i) xn += static_cast<double>(x[r * d + i]) * x[r * d + i];
      for (std::size_t h = 0; h < nq; ++h) {
        double s = 0, qn = 0;
        for (std::size_t i = 0; i < d; ++i) {
          s += static_cast<double>(q_rot[h * d + i]) * back[r * d + i];
          qn += static_cast<double>(q[h * d + i]) * q[h * d + i];
        }
        CHECK(std::fabs(s - scores[h * n + r]) <= 2e-3 * std::sqrt(qn * xn) + 1e-6);
      }
    }
  }
  CHECK(near_ties == 0);
  CHECK(near_zero == 0);
}

TEST_CASE("turboquant: codebooks, indices, norms and rows read back as vLLM's", "[quant][turboquant][golden]") {
  // data/golden/turboquant-vllm.json: vLLM's solve_lloyd_max run unmodified; its Triton store and
  // decode arithmetic transcribed in torch (scripts/dev/golden/turboquant.py).
  std::ifstream f(std::string(AKV_SOURCE_DIR) + "/data/golden/turboquant-vllm.json");
  REQUIRE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);
  REQUIRE(doc.at("codebooks").size() == 9);
  for (const nlohmann::json& c : doc.at("codebooks")) {
    const TqCodebook& cb = tq_codebook(c.at("head_dim").get<std::size_t>(), c.at("bits").get<int>());
    INFO("head_dim " << c.at("head_dim") << " bits " << c.at("bits"));
    CHECK(cb.centroids == hex_floats(c.at("centroids")));  // bit for bit
  }
  REQUIRE(doc.at("cases").size() == 5);
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::size_t d = c.at("head_dim").get<std::size_t>(), n = c.at("rows").get<std::size_t>();
    const int kb = c.at("bits_key").get<int>(), vb = c.at("bits_value").get<int>();
    const TqType kt{c.at("norm_correction").get<bool>() ? TqKind::key_nc : TqKind::key, kb, d};
    const TqType vt{TqKind::value, vb, d};
    INFO("head_dim " << d << " key bits " << kb << " value bits " << vb);
    const std::vector<float> keys = hex_floats(c.at("keys")), values = hex_floats(c.at("values"));
    const std::vector<float> y = hex_floats(c.at("y")), keys_read = hex_floats(c.at("keys_read"));
    const auto index = c.at("key_index").get<std::vector<std::uint32_t>>();
    const std::vector<float> norms = hex_f16s(c.at("key_norm_f16"));
    // akv rotates first (the cache's Hadamard), then the type normalizes: vLLM normalizes, then
    // rotates. The same up to f32 rounding: an index may differ only where y lies within 1e-5 of a
    // midpoint, a norm by one f16 step, a key read back by 1e-5 of the row's norm.
    std::vector<float> rk = keys;
    const Rotation rot{RotationKind::hadamard, static_cast<std::uint32_t>(d), 0};
    rotate_rows(rot, rk.data(), n, d);
    std::vector<std::uint8_t> stored(n * tq_row_bytes(kt));
    tq_encode_rows(kt, rk.data(), n, stored.data());
    std::vector<float> back(n * d);
    tq_decode_rows(kt, stored.data(), n, back.data());
    unrotate_rows(rot, back.data(), n, d);
    const TqCodebook& cb = tq_codebook(d, kb);
    std::size_t near_ties = 0;
    for (std::size_t r = 0; r < n; ++r) {
      std::uint16_t h;
      std::memcpy(&h, stored.data() + r * tq_row_bytes(kt) + (d * static_cast<std::size_t>(kb) + 7) / 8, 2);
      const float norm = f16_to_f32_ref(h);
      CHECK(std::fabs(norm - norms[r]) <= std::ldexp(std::fabs(norms[r]), -10));
      bool exact = true;
      for (std::size_t i = 0; i < d; ++i) {
        const std::size_t bit = i * static_cast<std::size_t>(kb);
        std::uint32_t v = stored[r * tq_row_bytes(kt) + bit / 8];
        if (bit % 8 + static_cast<std::size_t>(kb) > 8) v |= static_cast<std::uint32_t>(stored[r * tq_row_bytes(kt) + bit / 8 + 1]) << 8;
        const std::uint32_t idx = (v >> (bit % 8)) & ((1u << kb) - 1u);
        if (idx != index[r * d + i]) {
          float gap = 1.0f;
          for (float m : cb.midpoints) gap = std::min(gap, std::fabs(y[r * d + i] - m));
          CHECK(gap < 1e-5f);
          ++near_ties;
          exact = false;
        }
      }
      if (!exact || norm != norms[r]) continue;
      for (std::size_t i = 0; i < d; ++i) {
        CHECK(std::fabs(back[r * d + i] - keys_read[r * d + i]) <= 1e-5f * std::max(norms[r], 1e-3f));
      }
    }
    CHECK(near_ties <= 2);
    // Values: the same f32 operations in the same order: bit for bit.
    std::vector<std::uint8_t> vs(n * tq_row_bytes(vt));
    tq_encode_rows(vt, values.data(), n, vs.data());
    std::vector<float> vback(n * d);
    tq_decode_rows(vt, vs.data(), n, vback.data());
    CHECK(vback == hex_floats(c.at("values_read")));
  }
}

TEST_CASE("nuq: numpy's linear percentile", "[quant][nuq]") {
  const double x[] = {1.0, 2.0, 4.0, 8.0};
  CHECK(percentile_sorted(x, 4, 50.0) == 3.0);     // index 1.5: 2 + (4 - 2) 0.5
  CHECK(percentile_sorted(x, 4, 0.0) == 1.0);
  CHECK(percentile_sorted(x, 4, 100.0) == 8.0);
  CHECK(percentile_sorted(x, 4, 90.0) == 8.0 - 4.0 * (1.0 - (3 * 0.9 - 2)));  // t >= 0.5: from above
  CHECK(percentile_sorted(x, 4, 10.0) == 1.0 + 1.0 * (3 * 0.1));              // t < 0.5: from below
  const double one[] = {5.0};
  CHECK(percentile_sorted(one, 1, 99.5) == 5.0);
}

TEST_CASE("nuq: the nearest level, branch-free count against the binary search and by hand", "[quant][nuq]") {
  const std::vector<float> four = {-1.0f, -0.25f, 0.25f, 1.0f};
  const NuqNearest near4(four);
  CHECK(near4(0.0f) == 1);     // a tie between -0.25 and 0.25: the lower
  CHECK(near4(0.3f) == 2);
  CHECK(near4(-5.0f) == 0);    // below every level
  CHECK(near4(5.0f) == 3);     // above every level
  CHECK(near4(1.0f) == 3);     // on the top level
  CHECK(near4(std::numeric_limits<float>::infinity()) == 0);  // not finite: 0
  CHECK(near4(std::nanf("")) == 0);
  Rng r(11);
  for (int bits : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> levels(std::size_t{1} << bits);
      for (auto& l : levels) l = static_cast<float>(r.normal());
      if (trial % 2) levels[levels.size() / 2] = levels[0];             // repeated levels
      if (trial % 4 == 3) levels.back() = levels[levels.size() - 2];  // repeated at the top
      std::sort(levels.begin(), levels.end());
      const NuqNearest near(levels);
      std::vector<float> ys = {0.0f, -0.0f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::nanf("")};
      for (std::size_t k = 0; k < levels.size(); ++k) {
        ys.push_back(levels[k]);
        ys.push_back(std::nextafter(levels[k], 1e30f));
        ys.push_back(std::nextafter(levels[k], -1e30f));
        if (k + 1 < levels.size()) ys.push_back((levels[k] + levels[k + 1]) / 2.0f);  // ties
      }
      for (int i = 0; i < 2000; ++i) ys.push_back(static_cast<float>(r.normal() * 1.5));
      std::vector<std::uint8_t> row(ys.size());  // the row form: chunks of vectors, then a tail
      near.codes(ys.data(), ys.size(), row.data());
      for (std::size_t i = 0; i < ys.size(); ++i) {
        INFO("bits " << bits << ", y " << ys[i]);
        REQUIRE(near(ys[i]) == nuq_nearest_ref(levels, ys[i]));
        REQUIRE(row[i] == nuq_nearest_ref(levels, ys[i]));
      }
    }
  }
}

TEST_CASE("nuq: k-means cost equals the plain sum of each value's least squared distance, bit for bit", "[quant][nuq]") {
  // kmeans_1d_cost takes the minima a block of values at a time, level by level: a minimum is the
  // same in any order and the sum keeps the values' order, so the bits are the plain loop's.
  Rng r(37);
  for (const std::size_t n : {1, 255, 256, 257, 1000}) {
    std::vector<double> x(n), w(n), levels(1 + r.below(16));
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = r.normal();
      w[i] = r.uniform(0.1, 2.0);
    }
    for (double& l : levels) l = r.normal();
    for (const bool weighted : {false, true}) {
      double plain = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double best = INFINITY;
        for (const double c : levels) best = std::min(best, (x[i] - c) * (x[i] - c));
        volatile double term = (weighted ? w[i] : 1.0) * best;  // not fused into the sum (nuq.cpp: -ffp-contract=off)
        plain += term;
      }
      const double cost = kmeans_1d_cost(x, weighted ? w : std::vector<double>{}, levels);
      INFO("n " << n << (weighted ? " weighted" : ""));
      CHECK(std::memcmp(&cost, &plain, sizeof cost) == 0);
    }
  }
}

TEST_CASE("nuq: 1-D k-means, fast path against the plain rounds and against brute force", "[quant][nuq]") {
  Rng r(5);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t n = 50 + r.below(3000), k = std::size_t{1} << (1 + r.below(4));
    std::vector<double> x(n), w;
    for (auto& v : x) v = r.normal() * (trial % 2 ? 1.0 : 0.3) + (r.uniform() < 0.3 ? 2.0 : 0.0);
    if (trial % 3 == 0) {
      for (std::size_t i = 0; i < n; ++i) w.push_back(r.uniform(0.1, 3.0));
    }
    const std::vector<double> fast = kmeans_1d(x, w, k), ref = kmeans_1d_ref(x, w, k);
    REQUIRE(fast.size() == k);
    REQUIRE(std::is_sorted(fast.begin(), fast.end()));
    for (std::size_t j = 0; j < k; ++j) CHECK(fast[j] == Approx(ref[j]).margin(1e-9));
    // One round from each seeding: the fast path's searched seeds are the plain walk's.
    const std::vector<double> fast1 = kmeans_1d(x, w, k, 1), ref1 = kmeans_1d_ref(x, w, k, 1);
    for (std::size_t j = 0; j < k; ++j) CHECK(fast1[j] == Approx(ref1[j]).margin(1e-9));
    // Lloyd's fixed point: every level is its cluster's weighted mean.
    for (std::size_t j = 0; j < k; ++j) {
      double sw = 0, swx = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto best = std::min_element(fast.begin(), fast.end(), [&](double a, double b) {
          return std::fabs(x[i] - a) < std::fabs(x[i] - b);
        });
        if (static_cast<std::size_t>(best - fast.begin()) != j) continue;
        const double wi = w.empty() ? 1.0 : w[i];
        sw += wi;
        swx += wi * x[i];
      }
      if (sw > 0) CHECK(fast[j] == Approx(swx / sw).margin(1e-9));
    }
  }
  // Lloyd's rounds never raise the cost (a local optimum, as scikit-learn's KMeans finds; the 1-D
  // optimum is not guaranteed). Quantile seeds of {-2, -1.9, 0, 0.1, 0.2, 3} stop at {-1.95, 0.825},
  // cost 6.33; the evenly spaced seeding reaches {-0.72, 3}, cost 5.07, and the better one is kept.
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> x(2 + r.below(40));
    for (auto& v : x) v = r.normal();
    const std::size_t k = 2 + r.below(3);
    const double one = kmeans_1d_cost(x, {}, kmeans_1d(x, {}, k, 1));
    const double two = kmeans_1d_cost(x, {}, kmeans_1d(x, {}, k, 2));
    const double all = kmeans_1d_cost(x, {}, kmeans_1d(x, {}, k));
    CHECK(two <= one * (1 + 1e-12) + 1e-15);
    CHECK(all <= two * (1 + 1e-12) + 1e-15);
  }
  const std::vector<double> stuck = {-2.0, -1.9, 0.0, 0.1, 0.2, 3.0};
  const std::vector<double> c = kmeans_1d(stuck, {}, 2);
  CHECK(c[0] == Approx(-0.72));
  CHECK(c[1] == Approx(3.0));
  CHECK(kmeans_1d_cost(stuck, {}, c) == Approx(5.068));
  CHECK(kmeans_1d_cost(stuck, {}, {-1.95, 0.825}) == Approx(6.3325));
  CHECK(kmeans_1d({3.0, 3.0, 3.0}, {}, 4) == std::vector<double>{3.0, 3.0, 3.0, 3.0});
  CHECK_THROWS_AS(kmeans_1d({}, {}, 2), InvalidInput);
}

TEST_CASE("nuq: quantization by hand (keys per channel, values per token, outliers, sink)", "[quant][nuq]") {
  // Keys: thresholds [-1, 1] and [0, 4] (offset 0 / 2, range 1 / 2); levels -0.5, 0.5, 2, 3.
  NuqCalibration k;
  k.bits = 2;
  k.per_channel = true;
  k.upper = {1.0, 4.0};
  k.lower = {-1.0, 0.0};
  k.levels = {-0.5f, 0.5f, 2.0f, 3.0f};
  const float rows[] = {9.0f, 9.0f,     // sink row: copied
                        0.2f, 3.5f,     // 0.2 -> 0.5; (3.5 - 2) / 2 = 0.75 -> 0.5 -> 3
                        -3.0f, 1.0f};   // -3 < -1: outlier, exact; (1 - 2) / 2 = -0.5 -> 1
  float out[6];
  CHECK(nuq_quantize(k, rows, 3, 2, 0.99, 1, out) == 3);
  CHECK(std::vector<float>(out, out + 6) == std::vector<float>{9.0f, 9.0f, 0.5f, 3.0f, -3.0f, 1.0f});
  // Values: a row of 4 (sparsity 0.5: t = 0.75, quantiles at ranks 2.25 and 0.75); outliers at or
  // beyond them: the min and the max; the others normalized by the row's range with the outliers
  // replaced by the lower median.
  NuqCalibration v;
  v.bits = 2;
  v.per_channel = false;
  v.levels = {-0.5f, 0.5f, 2.0f, 3.0f};
  const float row[] = {-10.0f, 1.0f, 3.0f, 20.0f};
  // quantiles: 3 + 0.25 (20 - 3) = 7.25 and 1 - 0.25 (1 + 10) = -1.75 (torch's lerp from above);
  // median 1; {1, 1, 3, 1}: max 3, min 1, offset 2, range 1; 1 -> -1 -> -0.5 -> 1.5, 3 -> 2.5.
  float vo[4];
  CHECK(nuq_quantize(v, row, 1, 4, 0.5, 0, vo) == 2);
  CHECK(std::vector<float>(vo, vo + 4) == std::vector<float>{-10.0f, 1.5f, 2.5f, 20.0f});
}

TEST_CASE("nuq: the stored form by hand (codes, sink rows, sparse outliers, bytes)", "[quant][nuq]") {
  // The keys of the case above: thresholds [-1, 1] and [0, 4]; levels -0.5, 0.5, 2, 3.
  NuqTable k;
  k.bits = 2;
  k.per_channel = true;
  k.sink = 1;
  k.levels = {-0.5f, 0.5f, 2.0f, 3.0f};
  k.upper = {f32_to_f16_ref(1.0f), f32_to_f16_ref(4.0f)};
  k.lower = {f32_to_f16_ref(-1.0f), f32_to_f16_ref(0.0f)};
  const float rows[] = {9.0f, 9.0f, 0.2f, 3.5f, -3.0f, 1.0f};
  NuqRows s;
  nuq_encode(k, rows, 1, 2, s);  // in two calls: the sink row, then the others
  nuq_encode(k, rows + 2, 2, 2, s);
  CHECK(s.rows == 3);
  CHECK(s.sink_rows == 1);
  CHECK(s.sink == std::vector<std::uint16_t>{f32_to_f16_ref(9.0f), f32_to_f16_ref(9.0f)});
  // Row 1: levels 1 and 1 (0.2 -> 0.5, 0.75 -> 0.5): 1 | 1 << 2; row 2: -3 an outlier (code 0), -0.5 -> 0.
  CHECK(s.codes == std::vector<std::uint8_t>{5, 0});
  CHECK(s.outlier_end == std::vector<std::uint32_t>{0, 1});
  CHECK(s.outlier_channel == std::vector<std::uint16_t>{0});
  CHECK(s.outlier_value == std::vector<std::uint16_t>{f32_to_f16_ref(-3.0f)});
  CHECK(s.offset.empty());
  // Bytes: 2 code bytes, the table (4 f32 levels + 2 x 2 f16 thresholds), one f16 sink row, one
  // outlier (f16 value, u16 channel) and a u16 count per quantized row.
  CHECK(s.code_bytes() == 2);
  CHECK(k.bytes() == 24);
  CHECK(s.scale_bytes() == 0);
  CHECK(s.sink_bytes() == 4);
  CHECK(s.outlier_bytes() == 2);
  CHECK(s.index_bytes() == 6);
  float out[6];
  nuq_decode(s.view(k), 2, 0, 3, out);
  CHECK(std::vector<float>(out, out + 6) == std::vector<float>{9.0f, 9.0f, 0.5f, 3.0f, -3.0f, 1.0f});
  nuq_decode(s.view(k), 2, 2, 3, out);  // a range not starting at row 0
  CHECK(std::vector<float>(out, out + 2) == std::vector<float>{-3.0f, 1.0f});

  // Positions decide the sink rows (a cache after eviction): position 0 evicted -> no sink row;
  // a sink row after coded rows is a caller's error.
  const std::int32_t later[] = {1, 2}, first_kept[] = {0, 2};
  NuqRows ev, ev0;
  nuq_encode(k, rows + 2, 2, 2, ev, later);
  CHECK(ev.sink_rows == 0);
  CHECK(ev.codes == std::vector<std::uint8_t>{5, 0});
  nuq_encode(k, rows, 2, 2, ev0, first_kept);
  CHECK(ev0.sink_rows == 1);
  CHECK_THROWS_AS(nuq_encode(k, rows, 1, 2, ev, first_kept), std::logic_error);

  // Values: the row of the case above (offset 2, range 1 stored in f32; -10 and 20 outliers).
  NuqTable v;
  v.bits = 2;
  v.sparsity = 0.5;
  v.levels = k.levels;
  const float row[] = {-10.0f, 1.0f, 3.0f, 20.0f};
  NuqRows sv;
  nuq_encode(v, row, 1, 4, sv);
  CHECK(sv.codes == std::vector<std::uint8_t>{1 << 4});
  CHECK(sv.offset == std::vector<float>{2.0f});
  CHECK(sv.range == std::vector<float>{1.0f});
  CHECK(sv.outlier_channel == std::vector<std::uint16_t>{0, 3});
  CHECK(sv.scale_bytes() == 8);
  nuq_decode(sv.view(v), 4, 0, 1, out);
  CHECK(std::vector<float>(out, out + 4) == std::vector<float>{-10.0f, 1.5f, 2.5f, 20.0f});
}

namespace {

// torch.quantile(row, q), linear, on a sorted f32 row as torch computes it (rank in f32, torch's
// lerp from the nearer neighbour).
float torch_quantile_sorted(const std::vector<float>& s, double q) {
  const float rank = static_cast<float>(q) * static_cast<float>(s.size() - 1);
  const auto below = static_cast<std::size_t>(rank);
  const std::size_t above = std::min(s.size() - 1, static_cast<std::size_t>(std::ceil(rank)));
  const float w = rank - static_cast<float>(below), a = s[below], b = s[above];
  return std::fabs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

}  // namespace

TEST_CASE("nuq: a value row's thresholds and range equal those of the sorted row (widths, sparsities, ties, infinities)",
          "[quant][nuq]") {
  // KVQuant per row: outliers at or beyond torch.quantile(row, 1 - t) and (row, t), t = 1 - (1 -
  // sparsity) / 2; the range of the row with its outliers replaced by the lower median. nuq_encode
  // selects those order statistics (networks near the ends, selection elsewhere) instead of
  // sorting: the same offset, range, outliers and codes as the sorted row's.
  Rng r(29);
  NuqTable t;
  t.bits = 3;
  t.levels = {-1.0f, -0.6f, -0.3f, -0.1f, 0.1f, 0.3f, 0.6f, 1.0f};
  const float inf = std::numeric_limits<float>::infinity();
  for (const double sparsity : {0.99, 0.9, 0.5, 0.0}) {
    t.sparsity = sparsity;
    const double q = 1.0 - (1.0 - sparsity) / 2.0;
    for (const std::size_t width : {4, 7, 8, 9, 32, 128}) {
      for (int kind = 0; kind < 4; ++kind) {  // normal, ties of three values, a constant row, infinities
        std::vector<float> x(width);
        for (std::size_t j = 0; j < width; ++j) {
          x[j] = kind == 1 ? static_cast<float>(r.below(3)) - 1.0f : kind == 2 ? 0.5f : static_cast<float>(r.normal());
        }
        if (kind == 3) {
          x[width / 3] = inf;
          x[width / 2] = -inf;
        }
        std::vector<float> s = x;
        std::sort(s.begin(), s.end());
        const float hi = torch_quantile_sorted(s, q), lo = torch_quantile_sorted(s, 1.0 - q), median = s[(width - 1) / 2];
        float mx = -inf, mn = inf;
        std::vector<std::uint16_t> outliers;
        for (std::size_t j = 0; j < width; ++j) {
          const bool out = x[j] <= lo || x[j] >= hi;
          if (out) outliers.push_back(static_cast<std::uint16_t>(j));
          mx = std::max(mx, out ? median : x[j]);
          mn = std::min(mn, out ? median : x[j]);
        }
        NuqRows rows;
        nuq_encode(t, x.data(), 1, width, rows);
        INFO("sparsity " << sparsity << " width " << width << " kind " << kind);
        REQUIRE(rows.offset.size() == 1);
        // Bit for bit, or both NaN (an infinite quantile's lerp): what KVQuant's torch code gives.
        const auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
        CHECK(same(rows.offset[0], (mx + mn) / 2.0f));
        CHECK(same(rows.range[0], (mx - mn) / 2.0f));
        CHECK(rows.outlier_channel == outliers);
      }
    }
  }
}

TEST_CASE("nuq: key thresholds are numpy's percentiles of each channel", "[quant][nuq]") {
  // Against each channel sorted: the order statistics by insertion networks (few rows: ranks
  // within four of the ends) and by selection (many), with ties.
  Rng rng(12);
  const std::size_t C = 3;
  for (const std::size_t n : {5, 8, 12, 40, 300}) {
    std::vector<float> x(n * C);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(i % 3 == 2 ? std::round(2.0 * rng.normal()) : rng.normal());
    }
    for (const double sparsity : {0.5, 0.9, 0.99, 1.0}) {
      CAPTURE(n, sparsity);
      const NuqCalibration kc = calibrate_nuq(x.data(), n, C, 2, true, sparsity, 0);
      const double t = 1.0 - ((1.0 - sparsity) / 2.0);
      for (std::size_t j = 0; j < C; ++j) {
        std::vector<double> col(n);
        for (std::size_t i = 0; i < n; ++i) col[i] = x[i * C + j];
        std::sort(col.begin(), col.end());
        CHECK(kc.upper[j] == percentile_sorted(col.data(), n, t * 100.0));
        CHECK(kc.lower[j] == percentile_sorted(col.data(), n, (1.0 - t) * 100.0));
      }
    }
  }
}

TEST_CASE("nuq: per-head tables and per-run value thresholds", "[quant][nuq]") {
  Rng rng(11);
  const std::size_t n = 40, H = 2, d = 8, C = H * d;
  std::vector<float> x(n * C);
  for (float& e : x) e = static_cast<float>(rng.normal());
  // A head's key table: its channels of the layer's thresholds, rounded to f16.
  const NuqCalibration kc = calibrate_nuq(x.data(), n, C, 3, true, 0.9, 1);
  const NuqTable t = nuq_table(kc, 0.9, 1, d, d);
  REQUIRE(t.upper.size() == d);
  for (std::size_t j = 0; j < d; ++j) {
    CHECK(t.upper[j] == f32_to_f16_ref(static_cast<float>(kc.upper[d + j])));
    CHECK(t.lower[j] == f32_to_f16_ref(static_cast<float>(kc.lower[d + j])));
  }
  // Values with thresholds per run of d channels: the same fit as each run taken as a row.
  const NuqCalibration per_run = calibrate_nuq(x.data(), n, C, 3, false, 0.9, 0, nullptr, d);
  const NuqCalibration as_rows = calibrate_nuq(x.data(), n * H, d, 3, false, 0.9, 0);
  CHECK(per_run.levels == as_rows.levels);
  CHECK(calibrate_nuq(x.data(), n, C, 3, false, 0.9, 0, nullptr, C).levels ==
        calibrate_nuq(x.data(), n, C, 3, false, 0.9, 0).levels);
}

TEST_CASE("nuq: the vector decode equals the plain loop bitwise (every width, bits, overflow, non-finite)", "[quant][nuq]") {
  Rng r(23);
  for (int bits : {2, 3, 4, 8}) {
    for (const std::size_t width : {8, 13, 24, 64, 128}) {
      for (const auto& [key, overflow] : {std::pair{true, false}, std::pair{true, true}, std::pair{false, true}}) {
        const std::size_t n = 40;
        std::vector<float> x(n * width);
        for (std::size_t i = 0; i < x.size(); ++i) {
          // Mostly normal values; some rows huge (f16 overflow of finite f32 results) or tiny (f16 subnormals).
          const double scale = i / width % 7 == 3 ? 3e4 : i / width % 7 == 5 ? 1e-6 : 1.0;
          x[i] = static_cast<float>(r.normal() * scale);
        }
        NuqTable t = nuq_table(calibrate_nuq(x.data(), n, width, bits, key, 0.9, 1), 0.9, 1, 0, key ? width : 0);
        if (overflow) t.levels.back() = 3e38f;  // a level whose product overflows to inf: decoded as 0
        NuqRows rows;
        nuq_encode(t, x.data(), n, width, rows);
        std::vector<float> fast(n * width), ref(n * width);
        nuq_decode_ref(rows.view(t), width, 0, n, ref.data());
        for (const Isa isa : {Isa::avx2, Isa::avx512}) {  // the eight- and the sixteen-wide loops
          if (isa > best_isa()) continue;
          set_isa(isa);
          nuq_decode(rows.view(t), width, 0, n, fast.data());
          INFO("bits " << bits << " width " << width << (key ? " keys" : " values") << (overflow ? " overflow" : "")
                       << " isa " << isa_name(isa));
          CHECK(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
        }
        set_isa(best_isa());
      }
    }
  }
}
