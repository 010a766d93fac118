#include <catch2/catch.hpp>
#include <limits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/io/file_hash.h"
#include "akv/kv/compress.h"
#include "akv/kv/tensor_builder.h"
#include "akv/method/registry.h"
#include "akv/quant/pack.h"
#include "akv/synth/synth.h"
#include "akv/tensor/ggml_quant.h"
#include "akv/tensor/half.h"
#include "synth_shape.h"
#include "test_util.h"

using namespace akv;

namespace {

// Keys with two outlier channels (large offset and spread), values Gaussian.
struct HeadData {
  std::size_t n, d;
  std::vector<float> key, pre, value;
};

HeadData make_head(std::size_t n, std::size_t d, std::uint64_t seed, bool rope = false) {
  HeadData h{n, d, std::vector<float>(n * d), {}, std::vector<float>(n * d)};
  Rng r(seed);
  for (std::size_t i = 0; i < n * d; ++i) {
    const float z = static_cast<float>(r.normal());
    h.key[i] = (i % d == 3 || i % d == 10) ? 20.0f + 8.0f * z : z;
    h.value[i] = static_cast<float>(r.normal());
  }
  if (rope) {
    h.pre = h.key;
    RopeTable t(d, 10000.0, 0, n);
    apply_rope(h.key.data(), n, 0, RopeLayout::rotate_half, t);
  }
  return h;
}

HeadInput input(const HeadData& h) {
  HeadInput in;
  in.key = h.key.data();
  in.key_pre_rope = h.pre.empty() ? nullptr : h.pre.data();
  in.value = h.value.data();
  in.n = in.n_tokens = h.n;
  in.head_dim = h.d;
  return in;
}

CompressParams kivi(int bk, int bv) {
  CompressRequest r;
  r.method = "kivi";
  r.bits_key = bk;
  r.bits_value = bv;
  return resolve_params(r);
}

double rel_mse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    e += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    n += static_cast<double>(x[i]) * x[i];
  }
  return e / n;
}

// The dense f16 rows (the residual window) of a stored tensor.
std::vector<std::uint16_t> residual(const PackedTensor& t) {
  const std::uint16_t* r = t.dense_rows() > 0 ? t.dense_f16(0) : nullptr;
  return std::vector<std::uint16_t>(r, r + t.dense_rows() * t.head_dim());
}

void require_same(const PackedTensor& a, const PackedTensor& b) {
  CHECK(a.packed_rows() == b.packed_rows());
  CHECK(a.dense_rows() == b.dense_rows());
  CHECK(a.packed_block().codes == b.packed_block().codes);
  CHECK(a.scales() == b.scales());
  CHECK(a.zeros() == b.zeros());
  CHECK(a.outlier_channels() == b.outlier_channels());
  CHECK(a.outlier_values() == b.outlier_values());
  CHECK(residual(a) == residual(b));
  CHECK(a.pre_rope() == b.pre_rope());
}

}  // namespace

TEST_CASE("compress_head: fast path equals reference; split into quantized and residual",
          "[kv][head]") {
  const std::size_t n = 1000, d = 64;  // 1000 - 128 = 872 = 27 groups of 32 + 8
  const HeadData h = make_head(n, d, 7, true);
  for (int bits : {2, 3, 4, 8}) {
    for (double outliers : {0.0, 0.05}) {
      for (bool pre : {false, true}) {
        CompressParams p = kivi(bits, bits);
        p.outlier_fraction = outliers;
        p.pre_rope = pre;
        const HeadCache a = compress_head(input(h), p);
        const HeadCache b = compress_head_ref(input(h), p);
        INFO("bits " << bits << " outliers " << outliers << " pre_rope " << pre);
        require_same(a.key, b.key);
        require_same(a.value, b.value);
        CHECK(a.key.packed_rows() == 896);  // kivi rule: 1000 - 1000 mod 128 (channel axis)
        CHECK(a.key.dense_rows() == 104);
        CHECK(a.value.packed_rows() == 872);  // token axis: everything before the window
        CHECK(a.value.dense_rows() == 128);
        CHECK(a.key.outlier_channels().size() == (outliers > 0 ? 4u : 0u));  // ceil(0.05 * 64)
        p.rule = QuantRule::bounded;
        const HeadCache c = compress_head(input(h), p);
        require_same(c.key, compress_head_ref(input(h), p).key);
        CHECK(c.key.packed_rows() == 864);  // bounded rule: whole groups of 32 before the window
        CHECK(c.key.dense_rows() == 136);
        CHECK(c.value.packed_rows() == 872);
      }
    }
  }
  CHECK(quantized_rows(1000, QuantAxis::channel, 32, 0, QuantRule::kivi) == 992);  // R = 0: whole groups
  CHECK(quantized_rows(1024, QuantAxis::channel, 32, 128, QuantRule::kivi) == 1024);
  CHECK(quantized_rows(1024, QuantAxis::channel, 32, 128, QuantRule::bounded) == 896);
  CHECK(quantized_rows(127, QuantAxis::channel, 32, 128, QuantRule::kivi) == 0);
  CHECK(quantized_rows(127, QuantAxis::token, 32, 128, QuantRule::kivi) == 0);
  // Short sequences: everything stays in the residual window (KIVI's prefill below R).
  const HeadData s = make_head(100, d, 8);
  const HeadCache c = compress_head(input(s), kivi(2, 2));
  CHECK(c.key.packed_rows() == 0);
  CHECK(c.value.packed_rows() == 0);
  CHECK(residual(c.key).size() == 100 * d);
}

