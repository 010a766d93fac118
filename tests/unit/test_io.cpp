#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "akv/core/errors.h"
#include "akv/io/dump.h"
#include "akv/io/hdf5.h"
#include "akv/io/inspect.h"
#include "akv/io/json_file.h"
#include "akv/tensor/half.h"
#include "test_util.h"

using namespace akv;

namespace {

DumpMeta small_meta() {
  DumpMeta m;
  m.model = "unit";
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 8;
  m.n_tokens = 40;
  m.n_query = 5;
  m.rope_theta = 10000.0;
  m.rope_layout = RopeLayout::interleaved;
  return m;
}

float pattern(std::size_t layer, int field, std::size_t i) {
  return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(layer) +
                  0.5f * static_cast<float>(field)) * 3.0f;
}

Tensor3 filled(std::size_t h, std::size_t r, std::size_t d, std::size_t layer, int field) {
  Tensor3 t(h, r, d);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = pattern(layer, field, i);
  return t;
}

// Writes a complete small dump; returns its meta.
DumpMeta write_small(const std::string& path, DType dtype, bool pre_rope = false) {
  DumpMeta m = small_meta();
  DumpWriteOptions o;
  o.dtype = dtype;
  o.key_pre_rope = pre_rope;
  DumpWriter w(path, m, o);
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    w.write(l, DumpField::key, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 0));
    w.write(l, DumpField::value, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 1));
    w.write(l, DumpField::query, 0, filled(m.n_heads, m.n_query, m.head_dim, l, 2));
    if (pre_rope) {
      w.write(l, DumpField::key_pre_rope, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 3));
    }
  }
  w.write_tokens(std::vector<std::int32_t>(m.n_tokens, 7));
  w.write_needles({3, 17});
  w.commit();
  return m;
}

// Opens a committed dump read-write to damage it.
struct Editor {
  explicit Editor(const std::string& path) : file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    REQUIRE(file.valid());
  }
  void replace(const std::string& ds, std::vector<hsize_t> shape, hid_t type) {
    H5Ldelete(file.get(), ds.c_str(), H5P_DEFAULT);
    h5::Space s(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
    h5::Dataset d(H5Dcreate2(file.get(), ds.c_str(), type, s.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT));
    REQUIRE(d.valid());
  }
  h5::File file;
};

template <typename E>
std::string error_of(const std::string& path) {
  try {
    DumpReader r(path);
    for (std::size_t l = 0; l < r.meta().n_layers; ++l) {
      for (auto f : {DumpField::key, DumpField::value, DumpField::query}) r.read(l, f);
    }
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an error from " << path);
  return {};
}

}  // namespace

TEST_CASE("dump round trip for every storage type", "[io][dump]") {
  test::TempDir dir;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const std::string path = dir.file("d-" + dtype_name(dt) + ".h5");
    DumpMeta m = write_small(path, dt, true);
    DumpReader r(path);
    CHECK(r.meta().n_layers == m.n_layers);
    CHECK(r.meta().n_heads == m.n_heads);
    CHECK(r.meta().n_kv_heads == m.n_kv_heads);
    CHECK(r.meta().head_dim == m.head_dim);
    CHECK(r.meta().n_tokens == m.n_tokens);
    CHECK(r.meta().n_query == m.n_query);
    CHECK(r.meta().rope_layout == RopeLayout::interleaved);
    CHECK(r.meta().model == "unit");
    CHECK(r.has_key_pre_rope());
    REQUIRE(r.tokens());
    CHECK(r.tokens()->size() == m.n_tokens);
    REQUIRE(r.needles());
    CHECK(*r.needles() == std::vector<std::int32_t>{3, 17});
    // Tolerance: exact for f32, half an ulp of the storage type otherwise.
    const double rel = dt == DType::f32 ? 0.0 : dt == DType::f16 ? 1.0 / 2048 : 1.0 / 256;
    for (std::size_t l = 0; l < m.n_layers; ++l) {
      Tensor3 k = r.read(l, DumpField::key);
      Tensor3 q = r.read(l, DumpField::query);
      REQUIRE(k.dim0() == m.n_kv_heads);
      REQUIRE(q.dim0() == m.n_heads);
      REQUIRE(q.dim1() == m.n_query);
      for (std::size_t i = 0; i < k.size(); ++i) {
        REQUIRE(std::fabs(k.data()[i] - pattern(l, 0, i)) <=
                rel * std::fabs(pattern(l, 0, i)) + 1e-7);
      }
      for (std::size_t i = 0; i < q.size(); ++i) {
        REQUIRE(std::fabs(q.data()[i] - pattern(l, 2, i)) <=
                rel * std::fabs(pattern(l, 2, i)) + 1e-7);
      }
      // One head on its own equals the same head read with the others.
      Tensor3 v1 = r.read(l, DumpField::value, 1, 1);
      Tensor3 v = r.read(l, DumpField::value);
      for (std::size_t i = 0; i < v1.size(); ++i) {
        REQUIRE(v1.data()[i] == v.data()[m.n_tokens * m.head_dim + i]);
      }
    }
  }
}

