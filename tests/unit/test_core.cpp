#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "akv/core/atomic_file.h"
#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/core/exp.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"
#include "akv/core/sort.h"
#include "akv/core/version.h"
#include "test_util.h"

using namespace akv;

TEST_CASE("error messages name file, field and value", "[core][errors]") {
  CHECK(format_error("bad", {}) == "bad");
  CHECK(format_error("bad", {"f.h5"}) == "bad (f.h5)");
  CHECK(format_error("bad", {"f.h5", "version"}) == "bad (f.h5: version)");
  CHECK(format_error("bad", {"f.h5", "version", "2"}) == "bad (f.h5: version = 2)");
  CHECK(format_error("bad", {"", "--bits", "5"}) == "bad (--bits = 5)");
  InvalidInput e("wrong shape", {"d.h5", "/layers/3/key.shape", "[7, 10, 64]"});
  CHECK(std::string(e.what()) == "wrong shape (d.h5: /layers/3/key.shape = [7, 10, 64])");
}

TEST_CASE("excerpt keeps quoted input on one short line", "[core][errors]") {
  CHECK(excerpt("n_layers") == "n_layers");
  CHECK(excerpt("a\nb\tc\x01") == "a\\nb\\tc\\x01");
  const std::string huge(50u << 20, '7');
  const std::string e = excerpt(huge);
  CHECK(e.size() < 260);
  CHECK(e.find("777...777") != std::string::npos);
  CHECK(e.ends_with("777 (52428800 bytes)"));
  // format_error applies it to the field and value; file paths are escaped but not cut.
  const std::string msg = InvalidInput("bad token", {"t.txt", "line 1", huge}).what();
  CHECK(msg.size() < 400);
  CHECK(msg.find("bad token (t.txt: line 1 = 7777") == 0);
}

TEST_CASE("error types map to exit codes", "[core][errors]") {
  CHECK(UsageError("x").exit_code() == ExitCode::usage);
  CHECK(InvalidInput("x").exit_code() == ExitCode::invalid_input);
  CHECK(CorruptData("x").exit_code() == ExitCode::invalid_input);
  CHECK(IoError("x").exit_code() == ExitCode::io);
  CHECK(static_cast<int>(ExitCode::usage) == 1);
  CHECK(static_cast<int>(ExitCode::invalid_input) == 2);
  CHECK(static_cast<int>(ExitCode::io) == 3);
}

TEST_CASE("AtomicOutput shows the file only after commit", "[core][atomic]") {
  test::TempDir dir;
  const std::string target = dir.file("out.bin");
  {
    AtomicOutput out(target);
    std::ofstream(out.temp_path()) << "partial";
    CHECK(std::filesystem::exists(out.temp_path()));
    CHECK_FALSE(std::filesystem::exists(target));
    CHECK(std::filesystem::path(out.temp_path()).parent_path() ==
          std::filesystem::path(target).parent_path());
  }
  CHECK(dir.entries() == 0);  // uncommitted: temporary removed, target never appeared
  {
    AtomicOutput out(target);
    std::ofstream(out.temp_path()) << "complete";
    out.commit();
  }
  CHECK(dir.entries() == 1);
  std::ifstream in(target);
  std::string s;
  in >> s;
  CHECK(s == "complete");
}

TEST_CASE("AtomicOutput creates its temporary file exclusively, under a name nobody can plant", "[core][atomic]") {
  namespace fs = std::filesystem;
  test::TempDir dir;
  const std::string target = dir.file("out.bin");
  // Links planted under every name the older pid-and-counter scheme would have used.
  std::ofstream(dir.file("victim")) << "keep";
  for (int i = 0; i < 64; ++i) {
    fs::create_symlink(dir.file("victim"), dir.file(".out.bin.akv-tmp-" + std::to_string(::getpid()) + "-" + std::to_string(i)));
  }
  AtomicOutput a(target), b(target);
  CHECK(a.temp_path() != b.temp_path());
  for (const AtomicOutput* o : {&a, &b}) {
    const fs::file_status st = fs::symlink_status(o->temp_path());
    CHECK(fs::is_regular_file(st));  // created by the constructor, not a link
    CHECK(fs::file_size(o->temp_path()) == 0);
  }
  std::ofstream(a.temp_path()) << "new";
  a.commit();
  std::ifstream victim(dir.file("victim"));
  std::string s;
  victim >> s;
  CHECK(s == "keep");
}

TEST_CASE("AtomicOutput refuses a missing directory", "[core][atomic]") {
  test::TempDir dir;
  CHECK_THROWS_AS(AtomicOutput(dir.file("no/such/dir/x")), IoError);
  CHECK_THROWS_AS(AtomicOutput(dir.path().string()), IoError);
}

