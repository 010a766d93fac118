#include "akv/bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/version.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace akv {

double Samples::mean() const {
  if (seconds.empty()) return 0.0;
  return std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size());
}

double Samples::stdev() const {
  if (seconds.size() < 2) return 0.0;
  const double m = mean();
  double s = 0.0;
  for (double x : seconds) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(seconds.size() - 1));
}

double Samples::min() const {
  return seconds.empty() ? 0.0 : *std::min_element(seconds.begin(), seconds.end());
}

BenchEnv bench_env(int threads) {
  BenchEnv e;
  e.commit = git_commit();
  e.threads = threads;
  e.cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) e.cpu = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  return e;
}

namespace {

float sum_floats(const float* x, std::size_t n) {
  std::size_t i = 0;
  float s = 0.0f;
#if defined(__AVX2__)
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(x + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(x + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(x + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  for (float v : t) s += v;
#endif
  for (; i < n; ++i) s += x[i];
  return s;
}

// `iters` rounds of fused multiply-adds on 96 independent f32 chains (12 vectors of 8 lanes in
// registers, vectorized by the compiler), started from `seed`; returns their sum.
float fma_chains(long iters, float seed) {
  alignas(32) float a[96];
  for (int j = 0; j < 96; ++j) a[j] = seed + 0.001f * static_cast<float>(j);
  const float m = 0.999999f, c = 1e-7f;
  for (long i = 0; i < iters; ++i) {
    for (float& x : a) x = std::fma(x, m, c);
  }
  float s = 0.0f;
  for (float x : a) s += x;
  return s;
}

}  // namespace

Samples stream_read(std::size_t bytes, int threads, int warmup, int repeat) {
  const std::size_t n = bytes / sizeof(float);
  const auto workers = static_cast<std::size_t>(std::max(1, threads));
  std::vector<float> x(n);
  parallel_for(workers, threads, [&](std::size_t w) {  // first touch by the reading thread
    for (std::size_t i = w * n / workers; i < (w + 1) * n / workers; ++i) x[i] = static_cast<float>(i & 7);
  });
  std::vector<float> sink(workers);
  Samples t = measure(warmup, repeat, [&] {
    parallel_for(workers, threads, [&](std::size_t w) {
      const std::size_t a = w * n / workers, b = (w + 1) * n / workers;
      sink[w] = sum_floats(x.data() + a, b - a);
    });
  });
  volatile float keep = std::accumulate(sink.begin(), sink.end(), 0.0f);  // the sums are used
  (void)keep;
  Samples gbs;
  for (double s : t.seconds) gbs.seconds.push_back(static_cast<double>(n * sizeof(float)) / 1e9 / s);
  return gbs;
}

Samples fma_peak(int threads, int warmup, int repeat) {
  const auto workers = static_cast<std::size_t>(std::max(1, threads));
  constexpr long kIters = 200000;  // 19.2 M multiply-adds per thread, ~3 ms at 8 per ns
  std::vector<float> sink(workers);
  Samples t = measure(warmup, repeat, [&] {
    parallel_for(workers, threads, [&](std::size_t w) { sink[w] = fma_chains(kIters, 1.0f + static_cast<float>(w)); });
  });
  volatile float keep = std::accumulate(sink.begin(), sink.end(), 0.0f);  // the chains are used
  (void)keep;
  Samples g;
  for (double s : t.seconds) g.seconds.push_back(static_cast<double>(workers) * kIters * 96 / 1e9 / s);
  return g;
}

double relative_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < std::min(x.size(), ref.size()); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void check_close(const std::vector<float>& fast, const std::vector<float>& ref, double tol,
                 const std::string& what) {
  const double err = relative_error(fast, ref);
  if (fast.size() != ref.size() || !(err <= tol)) {
    throw InvalidInput("kernel check failed: fast path differs from the reference beyond " +
                           format_number(tol), {"", what, format_number(err)});
  }
}

void BenchReport::set_shard(const Shard& s, std::size_t cases) {
  shard_ = s;
  cases_ = cases;
}

void BenchReport::add(nlohmann::ordered_json row, const Samples& t) {
  nlohmann::ordered_json r;
  r["suite"] = suite_;
  r["commit"] = env_.commit;
  r["cpu"] = env_.cpu;
  r["threads"] = env_.threads;
  if (shard_) r["shard"] = shard_->k;
  for (auto it = row.begin(); it != row.end(); ++it) r[it.key()] = it.value();
  r["mean_s"] = t.mean();
  r["stdev_s"] = t.stdev();
  r["min_s"] = t.min();
  r["samples_s"] = t.seconds;
  rows_.push_back(std::move(r));
}

namespace {

std::string cell(const nlohmann::ordered_json& v, int precision) {
  if (v.is_number_float() && precision >= 0) return fmt::format("{:.{}f}", v.get<double>(), precision);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  return v.dump();
}

}  // namespace

std::string BenchReport::to_table(const std::vector<BenchColumn>& columns) const {
  std::string out = fmt::format("akv bench {}: commit {}, {}, {} threads\n", suite_, env_.commit,
                                env_.cpu, env_.threads);
  for (const auto& n : notes_) out += n + "\n";
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> width;
  for (const auto& c : columns) width.push_back(c.header.size());
  for (const auto& r : rows_) {
    std::vector<std::string> line;
    for (std::size_t i = 0; i < columns.size(); ++i) {
      line.push_back(r.contains(columns[i].key) ? cell(r[columns[i].key], columns[i].precision) : "-");
      width[i] = std::max(width[i], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  for (std::size_t i = 0; i < columns.size(); ++i) out += fmt::format("{:>{}} ", columns[i].header, width[i]);
  out.back() = '\n';
  for (const auto& line : cells) {
    for (std::size_t i = 0; i < line.size(); ++i) out += fmt::format("{:>{}} ", line[i], width[i]);
    out.back() = '\n';
  }
  return out;
}

std::string BenchReport::to_csv() const {
  if (rows_.empty()) return "";
  std::vector<std::string> keys;
  for (const auto& r : rows_) {
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
    }
  }
  auto quote = [](std::string s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  std::string out;
  for (const auto& k : keys) out += quote(k) + ",";
  out.back() = '\n';
  for (const auto& r : rows_) {
    for (const auto& k : keys) {
      std::string v;
      if (!r.contains(k)) {
        v = "";
      } else if (r[k].is_array()) {
        for (const auto& x : r[k]) v += (v.empty() ? "" : ";") + cell(x, -1);
      } else {
        v = cell(r[k], -1);
      }
      out += quote(v) + ",";
    }
    out.back() = '\n';
  }
  return out;
}

nlohmann::ordered_json BenchReport::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = shard_ ? "akv-bench-part" : "akv-bench";
  j["version"] = 1;
  j["suite"] = suite_;
  j["commit"] = env_.commit;
  j["cpu"] = env_.cpu;
  j["threads"] = env_.threads;
  j["params"] = params_;
  if (shard_) {
    j["shard"] = shard_->k;
    j["shards"] = shard_->n;
    j["cases"] = cases_;
    j["notes"] = notes_;
  }
  for (auto it = extra_.begin(); it != extra_.end(); ++it) j[it.key()] = it.value();
  j["rows"] = rows_;
  return j;
}

}  // namespace akv