TEST_CASE("compress_head: residual window exact, error falls with bits, outliers help",
          "[kv][head]") {
  const std::size_t n = 1024, d = 64;
  const HeadData h = make_head(n, d, 11);
  std::vector<float> k(n * d), v(n * d);
  double prev_k = INFINITY, prev_v = INFINITY;
  for (int bits : {2, 3, 4, 8}) {
    const HeadCache c = compress_head(input(h), kivi(bits, bits));
    reconstruct_head(c, {}, k.data(), v.data());
    // The most recent tokens are stored in f16: exact up to f16 rounding.
    for (std::size_t t = c.key.packed_rows(); t < n; ++t) {
      for (std::size_t j = 0; j < d; ++j) {
        REQUIRE(k[t * d + j] == f16_to_f32_ref(f32_to_f16_ref(h.key[t * d + j])));
      }
    }
    for (std::size_t t = c.value.packed_rows(); t < n; ++t) {
      for (std::size_t j = 0; j < d; ++j) {
        REQUIRE(v[t * d + j] == f16_to_f32_ref(f32_to_f16_ref(h.value[t * d + j])));
      }
    }
    const double ek = rel_mse(h.key, k), ev = rel_mse(h.value, v);
    INFO("bits " << bits << " key " << ek << " value " << ev);
    CHECK(ek < prev_k);
    CHECK(ev < prev_v);
    prev_k = ek;
    prev_v = ev;
  }
  // Outlier channels in f16: key error on the quantized, non-outlier part drops.
  CompressParams p = kivi(2, 2);
  p.key.axis = QuantAxis::token;  // per-token groups are where outlier channels hurt most
  const HeadCache plain = compress_head(input(h), p);
  p.outlier_fraction = 2.0 / 64;
  const HeadCache prot = compress_head(input(h), p);
  CHECK(prot.key.outlier_channels() == std::vector<std::uint16_t>{3, 10});
  std::vector<float> k2(n * d);
  reconstruct_head(plain, {}, k.data(), v.data());
  reconstruct_head(prot, {}, k2.data(), v.data());
  std::vector<float> x, a, b;
  for (std::size_t i = 0; i < n * d; ++i) {
    if (i % d != 3 && i % d != 10) {
      x.push_back(h.key[i]);
      a.push_back(k[i]);
      b.push_back(k2[i]);
    }
  }
  INFO("plain " << rel_mse(x, a) << " protected " << rel_mse(x, b));
  CHECK(rel_mse(x, b) < 0.5 * rel_mse(x, a));
  CHECK(rel_mse(h.key, k2) < rel_mse(h.key, k));
}

TEST_CASE("compress_head: pre-RoPE keys are rotated after dequantization", "[kv][head]") {
  const std::size_t n = 512, d = 64;
  const HeadData h = make_head(n, d, 5, true);
  CompressParams p = kivi(8, 8);
  p.pre_rope = true;
  const HeadCache c = compress_head(input(h), p);
  CHECK(c.key.pre_rope());
  RopeTable t(d, 10000.0, 0, n);
  std::vector<float> k(n * d), v(n * d);
  CHECK_THROWS_AS(reconstruct_head(c, {}, k.data(), v.data()), InvalidInput);
  reconstruct_head(c, {RopeLayout::rotate_half, &t}, k.data(), v.data());
  CHECK(rel_mse(h.key, k) < 1e-4);
  p.pre_rope = false;
  HeadInput in = input(h);
  in.key_pre_rope = nullptr;
  p.pre_rope = true;
  CHECK_THROWS_AS(compress_head(in, p), InvalidInput);
}

TEST_CASE("PackedTensor: blocks whose codes end inside a byte continue bit by bit", "[kv][head]") {
  // Per-token codes of 7 channels (one f16 outlier channel of 8) at 3 bits: 21 bits a row, so each
  // row appended alone starts inside the previous row's last byte.
  const std::size_t d = 8, cols = 7, rows = 5;
  Rng rng(17);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = static_cast<float>(rng.normal());
  const std::vector<std::uint16_t> channels = {2};
  std::vector<std::uint16_t> outliers(rows);
  for (std::size_t r = 0; r < rows; ++r) outliers[r] = f32_to_f16_ref(static_cast<float>(r) + 0.5f);
  const QuantizedBlock whole = quantize_block(x.data(), rows, cols, QuantAxis::token, 3, cols, QuantRule::kivi);
  PackedTensor at_once(d, DenseType::f16), by_row(d, DenseType::f16);
  at_once.append_packed(whole, channels, outliers.data());
  for (std::size_t r = 0; r < rows; ++r) {
    by_row.append_packed(quantize_block(x.data() + r * cols, 1, cols, QuantAxis::token, 3, cols, QuantRule::kivi),
                         channels, outliers.data() + r);
  }
  const QuantizedBlock a = at_once.packed_block(), b = by_row.packed_block();
  CHECK(a.codes == whole.codes);
  CHECK(b.codes == whole.codes);
  CHECK(b.scale == whole.scale);
  CHECK(b.zero == whole.zero);
  CHECK(by_row.outlier_values() == outliers);
  CHECK(by_row.code_bytes() == (rows * cols * 3 + 7) / 8);
}