TEST_CASE("write_text_file is atomic and complete", "[core][atomic]") {
  test::TempDir dir;
  write_text_file(dir.file("a.json"), "{\"x\": 1}\n");
  std::ifstream in(dir.file("a.json"));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(s == "{\"x\": 1}\n");
  CHECK(dir.entries() == 1);
}

TEST_CASE("parallel_for visits every index once for any thread count", "[core][parallel]") {
  for (int threads : {1, 2, 3, 8}) {
    for (std::size_t n : {0u, 1u, 5u, 100u}) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, threads, [&](std::size_t i) { hits[i]++; });
      for (std::size_t i = 0; i < n; ++i) CHECK(hits[i].load() == 1);
    }
  }
}

TEST_CASE("parallel_for rethrows the first error", "[core][parallel]") {
  auto run = [] {
    parallel_for(50, 4, [](std::size_t i) {
      if (i == 17) throw InvalidInput("item 17");
    });
  };
  CHECK_THROWS_AS(run(), InvalidInput);
  CHECK(resolve_threads(3) == 3);
  CHECK(resolve_threads(0) >= 1);
}

TEST_CASE("parallel_for nests, runs from several threads at once, and reuses its pool", "[core][parallel]") {
  // Nested: inner calls run inside pool threads (they start their own threads).
  std::vector<std::atomic<int>> hits(12 * 7);
  parallel_for(12, 3, [&](std::size_t i) {
    parallel_for(7, 2, [&](std::size_t j) { hits[i * 7 + j]++; });
  });
  for (auto& h : hits) CHECK(h.load() == 1);
  // Concurrent callers: one holds the pool, the others start their own threads.
  std::vector<std::atomic<long>> sums(4);
  std::vector<std::thread> callers;
  for (std::size_t c = 0; c < sums.size(); ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 50; ++rep) parallel_for(64, 3, [&](std::size_t i) { sums[c] += static_cast<long>(i); });
    });
  }
  for (auto& t : callers) t.join();
  for (auto& s : sums) CHECK(s.load() == 50L * (63 * 64 / 2));
  // Many short calls, an error in between: the pool keeps working.
  long total = 0;
  std::mutex m;
  for (int rep = 0; rep < 500; ++rep) {
    if (rep == 250) CHECK_THROWS_AS(parallel_for(8, 2, [](std::size_t) { throw InvalidInput("x"); }), InvalidInput);
    parallel_for(4, 2, [&](std::size_t i) {
      std::lock_guard<std::mutex> lock(m);
      total += static_cast<long>(i);
    });
  }
  CHECK(total == 500L * 6);
}

TEST_CASE("sort_values and stable_order agree with std::sort", "[core][sort]") {
  // Against std::sort of the values and of the (value, index) pairs: wide doubles, f32-exact ones
  // (32-bit keys), many ties, both zeros, infinities, denormals (of doubles and of floats), and
  // the sizes 0 to 3.
  Rng rng(7);
  const auto check = [](const std::vector<double>& x) {
    std::vector<double> mine = x, want = x;
    sort_values(mine);
    std::sort(want.begin(), want.end());
    REQUIRE(mine.size() == want.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(mine[i] == want[i]);  // -0 == +0: which zero std::sort puts first is unspecified
      if (i > 0 && mine[i] == 0.0 && mine[i - 1] == 0.0) CHECK_FALSE((std::signbit(mine[i]) && !std::signbit(mine[i - 1])));
    }
    std::vector<std::pair<double, std::size_t>> pairs(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) pairs[i] = {x[i], i};
    std::sort(pairs.begin(), pairs.end());
    const std::vector<std::uint32_t> order = stable_order(x);
    REQUIRE(order.size() == x.size());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(order[i] == pairs[i].second);
  };
  for (std::size_t n : {0, 1, 2, 3}) {
    std::vector<double> x(n);
    for (double& v : x) v = rng.normal();
    check(x);
  }
  std::vector<double> wide(5000), narrow(5000), ties(5000);
  for (double& v : wide) v = rng.normal() * std::exp(20.0 * rng.normal());
  for (double& v : narrow) v = static_cast<float>(rng.normal());
  for (double& v : ties) v = std::round(4.0 * rng.normal()) / 4.0;
  for (std::size_t i = 0; i < ties.size(); i += 7) ties[i] = i % 2 ? -0.0 : 0.0;
  const double inf = std::numeric_limits<double>::infinity(), tiny = std::numeric_limits<double>::denorm_min();
  ties.insert(ties.end(), {inf, -inf, tiny, -tiny, 5 * tiny, -0.0, 0.0, inf});
  std::vector<double> narrow_ties(5000);  // f32-exact, so sorted by 32-bit keys: ties, zeros, infinities, denormals
  for (double& v : narrow_ties) v = std::round(4.0 * rng.normal()) / 4.0;
  for (std::size_t i = 0; i < narrow_ties.size(); i += 7) narrow_ties[i] = i % 2 ? -0.0 : 0.0;
  const double ftiny = std::numeric_limits<float>::denorm_min();
  narrow_ties.insert(narrow_ties.end(), {inf, -inf, ftiny, -ftiny, 5 * ftiny, -0.0, 0.0, inf, 3.0e38, -3.0e38});
  check(wide);
  check(narrow);
  check(ties);
  check(narrow_ties);
  check(std::vector<double>(100, 1.5));
}