TEST_CASE("sliding windows: recorded per local layer, read back, checked against the tokens", "[io][dump]") {
  test::TempDir dir;
  DumpMeta m = small_meta();  // 40 tokens
  m.layer_window = {0, 16};
  {
    DumpWriter w(dir.file("w.h5"), m, {});
    for (std::size_t l = 0; l < m.n_layers; ++l) {
      w.write(l, DumpField::key, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 0));
      w.write(l, DumpField::value, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 1));
      w.write(l, DumpField::query, 0, filled(m.n_heads, m.n_query, m.head_dim, l, 2));
    }
    w.commit();
  }
  {
    const DumpReader r(dir.file("w.h5"));
    CHECK(r.meta().layer_window == std::vector<std::size_t>{0, 16});
    CHECK_THROWS_WITH(require_windows_hold_tokens(r.meta(), "w.h5", "compression"),
                      Catch::Contains("layer 1 attends within 16 of the 40 tokens") &&
                          Catch::Contains("(w.h5: /layers/1.sliding_window = 16)"));
  }
  m.layer_window = {0, 40};  // a window that holds every token: global
  CHECK_NOTHROW(require_windows_hold_tokens(m, "w.h5", "compression"));
  // Dumps without windows read as before; a window that is not positive is refused.
  write_small(dir.file("plain.h5"), DType::f32);
  CHECK(DumpReader(dir.file("plain.h5")).meta().layer_window.empty());
  {
    Editor e(dir.file("w.h5"));
    const h5::Group g(H5Gopen2(e.file.get(), "/layers/1", H5P_DEFAULT));
    h5::write_attr_int(g.get(), "sliding_window", 0);
  }
  CHECK_THAT(error_of<InvalidInput>(dir.file("w.h5")), Catch::Contains("/layers/1.sliding_window = 0"));
  m.layer_window = {16};  // one window for two layers
  CHECK_THROWS_AS(DumpWriter(dir.file("x.h5"), m, {}), InvalidInput);
}

TEST_CASE("f16 dumps store exactly the f16 rounding", "[io][dump]") {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_small(path, DType::f16);
  DumpReader r(path);
  Tensor3 k = r.read(1, DumpField::key);
  for (std::size_t i = 0; i < k.size(); ++i) {
    REQUIRE(k.data()[i] == f16_to_f32_ref(f32_to_f16_ref(pattern(1, 0, i))));
  }
}

TEST_CASE("an incomplete writer leaves no file", "[io][dump]") {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  {
    DumpWriter w(path, small_meta(), {});
    w.write(0, DumpField::key, 0, filled(2, 40, 8, 0, 0));
    CHECK_THROWS_AS(w.commit(), InvalidInput);
  }
  CHECK(dir.entries() == 0);
  {
    DumpWriter w(path, small_meta(), {});
    CHECK_THROWS_AS(w.write(0, DumpField::key, 1, filled(2, 40, 8, 0, 0)), InvalidInput);
  }
  CHECK(dir.entries() == 0);
}