TEST_CASE("cache file: round trip, byte accounting, corrupt data", "[kv][file]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 32, 300, 16, 1);
  so.write.key_pre_rope = true;
  const std::string dump = dir.file("d.h5");
  write_synth_dump(dump, so, {});
  CompressParams p = kivi(3, 2);
  p.outlier_fraction = 0.1;
  p.pre_rope = true;
  const std::string cache = dir.file("c.h5");
  const MemoryReport rep = compress_dump(dump, cache, p, 1, {});
  auto reader = std::make_unique<CacheReader>(cache);
  const CacheReader& r = *reader;
  CHECK(r.header().params.to_json() == p.to_json());
  CHECK(r.header().source_hash.rfind("xxh3-64:", 0) == 0);
  CHECK(r.meta().n_query == 16);
  // Closed form: per head and tensor, codes ceil(nq * cols * b / 8), 2 bytes per scale and zero,
  // 2 bytes per residual and outlier value, 2 per outlier channel index.
  const std::size_t n = 300, d = 32, n_out = 4;         // ceil(0.1 * 32)
  const std::size_t kq = n - n % 128, vq = n - 128;  // 256 (kivi rule: whole R blocks), 172
  const std::uint64_t key_bytes = packed_size(kq * (d - n_out), 3) + 2 * 2 * (kq / 32) * (d - n_out) +
                                  2 * (n - kq) * d + 2 * n_out + 2 * kq * n_out;
  const std::uint64_t value_bytes = packed_size(vq * d, 2) + 2 * 2 * vq * 1 + 2 * (n - vq) * d;
  CHECK(rep.total.total() == 4 * (key_bytes + value_bytes));
  const MemoryReport stored = cache_memory(r);
  CHECK(stored.total.codes == rep.total.codes);
  CHECK(stored.total.scales == rep.total.scales);
  CHECK(stored.total.zeros == rep.total.zeros);
  CHECK(stored.total.residual == rep.total.residual);
  CHECK(stored.total.outliers == rep.total.outliers);
  CHECK(stored.total.indices == 0);
  CHECK(stored.elements == 2 * 2 * 2 * n * d);
  // A head read back equals the one compressed in memory.
  DumpReader dr(dump);
  const Tensor3 key = dr.read(1, DumpField::key), value = dr.read(1, DumpField::value),
                pre = dr.read(1, DumpField::key_pre_rope);
  HeadInput in;
  in.key = key.row(1, 0);
  in.key_pre_rope = pre.row(1, 0);
  in.value = value.row(1, 0);
  in.n = in.n_tokens = n;
  in.head_dim = d;
  const HeadCache mem = compress_head(in, p), disk = r.read_head(1, 1);
  require_same(mem.key, disk.key);
  require_same(mem.value, disk.value);
  // Corrupt packed data: a codes dataset one byte short.
  reader.reset();
  {
    h5::File f(H5Fopen(cache.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    const std::string path = cache_head_path(0, 1) + "/value/codes";
    REQUIRE(H5Ldelete(f.get(), path.c_str(), H5P_DEFAULT) >= 0);
    std::vector<std::uint8_t> codes(packed_size(vq * d, 2) - 1, 0);
    h5::write_dataset(f.get(), path, H5T_STD_U8LE, H5T_NATIVE_UINT8, {codes.size()}, codes.data());
  }
  CacheReader broken(cache);
  CHECK_NOTHROW(broken.read_head(0, 0));
  try {
    broken.read_head(0, 1);
    FAIL("expected CorruptData");
  } catch (const CorruptData& e) {
    CHECK(std::string(e.what()).find("/layers/0/heads/1/value/codes") != std::string::npos);
  }
}

TEST_CASE("compress_dump: same bytes for any thread count; refuses another dump",
          "[kv][file]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 4, 32, 200, 8, 1);
  write_synth_dump(dir.file("a.h5"), so, {});
  so.seed = 1;
  write_synth_dump(dir.file("b.h5"), so, {});
  const CompressParams p = kivi(4, 2);
  compress_dump(dir.file("a.h5"), dir.file("c1.h5"), p, 1, {});
  compress_dump(dir.file("a.h5"), dir.file("c3.h5"), p, 3, {});
  auto bytes = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes(dir.file("c1.h5")) == bytes(dir.file("c3.h5")));
  CacheReader c(dir.file("c1.h5"));
  CHECK_NOTHROW(check_cache_matches_dump(c, DumpReader(dir.file("a.h5"))));
  CHECK_THROWS_AS(check_cache_matches_dump(c, DumpReader(dir.file("b.h5"))), InvalidInput);
  // A hash the caller already has (evaluate --dump hashes once) is the one recorded and checked.
  compress_dump(dir.file("a.h5"), dir.file("c2.h5"), p, 1, {}, Shard{}, file_hash(dir.file("a.h5")));
  CHECK(bytes(dir.file("c1.h5")) == bytes(dir.file("c2.h5")));
  const std::string other = file_hash(dir.file("b.h5"));
  compress_dump(dir.file("a.h5"), dir.file("cb.h5"), p, 1, {}, Shard{}, other);
  CacheReader cb(dir.file("cb.h5"));
  CHECK(cb.header().source_hash == other);
  CHECK_THROWS_AS(check_cache_matches_dump(cb, DumpReader(dir.file("a.h5"))), InvalidInput);
  CHECK_NOTHROW(check_cache_matches_dump(cb, DumpReader(dir.file("a.h5")), other));
  // Decompress -> dense dump whose K/V equal the reconstruction.
  decompress_cache(dir.file("c1.h5"), dir.file("r.h5"), "", DType::f32, 2, {});
  DumpReader a(dir.file("a.h5")), rd(dir.file("r.h5"));
  const HeadCache h = c.read_head(1, 2);
  std::vector<float> k(200 * 32), v(200 * 32);
  reconstruct_head(h, {}, k.data(), v.data());
  const Tensor3 rk = rd.read(1, DumpField::key, 2, 1), rv = rd.read(1, DumpField::value, 2, 1);
  CHECK(std::vector<float>(rk.data(), rk.data() + rk.size()) == k);
  CHECK(std::vector<float>(rv.data(), rv.data() + rv.size()) == v);
  const Tensor3 q0 = a.read(0, DumpField::query), q1 = rd.read(0, DumpField::query);
  CHECK(std::vector<float>(q0.data(), q0.data() + q0.size()) ==
        std::vector<float>(q1.data(), q1.data() + q1.size()));
  // method none: an exact f16 copy.
  CompressRequest none;
  none.method = "none";
  compress_dump(dir.file("a.h5"), dir.file("n.h5"), resolve_params(none), 2, {});
  CacheReader nc(dir.file("n.h5"));
  reconstruct_head(nc.read_head(0, 0), {}, k.data(), v.data());
  const Tensor3 ak = a.read(0, DumpField::key, 0, 1);
  CHECK(std::vector<float>(ak.data(), ak.data() + ak.size()) == k);  // the dump is f16
  CHECK(cache_memory(nc).bits_per_element() == 16.0);
}

TEST_CASE("ggml caches (llama.cpp's types): rows as ggml blocks, honest bytes, file round trip, corrupt blocks",
          "[kv][file][ggml]") {
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 64, 100, 8, 1);
  so.write.dtype = DType::f32;
  const std::string dump = dir.file("d.h5");
  write_synth_dump(dump, so, {});
  CompressRequest req;
  req.method = "ggml";
  req.ggml.k = "q4_0";
  req.ggml.v = "q8_0";
  const CompressParams p = resolve_params(req);
  const std::string cache = dir.file("c.h5");
  const MemoryReport rep = compress_dump(dump, cache, p, 2, {});
  // Q4_0: 18 bytes per 32 values, Q8_0: 34; every row of every head, no residual.
  const std::uint64_t per_head = 100 * (64 / 32) * (18 + 34);
  CHECK(rep.total.total() == 2 * 2 * per_head);
  CHECK(rep.total.codes == rep.total.total());
  {
    CacheReader r(cache);
    CHECK(r.version() == kCacheVersionGgml);
    CHECK(r.header().params.to_json() == p.to_json());
    CHECK(cache_memory(r).total.codes == rep.total.codes);
    // A head read back holds ggml's reference blocks of each row, and rebuilds as their values.
    DumpReader dr(dump);
    const Tensor3 key = dr.read(1, DumpField::key), value = dr.read(1, DumpField::value);
    const HeadCache h = r.read_head(1, 0);
    const GgmlTypeInfo& q4 = *ggml_type_info_by_name("Q4_0");
    const GgmlTypeInfo& q8 = *ggml_type_info_by_name("Q8_0");
    REQUIRE(h.key.ggml_type() == &q4);
    REQUIRE(h.value.ggml_type() == &q8);
    CHECK(h.key.ggml_rows() == 100);
    CHECK(h.key.dense_rows() == 0);
    std::vector<std::uint8_t> kb(100 * 2 * 18), vb(100 * 2 * 34);
    for (std::size_t t = 0; t < 100; ++t) {
      ggml_quantize(q4, key.row(0, t), 64, kb.data() + t * 36);
      ggml_quantize(q8, value.row(0, t), 64, vb.data() + t * 68);
    }
    CHECK(h.key.ggml_blocks() == kb);
    CHECK(h.value.ggml_blocks() == vb);
    std::vector<float> k(100 * 64), v(100 * 64), kref(100 * 64), vref(100 * 64);
    reconstruct_head(h, {}, k.data(), v.data());
    ggml_dequantize(q4, kb.data(), kref.size(), kref.data());
    ggml_dequantize(q8, vb.data(), vref.size(), vref.data());
    CHECK(k == kref);
    CHECK(v == vref);
    // Q8_0 keeps values within half a step d / 2 (d = max|x| / 127 per block) of the source,
    // plus |q| <= 127 times the f16 rounding of d (relative 2^-11): d (0.5 + 127 / 2048).
    for (std::size_t t = 0; t < 100; ++t) {
      for (std::size_t b = 0; b < 2; ++b) {
        float amax = 0;
        for (std::size_t c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(value.row(0, t)[32 * b + c]));
        for (std::size_t c = 0; c < 32; ++c) {
          const std::size_t i = t * 64 + 32 * b + c;
          REQUIRE(std::fabs(v[i] - value.row(0, t)[32 * b + c]) <= amax / 127.0f * 0.563f);
        }
      }
    }
  }
  // The bytes a head group stores must match the method: another type, a short dataset, and a
  // block whose f16 scale is NaN are each one error naming the dataset.
  auto corrupt = [&](const std::function<void(hid_t)>& edit, const std::string& what) {
    const std::string bad = dir.file("bad.h5");
    std::filesystem::copy_file(cache, bad, std::filesystem::copy_options::overwrite_existing);
    {
      h5::File f(H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      edit(f.get());
    }
    CacheReader r(bad);
    CHECK_NOTHROW(r.read_head(0, 0));
    try {
      r.read_head(1, 1);
      FAIL("expected CorruptData");
    } catch (const CorruptData& e) {
      CHECK_THAT(e.what(), Catch::Contains(what));
    }
  };
  const std::string key_group = cache_head_path(1, 1) + "/key";
  corrupt(
      [&](hid_t f) {
        h5::Group g(H5Gopen2(f, key_group.c_str(), H5P_DEFAULT));
        REQUIRE(H5Adelete(g.get(), "ggml_type") >= 0);
        h5::write_attr_string(g.get(), "ggml_type", "q4_1");
      },
      "/layers/1/heads/1/key.ggml_type = q4_1");
  corrupt(
      [&](hid_t f) {
        const std::string path = key_group + "/blocks";
        REQUIRE(H5Ldelete(f, path.c_str(), H5P_DEFAULT) >= 0);
        std::vector<std::uint8_t> b(100 * 36 - 1, 0);
        h5::write_dataset(f, path, H5T_STD_U8LE, H5T_NATIVE_UINT8, {b.size()}, b.data());
      },
      "/layers/1/heads/1/key/blocks");
  corrupt(
      [&](hid_t f) {
        const std::string path = key_group + "/blocks";
        std::vector<std::uint8_t> b = h5::read_vector<std::uint8_t>(f, path, H5T_NATIVE_UINT8, {100 * 36}, "");
        b[36 * 7 + 18] = 0x00;  // row 7, second block: d = NaN (f16 0x7e00)
        b[36 * 7 + 19] = 0x7e;
        REQUIRE(H5Ldelete(f, path.c_str(), H5P_DEFAULT) >= 0);
        h5::write_dataset(f, path, H5T_STD_U8LE, H5T_NATIVE_UINT8, {b.size()}, b.data());
      },
      "/layers/1/heads/1/key/blocks = element 480");
  // head_dim must hold whole blocks; --k without method ggml is a usage error.
  so.head_dim = 48;
  write_synth_dump(dir.file("d48.h5"), so, {});
  CHECK_THROWS_AS(compress_dump(dir.file("d48.h5"), dir.file("x.h5"), p, 1, {}), InvalidInput);
  CHECK_FALSE(std::filesystem::exists(dir.file("x.h5")));
  CompressRequest wrong;
  wrong.method = "kivi";
  wrong.ggml.k = "q4_0";
  CHECK_THROWS_AS(resolve_params(wrong), UsageError);
}

TEST_CASE("fp8 caches: x / scale as 8-bit floats, the scale rules, honest bytes, file version 5", "[kv][file][fp8]") {
  // Builder: the first rows fix the scale max|x| / 448; each stored value is fp8(x / s) * s, and
  // a later row beyond the prompt's range saturates to 448 s.
  const GgmlTypeInfo& e4 = *ggml_type_info_by_name("FP8_E4M3");
  TensorBuilder b(8, e4, Rotation{});
  std::vector<float> rows(3 * 8);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.37f * static_cast<float>(i) - 3.0f;  // max |x| 5.51
  std::vector<std::int32_t> pos = {0, 1, 2};
  b.append(rows.data(), rows.data(), pos.data(), 3);
  const float s = b.stored().ggml_scale();
  CHECK(s == (0.37f * 23.0f - 3.0f) / 448.0f);  // the largest magnitude is the last value, 5.51
  std::vector<float> big(8, 100.0f);
  const std::int32_t p3 = 3;
  b.append(big.data(), big.data(), &p3, 1);
  std::vector<float> got(4 * 8);
  dequantize_rows(b.view(), 8, 0, 4, got.data());
  for (std::size_t i = 0; i < rows.size(); ++i) CHECK(got[i] == fp8_decode(fp8_encode(rows[i] / s, Fp8Format::e4m3), Fp8Format::e4m3) * s);
  CHECK(got[3 * 8] == 448.0f * s);
  CHECK(b.bytes() == 4 * 8 + 4);  // a byte per value, the f32 scale
  // The view says its rows are finite until a NaN is stored (attention then scans e4m3 tiles).
  CHECK(b.view().ggml.finite);
  std::vector<float> nan_row(8, 1.0f);
  nan_row[5] = std::numeric_limits<float>::quiet_NaN();
  const std::int32_t p4 = 4;
  b.append(nan_row.data(), nan_row.data(), &p4, 1);
  CHECK_FALSE(b.view().ggml.finite);
  // Through compress: every head, scale rules head / tensor / one, file version 5 and read back.
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 64, 100, 8, 1);
  so.write.dtype = DType::f32;
  const std::string dump = dir.file("d.h5");
  write_synth_dump(dump, so, {});
  DumpReader dr(dump);
  const Tensor3 key = dr.read(1, DumpField::key);
  for (const std::string rule : {"head", "tensor", "one"}) {
    INFO(rule);
    const CompressParams p = resolve_params(parse_method_spec("fp8:v=e5m2:scale=" + rule));
    const std::string cache = dir.file("c-" + rule + ".h5");
    const MemoryReport rep = compress_dump(dump, cache, p, 2, {});
    CHECK(rep.total.codes == 2 * 2 * 2 * 100 * 64);
    CHECK(rep.total.scales == 2 * 2 * 2 * 4);
    CacheReader r(cache);
    CHECK(r.version() == kCacheVersionFp8);
    CHECK(cache_memory(r).total.total() == rep.total.total());
    float amax[2] = {0, 0}, layer_amax = 0;
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t i = 0; i < 100 * 64; ++i) amax[h] = std::max(amax[h], std::fabs(key.row(h, 0)[i]));
      layer_amax = std::max(layer_amax, amax[h]);
    }
    for (std::size_t h = 0; h < 2; ++h) {
      const HeadCache hc = r.read_head(1, h);
      const float want = rule == "one" ? 1.0f : (rule == "head" ? amax[h] : layer_amax) / 448.0f;
      CHECK(hc.key.ggml_scale() == want);
      std::vector<float> k(100 * 64), v(100 * 64);
      reconstruct_head(hc, {}, k.data(), v.data());
      for (std::size_t i = 0; i < k.size(); i += 97) {
        CHECK(k[i] == fp8_decode(fp8_encode(key.row(h, 0)[i] / want, Fp8Format::e4m3), Fp8Format::e4m3) * want);
      }
    }
  }
  // A scale that is not a positive f32 is corrupt data naming the attribute.
  const std::string bad = dir.file("bad.h5");
  std::filesystem::copy_file(dir.file("c-head.h5"), bad);
  {
    h5::File f(H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::Group g(H5Gopen2(f.get(), (cache_head_path(0, 1) + "/value").c_str(), H5P_DEFAULT));
    REQUIRE(H5Adelete(g.get(), "fp8_scale") >= 0);
    h5::write_attr_double(g.get(), "fp8_scale", -1.0);
  }
  CacheReader r(bad);
  CHECK_THROWS_WITH(r.read_head(0, 1), Catch::Contains("/layers/0/heads/1/value.fp8_scale = -1"));
}