TEST_CASE("exp_f64 is within 1 ulp of std::exp, the same bits in the vector and the scalar loop", "[core][exp]") {
  // Against glibc's exp (itself within about half an ulp of e^x): what softmaxes feed it (x <= 0),
  // the whole finite range, the underflow through the denormals to 0, overflow, both zeros, the
  // infinities and the edges of the range reduction (+-ln2 / 2).
  Rng rng(11);
  std::vector<double> x;
  const auto add = [&](std::size_t n, double lo, double hi) {
    for (std::size_t i = 0; i < n; ++i) x.push_back(rng.uniform(lo, hi));
  };
  add(20000, -40, 0);
  add(20000, -745.2, 709.8);
  add(5000, -746, -700);
  add(5000, -1e-3, 1e-3);
  const double inf = std::numeric_limits<double>::infinity(), ln2 = std::log(2.0);
  x.insert(x.end(), {0.0, -0.0, std::numeric_limits<double>::denorm_min(), -inf, inf, -1e300, 1e300, 709.782712893384,
                     709.7827128933841, -745.1332191019411, -745.1332191019412, -708.3964185322641, ln2 / 2, -ln2 / 2,
                     std::nextafter(ln2 / 2, 1.0), -746.0, 710.0});
  const auto ordered = [](double v) {
    const auto b = std::bit_cast<std::int64_t>(v);
    return b < 0 ? std::numeric_limits<std::int64_t>::min() - b : b;
  };
  std::vector<double> y(x.size());
  exp_f64(x.data(), x.size(), y.data());
  std::size_t worse = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(x[i]);
    if (std::llabs(ordered(y[i]) - ordered(want)) > 1) {
      ++worse;
      UNSCOPED_INFO("x " << x[i] << ": " << y[i] << " against " << want);
    }
    if (std::bit_cast<std::uint64_t>(y[i]) != std::bit_cast<std::uint64_t>(exp_f64(x[i]))) ++worse;
  }
  CHECK(worse == 0);
  CHECK(exp_f64(0.0) == 1.0);
  CHECK(exp_f64(-inf) == 0.0);
  CHECK(exp_f64(-746.0) == 0.0);
  CHECK(exp_f64(inf) == inf);
  CHECK(std::isnan(exp_f64(std::nan(""))));
  // Every tail length and start, in place: the scalar function's bits.
  for (std::size_t n = 0; n <= 11; ++n) {
    for (std::size_t at = 0; at < 4; ++at) {
      std::vector<double> z(x.begin() + 100, x.begin() + 100 + static_cast<std::ptrdiff_t>(at + n));
      z.push_back(std::nan(""));
      const std::vector<double> in = z;
      exp_f64(z.data() + at, n, z.data() + at);
      for (std::size_t i = 0; i < at + n; ++i) {
        const double want = i < at ? in[i] : exp_f64(in[i]);
        CHECK(std::bit_cast<std::uint64_t>(z[i]) == std::bit_cast<std::uint64_t>(want));
      }
      CHECK(std::isnan(z.back()));
    }
  }
}

TEST_CASE("first_nonfinite finds the first NaN or infinity as a plain scan does", "[core][checked]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {inf, -inf, nan, -nan, std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc00001u)};
  const float finite[] = {0.0f, -0.0f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), 1.5f};
  const auto plain = [](const std::vector<float>& x) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) return i;
    }
    return x.size();
  };
  for (const std::size_t n : {0, 1, 255, 256, 257, 1000}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = finite[i % 6];
    CHECK(first_nonfinite(x.data(), n) == n);
    for (const std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, n - 1}) {
      if (at >= n) continue;
      for (const float v : special) {
        std::vector<float> y = x;
        y[at] = v;
        if (at + 300 < n) y[at + 300] = inf;  // a later one does not count
        INFO("n " << n << " at " << at << " value bits " << std::bit_cast<std::uint32_t>(v));
        CHECK(first_nonfinite(y.data(), n) == at);
        CHECK(first_nonfinite(y.data(), n) == plain(y));
      }
    }
  }
}

TEST_CASE("version is recorded", "[core][version]") {
  CHECK_FALSE(version().empty());
  CHECK_FALSE(git_commit().empty());
}