TEST_CASE("dump reader validation names what is wrong", "[io][dump][bad]") {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");

  SECTION("missing file is an I/O error") {
    CHECK_THROWS_AS(DumpReader(dir.file("nope.h5")), IoError);
  }
  SECTION("not HDF5") {
    std::ofstream(path) << "this is not an HDF5 file, just text\n";
    CHECK_THAT(error_of<CorruptData>(path), Catch::Contains("not an HDF5 file"));
  }
  SECTION("truncated") {
    write_small(path, DType::f32);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
    CHECK_THAT(error_of<CorruptData>(path), Catch::Contains("truncated"));
  }
  SECTION("wrong format and version") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      h5::write_attr_int(e.file.get(), "version", 2);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("version = 2"));
    {
      Editor e(path);
      h5::write_attr_string(e.file.get(), "format", "akv-cache");
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("format = akv-cache"));
  }
  SECTION("missing attribute") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      H5Adelete(e.file.get(), "rope_theta");
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("missing attribute") &&
                                                 Catch::Contains("rope_theta"));
  }
  SECTION("n_heads not a multiple of n_kv_heads") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      h5::write_attr_int(e.file.get(), "n_heads", 5);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("n_heads = 5"));
  }
  SECTION("wrong shape names layer, dataset and shape") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      e.replace("/layers/1/key", {3, 40, 8}, H5T_IEEE_F32LE);
    }
    CHECK_THAT(error_of<InvalidInput>(path),
               Catch::Contains("layer 1 key has 3 kv heads, meta says 2") &&
                   Catch::Contains("/layers/1/key.shape = [3, 40, 8]"));
  }
  SECTION("wrong rank") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      e.replace("/layers/0/value", {2, 320}, H5T_IEEE_F32LE);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("rank 3"));
  }
  SECTION("query positions differ between layers") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      e.replace("/layers/1/query", {4, 6, 8}, H5T_IEEE_F32LE);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("layer 1 query"));
  }
  SECTION("missing dataset") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      H5Ldelete(e.file.get(), "/layers/1/value", H5P_DEFAULT);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("missing dataset") &&
                                                 Catch::Contains("/layers/1/value"));
  }
  SECTION("unsupported dtype") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      e.replace("/layers/0/key", {2, 40, 8}, H5T_STD_I32LE);
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("unsupported dtype"));
  }
  SECTION("needle out of range") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      H5Ldelete(e.file.get(), "/needles", H5P_DEFAULT);
      h5::write_int32_vector(e.file.get(), "/needles", {5, 40});
    }
    CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("/needles[1] = 40"));
  }
  SECTION("NaN and Inf are located") {
    write_small(path, DType::f32);
    {
      Editor e(path);
      h5::Dataset d(H5Dopen2(e.file.get(), "/layers/1/value", H5P_DEFAULT));
      h5::Space fs(H5Dget_space(d.get()));
      hsize_t start[3] = {1, 17, 3}, count[3] = {1, 1, 1};
      H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::Space ms(H5Screate_simple(3, count, nullptr));
      float nan = NAN;
      H5Dwrite(d.get(), H5T_NATIVE_FLOAT, ms.get(), fs.get(), H5P_DEFAULT, &nan);
    }
    CHECK_THAT(error_of<InvalidInput>(path),
               Catch::Contains("layer 1 head 1 token 17") &&
                   Catch::Contains("/layers/1/value[1, 17, 3] = nan"));
  }
}

TEST_CASE("parse_json: nesting past kMaxJsonDepth is refused at the parser, naming the file", "[io][json][bad]") {
  auto nested = [](int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); };
  CHECK(parse_json(nested(kMaxJsonDepth), "f.json", "x").is_array());
  CHECK_THROWS_WITH(parse_json(nested(kMaxJsonDepth + 1), "f.json", "x"),
                    Catch::Contains("deeper than 64 levels") && Catch::Contains("f.json"));
  // 10^6 levels: no recursion anywhere (parse, the error, destruction of what was built).
  CHECK_THROWS_AS(parse_json(nested(1000000), "f.json", "x"), CorruptData);
  const std::string objects = "{\"a\": " + nested(200) + "}";
  CHECK_THROWS_AS(parse_json<nlohmann::ordered_json>(objects, "f.json", "x"), CorruptData);
  std::istringstream in("{\"b\": 1, \"a\": [2]}");
  CHECK(parse_json<nlohmann::ordered_json>(in, "f.json", "x").dump() == "{\"b\":1,\"a\":[2]}");
  CHECK_THROWS_WITH(parse_json("{\"a\": ", "g.json", "budgets file"), Catch::Contains("budgets file is not JSON (g.json)"));
  test::TempDir dir;
  CHECK_THROWS_WITH(read_json_file(dir.path().string(), "budgets", "akv-budgets", 1), Catch::Contains("budgets file is a directory"));
}