TEST_CASE("rotated caches: rows stored rotated, fast = reference, rebuilt rows rotated back, file version 4",
          "[kv][file][rotation]") {
  const std::size_t n = 300, d = 64;
  const HeadData h = make_head(n, d, 21);
  for (const char* spec : {"uniform:bits=4:rotate=hadamard", "kivi-4:rotate=random:rotate-seed=5",
                           "kivi:bits-key=2:bits-value=4:rotate=hadamard:outlier-fraction=0.05"}) {
    INFO(spec);
    const CompressParams p = *resolve_method_spec(spec);
    const HeadCache a = compress_head(input(h), p), b = compress_head_ref(input(h), p);
    require_same(a.key, b.key);
    require_same(a.value, b.value);
    CHECK(a.key.rotation() == p.rotation(d, true));
    CHECK(a.value.rotation().block == 64);
    // The stored rows are the rotated rows quantized: without the rotation's inverse the rebuilt
    // rows are far from the source, with it close.
    std::vector<float> k(n * d), v(n * d);
    reconstruct_head(a, {}, k.data(), v.data());
    HeadCache unrotated = a;
    unrotated.key.set_rotation({});
    std::vector<float> k0(n * d), v0(n * d);
    reconstruct_head(unrotated, {}, k0.data(), v0.data());
    auto rel = [&](const std::vector<float>& x, const std::vector<float>& ref) {
      double e = 0, s = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        e += (x[i] - ref[i]) * (x[i] - ref[i]);
        s += ref[i] * ref[i];
      }
      return std::sqrt(e / s);
    };
    CHECK(rel(k, h.key) < 0.3);  // 2-bit keys: 0.15
    CHECK(rel(v, h.value) < 0.2);
    CHECK(rel(k0, h.key) > 0.5);
  }
  // Per-token 4-bit keys with outlier channels: the rotation lowers the key error.
  auto key_error = [&](const char* spec) {
    const HeadCache c = compress_head(input(h), *resolve_method_spec(spec));
    std::vector<float> k(n * d), v(n * d);
    reconstruct_head(c, {}, k.data(), v.data());
    double e = 0;
    for (std::size_t i = 0; i < k.size(); ++i) e += (k[i] - h.key[i]) * (k[i] - h.key[i]);
    return e;
  };
  CHECK(key_error("uniform:bits=4:rotate=hadamard") < key_error("uniform:bits=4") / 2);

  // File: version 4, rotation attributes per group, read back equal; ggml block types rotate,
  // f16 rows do not.
  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 64, 100, 8, 1);
  const std::string dump = dir.file("d.h5"), cache = dir.file("c.h5"), plain = dir.file("p.h5");
  write_synth_dump(dump, so, {});
  const CompressParams g = *resolve_method_spec("ggml:k=q4_0:v=f16:rotate=hadamard");
  compress_dump(dump, cache, g, 2, {});
  compress_dump(dump, plain, *resolve_method_spec("ggml:k=q4_0:v=f16"), 2, {});
  CacheReader r(cache), rp(plain);
  CHECK(r.version() == kCacheVersionRotation);
  CHECK(rp.version() == kCacheVersionGgml);
  CHECK(r.header().params.to_json() == g.to_json());
  CHECK(g.to_json().at("rotate") == "hadamard");
  CHECK_FALSE(rp.header().params.to_json().contains("rotate"));
  const HeadCache hr = r.read_head(1, 1), hp = rp.read_head(1, 1);
  CHECK(hr.key.rotation() == Rotation{RotationKind::hadamard, 64, 0});
  CHECK_FALSE(hr.value.rotation().active());
  CHECK(hr.value.ggml_blocks() == hp.value.ggml_blocks());
  CHECK(hr.key.ggml_blocks() != hp.key.ggml_blocks());
  std::vector<float> kr(100 * 64), vr(kr.size()), kp(kr.size()), vp(kr.size());
  reconstruct_head(hr, {}, kr.data(), vr.data());
  reconstruct_head(hp, {}, kp.data(), vp.data());
  DumpReader dr(dump);
  const Tensor3 key = dr.read(1, DumpField::key);
  double er = 0, ep = 0;
  for (std::size_t t = 0; t < 100; ++t) {
    for (std::size_t c = 0; c < 64; ++c) {
      er += std::pow(kr[t * 64 + c] - key.row(1, t)[c], 2);
      ep += std::pow(kp[t * 64 + c] - key.row(1, t)[c], 2);
    }
  }
  CHECK(er < ep);  // the synthetic keys' outlier channels
  // A rotation attribute in a version-3 file is refused, naming the group.
  const std::string bad = dir.file("bad.h5");
  std::filesystem::copy_file(plain, bad);
  {
    h5::File f(H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::Group kg(H5Gopen2(f.get(), (cache_head_path(0, 0) + "/key").c_str(), H5P_DEFAULT));
    h5::write_attr_string(kg.get(), "rotate", "hadamard");
    h5::write_attr_int(kg.get(), "rotate_block", 64);
    h5::write_attr_int(kg.get(), "rotate_seed", 0);
  }
  try {
    CacheReader(bad).read_head(0, 0);
    FAIL("expected CorruptData");
  } catch (const CorruptData& e) {
    CHECK_THAT(e.what(), Catch::Contains("/layers/0/heads/0/key.rotate"));
  }
  // Rotation with pre-RoPE keys, with method none and with the tiered cache is refused.
  CHECK_THROWS_AS(resolve_method_spec("kivi-2:pre-rope:rotate=hadamard"), InvalidInput);
  CHECK_THROWS_AS(resolve_method_spec("none:rotate=hadamard"), UsageError);
  CHECK_THROWS_AS(resolve_method_spec("balanced:rotate=hadamard"), UsageError);
  CHECK_THROWS_AS(resolve_method_spec("kivi-2:rotate=hadamard:rotate-seed=3"), UsageError);
}