TEST_CASE("json_errors_as: a missing or mistyped field as the file's error; json_map, json_grid", "[io][json][bad]") {
  const nlohmann::json j = {{"n", 3}, {"s", "x"}};
  CHECK(json_errors_as<CorruptData>("bad file", {"f.json"}, [&] { return j.at("n").get<int>(); }) == 3);
  try {
    json_errors_as<CorruptData>("bad file", {"f.json", "n"}, [&] { return j.at("missing").get<int>(); });
    FAIL("a missing field passed");
  } catch (const CorruptData& e) {
    CHECK(e.message() == "bad file: [json.exception.out_of_range.403] key 'missing' not found");
    CHECK(e.where().file == "f.json");
    CHECK(e.where().field == "n");
  }
  CHECK_THROWS_WITH(json_errors_as<InvalidInput>("bad part", {"p.json"}, [&] { return j.at("s").get<int>(); }),
                    Catch::StartsWith("bad part: [json.exception.type_error.302]") && Catch::Contains("(p.json)"));
  CHECK_THROWS_AS(json_errors_as<InvalidInput>("bad part", {"p.json"}, [&] { return j.at("s").get<int>(); }), InvalidInput);
  // Errors of the reader's own pass through as they are.
  CHECK_THROWS_AS(json_errors_as<CorruptData>("bad file", {"f.json"}, [] { throw IoError("disk"); }), IoError);

  CHECK(json_map(std::vector<int>{1, 2, 5}, [](int x) { return 2 * x; }) == nlohmann::json::parse("[2, 4, 10]"));
  CHECK(json_map(std::vector<int>{}, [](int x) { return x; }) == nlohmann::json::array());
  CHECK(json_grid(2, 3, [](std::size_t r, std::size_t c) { return 10 * r + c; }) ==
        nlohmann::json::parse("[[0, 1, 2], [10, 11, 12]]"));
  CHECK(json_grid(2, 0, [](std::size_t, std::size_t) { return 0; }) == nlohmann::json::parse("[[], []]"));
  CHECK(json_grid(0, 3, [](std::size_t, std::size_t) { return 0; }) == nlohmann::json::array());
}

TEST_CASE("h5::create names the output, not its temporary file", "[io][bad]") {
  test::TempDir dir;
  CHECK_THROWS_WITH(h5::create(dir.file("gone/.out.h5.akv-tmp-1"), dir.file("out.h5")),
                    Catch::Contains("cannot create HDF5 file (" + dir.file("out.h5") + ")"));
}

TEST_CASE("inspect_file describes a dump", "[io][inspect]") {
  test::TempDir dir;
  const std::string path = dir.file("d.h5");
  write_small(path, DType::f16, true);
  nlohmann::json j = inspect_file(path);
  CHECK(j["kind"] == "dump");
  CHECK(j["version"] == 1);
  CHECK(j["n_layers"] == 2);
  CHECK(j["layers"][1]["key"]["dtype"] == "f16");
  CHECK(j["layers"][1]["key"]["shape"] == nlohmann::json({2, 40, 8}));
  CHECK(j["layers"][0]["key"]["bytes"] == 2 * 40 * 8 * 2);
  CHECK(j["optional"]["key_pre_rope"] == true);
  CHECK(j["optional"]["tokens"] == true);
  CHECK(j["kv_bytes_f16"] == 2 * 2 * 2 * 2 * 40 * 8);
  std::string text = render_info(j);
  CHECK_THAT(text, Catch::Contains("akv-dump v1") && Catch::Contains("f16 [2x40x8]"));
}

TEST_CASE("o_proj: written in the dump's dtype, read back, and refused when malformed", "[io][dump]") {
  test::TempDir dir;
  const DumpMeta m = small_meta();
  RowMatrix wo(6, static_cast<Eigen::Index>(m.n_heads * m.head_dim));
  for (Eigen::Index i = 0; i < wo.size(); ++i) wo.data()[i] = pattern(0, 4, static_cast<std::size_t>(i));
  auto write = [&](const std::string& path, DType dt, bool all_layers) {
    DumpWriteOptions o;
    o.dtype = dt;
    o.out_proj_hidden = 6;
    DumpWriter w(path, m, o);
    for (std::size_t l = 0; l < m.n_layers; ++l) {
      w.write(l, DumpField::key, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 0));
      w.write(l, DumpField::value, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 1));
      w.write(l, DumpField::query, 0, filled(m.n_heads, m.n_query, m.head_dim, l, 2));
      if (all_layers || l == 0) w.write_out_proj(l, wo);
    }
    w.commit();
  };
  for (DType dt : {DType::f32, DType::f16}) {
    const std::string path = dir.file("o-" + dtype_name(dt) + ".h5");
    write(path, dt, true);
    const DumpReader r(path);
    REQUIRE(r.has_out_proj());
    const RowMatrix back = r.read_out_proj(1);
    REQUIRE(back.rows() == 6);
    for (Eigen::Index i = 0; i < wo.size(); ++i) {
      const float want = dt == DType::f32 ? wo.data()[i] : f16_to_f32_ref(f32_to_f16_ref(wo.data()[i]));
      CHECK(back.data()[i] == want);
    }
  }
  const std::string path = dir.file("o.h5");
  CHECK_THROWS_WITH(write(path, DType::f32, false), Catch::Contains("o_proj was not written"));
  CHECK_FALSE(std::filesystem::exists(path));
  write(path, DType::f32, true);
  {
    Editor e(path);
    e.replace("/layers/1/o_proj", {6, 31}, H5T_IEEE_F32LE);
  }
  CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("o_proj must be [hidden, n_heads * head_dim = 32]") &&
                                               Catch::Contains("/layers/1/o_proj.shape = [6, 31]"));
  {
    Editor e(path);
    H5Ldelete(e.file.get(), "/layers/1/o_proj", H5P_DEFAULT);
  }
  CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("every layer or in none") && Catch::Contains("/layers/1/o_proj"));
  {
    Editor e(path);
    RowMatrix bad = wo;
    bad(2, 5) = NAN;
    h5::write_dataset(e.file.get(), "/layers/1/o_proj", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {6, 32}, bad.data());
  }
  CHECK_THROWS_WITH(DumpReader(path).read_out_proj(1), Catch::Contains("/layers/1/o_proj[2, 5]") && Catch::Contains("non-finite"));
}