TEST_CASE("per-head cache types with their own rotation: each tensor stored as the cache of that type and rotation "
          "stores it, file version 4", "[kv][file][rotation]") {
  const HeadType plain = parse_head_type("q4_0", "", "t"), had = parse_head_type("q4_0+hadamard", "", "t");
  CHECK(plain.name == "q4_0");
  CHECK_FALSE(plain.rotate);
  CHECK(had.name == "q4_0");
  CHECK(had.rotate == RotationKind::hadamard);
  CHECK(parse_head_type("tq3nc+random", "", "t").rotate == RotationKind::random);
  CHECK_THROWS_WITH(parse_head_type("q4_0+none", "calib.json", "layers[0].heads[1].ggml_types[0]"),
                    Catch::Contains("layers[0].heads[1].ggml_types[0] = q4_0+none"));
  CHECK_THROWS_AS(parse_head_type("q9_9+hadamard", "", "t"), InvalidInput);

  test::TempDir dir;
  SynthOptions so = test::synth_shape(4, 2, 64, 100, 8, 2);
  const std::string dump = dir.file("d.h5");
  write_synth_dump(dump, so, {});
  const DumpReader dr(dump);
  const std::size_t L = dr.meta().n_layers, H = dr.meta().n_kv_heads;
  CompressParams typed = *resolve_method_spec("ggml:types=calib.json");
  GgmlCacheParams g = *typed.ggml();
  for (std::size_t i = 0; i < L * H; ++i) {
    g.head_types.push_back(i % 2 == 0 ? std::pair<std::string, std::string>{"q4_0+hadamard", "q4_0"}
                                      : std::pair<std::string, std::string>{"q4_0", "q4_0+random"});
  }
  typed.mode = g;
  CHECK(g.rotates_heads());
  const std::map<std::string, std::string> refs = {{"hadamard", "ggml:k=q4_0:v=q4_0:rotate=hadamard"},
                                                   {"none", "ggml:k=q4_0:v=q4_0"},
                                                   {"random", "ggml:k=q4_0:v=q4_0:rotate=random"}};
  for (const auto& [name, spec] : refs) compress_dump(dump, dir.file(name + ".h5"), *resolve_method_spec(spec), 1, {});
  compress_dump(dump, dir.file("typed.h5"), typed, 2, {});
  const CacheReader r(dir.file("typed.h5")), rh(dir.file("hadamard.h5")), rn(dir.file("none.h5")), rr(dir.file("random.h5"));
  CHECK(r.version() == kCacheVersionRotation);
  CHECK(r.header().params.to_json() == typed.to_json());
  for (std::size_t l = 0; l < L; ++l) {
    for (std::size_t h = 0; h < H; ++h) {
      INFO("layer " << l << " head " << h);
      const HeadCache got = r.read_head(l, h);
      const HeadCache key_ref = (h % 2 == 0 ? rh : rn).read_head(l, h), value_ref = (h % 2 == 0 ? rn : rr).read_head(l, h);
      CHECK(got.key.ggml_blocks() == key_ref.key.ggml_blocks());
      CHECK(got.key.rotation() == key_ref.key.rotation());
      CHECK(got.value.ggml_blocks() == value_ref.value.ggml_blocks());
      CHECK(got.value.rotation() == value_ref.value.rotation());
    }
  }
  CHECK(r.read_head(0, 0).key.rotation().active());
  CHECK_FALSE(r.read_head(0, 1).key.rotation().active());
}

TEST_CASE("nuq heads: pre-RoPE codes, the row-by-row builder equals the whole prompt, RoPE after decoding, bytes",
          "[kv][head][nuq]") {
  const std::size_t n = 200, d = 64;
  const HeadData h = make_head(n, d, 9, true);
  QuantParams p;
  p.method = Quantizer::nuq;
  p.key.bits = 3;
  p.value.bits = 4;
  p.residual = 0;
  p.pre_rope = true;
  p.nuq_key = std::make_shared<const NuqTable>(
      nuq_table(calibrate_nuq(h.pre.data(), n, d, 3, true, 0.99, 1), 0.99, 1, 0, d));
  p.nuq_value = std::make_shared<const NuqTable>(
      nuq_table(calibrate_nuq(h.value.data(), n, d, 4, false, 0.99, 1), 0.99, 1, 0, 0));
  const HeadCache c = compress_head(input(h), p), r = compress_head_ref(input(h), p);
  CHECK(c.key.pre_rope());
  CHECK(c.key.nuq_rows().codes == r.key.nuq_rows().codes);
  CHECK(c.value.nuq_rows().outlier_value == r.value.nuq_rows().outlier_value);
  // The stored rows are nuq_encode's of the pre-RoPE keys and the values.
  NuqRows want_k, want_v;
  nuq_encode(*p.nuq_key, h.pre.data(), n, d, want_k);
  nuq_encode(*p.nuq_value, h.value.data(), n, d, want_v);
  CHECK(c.key.nuq_rows().codes == want_k.codes);
  CHECK(c.key.nuq_rows().outlier_channel == want_k.outlier_channel);
  CHECK(c.value.nuq_rows().offset == want_v.offset);
  CHECK(c.key.rows() == n);
  // Rebuilt keys: the decoded pre-RoPE rows, then RoPE at their positions.
  RopeTable t(d, 10000.0, 0, n);
  std::vector<float> k(n * d), v(n * d), want(n * d);
  reconstruct_head(c, {RopeLayout::rotate_half, &t}, k.data(), v.data());
  nuq_decode(want_k.view(*p.nuq_key), d, 0, n, want.data());
  apply_rope(want.data(), n, 0, RopeLayout::rotate_half, t);
  CHECK(k == want);
  CHECK(rel_mse(h.key, k) < 0.02);
  CHECK(rel_mse(h.value, v) < 0.01);
  // A runtime builder fed one row at a time stores the same codes, and attention reads the rows
  // reconstruct_head rebuilds.
  const RopeContext rope{RopeLayout::rotate_half, &t};
  TensorBuilder kb(d, p.nuq_key, true, &rope);
  for (std::size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<std::int32_t>(i);
    kb.append(h.pre.data() + i * d, h.key.data() + i * d, &pos, 1);
  }
  CHECK(kb.stored().nuq_rows().codes == want_k.codes);
  const TensorView view = kb.view();
  REQUIRE(view.dense.rows == n);
  const auto* mirror = static_cast<const float*>(view.dense.data);
  CHECK(std::vector<float>(mirror, mirror + n * d) == k);
  // Honest bytes: codes, the tables and value offsets/ranges, the sink rows, the sparse outliers.
  const CacheBytes b = c.bytes();
  CHECK(b.codes == (n - 1) * (d * 3 / 8 + d * 4 / 8));
  CHECK(b.scales == p.nuq_key->bytes() + p.nuq_value->bytes() + 8 * (n - 1));
  CHECK(b.residual == 2 * 2 * d);
  CHECK(b.outliers == 2 * (want_k.outlier_value.size() + want_v.outlier_value.size()));
  CHECK(b.indices == 2 * (want_k.outlier_channel.size() + want_v.outlier_channel.size() + 2 * (n - 1)));
}