TEST_CASE("attn_input and kvzip_plus: written, read back (scores always f32), and refused when malformed",
          "[io][dump]") {
  test::TempDir dir;
  const DumpMeta m = small_meta();
  RowMatrix x(static_cast<Eigen::Index>(m.n_tokens), 5);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = pattern(0, 5, static_cast<std::size_t>(i));
  std::vector<std::vector<double>> s(m.n_kv_heads, std::vector<double>(m.n_tokens));
  for (std::size_t h = 0; h < s.size(); ++h) {
    for (std::size_t t = 0; t < m.n_tokens; ++t) s[h][t] = 1e-7 * static_cast<double>(1 + h * m.n_tokens + t);
  }
  auto write = [&](const std::string& path, DType dt, bool scores) {
    DumpWriteOptions o;
    o.dtype = dt;
    o.input_dim = 5;
    o.kvzip_plus = true;
    DumpWriter w(path, m, o);
    for (std::size_t l = 0; l < m.n_layers; ++l) {
      w.write(l, DumpField::key, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 0));
      w.write(l, DumpField::value, 0, filled(m.n_kv_heads, m.n_tokens, m.head_dim, l, 1));
      w.write(l, DumpField::query, 0, filled(m.n_heads, m.n_query, m.head_dim, l, 2));
      w.write_attn_input(l, x);
      if (scores) w.write_kvzip_plus(l, s);
    }
    w.commit();
  };
  const std::string path = dir.file("zap.h5");
  write(path, DType::f16, true);
  {
    const DumpReader r(path);
    REQUIRE(r.has_matrix(DumpMatrix::attn_input));
    REQUIRE(r.has_matrix(DumpMatrix::kvzip_plus));
    CHECK_FALSE(r.has_out_proj());
    CHECK(r.input_dim() == 5);
    const RowMatrix back = r.read_matrix(1, DumpMatrix::attn_input);
    REQUIRE(back.rows() == static_cast<Eigen::Index>(m.n_tokens));
    for (Eigen::Index i = 0; i < x.size(); ++i) CHECK(back.data()[i] == f16_to_f32_ref(f32_to_f16_ref(x.data()[i])));
    const RowMatrix sb = r.read_matrix(0, DumpMatrix::kvzip_plus);  // f32: no f16 underflow
    REQUIRE(sb.rows() == static_cast<Eigen::Index>(m.n_kv_heads));
    CHECK(sb(1, 3) == static_cast<float>(s[1][3]));
  }
  const std::string partial = dir.file("partial.h5");
  CHECK_THROWS_WITH(write(partial, DType::f32, false), Catch::Contains("kvzip_plus was not written"));
  CHECK_FALSE(std::filesystem::exists(partial));
  {
    Editor e(path);
    e.replace("/layers/1/attn_input", {m.n_tokens, 6}, H5T_IEEE_F32LE);
  }
  CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("attn_input must be [n_tokens = 40, hidden], as in layer 0") &&
                                               Catch::Contains("/layers/1/attn_input.shape = [40, 6]"));
  {
    Editor e(path);
    e.replace("/layers/1/attn_input", {m.n_tokens, 5}, H5T_IEEE_F32LE);
    e.replace("/layers/0/kvzip_plus", {m.n_kv_heads, m.n_tokens - 1}, H5T_IEEE_F32LE);
  }
  CHECK_THAT(error_of<InvalidInput>(path), Catch::Contains("kvzip_plus must be [n_kv_heads = 2, n_tokens = 40]") &&
                                               Catch::Contains("/layers/0/kvzip_plus.shape = [2, 39]"));
}
