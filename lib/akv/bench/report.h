#pragma once
// Shared machinery of the `akv bench` suites: timing samples (warmup, N repeats, mean, stdev,
// min, raw samples), the environment every row carries (git commit, CPU model, threads), a
// stream-read bandwidth probe, and one report type printed as an aligned table, CSV or JSON.
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/shard.h"

namespace akv {

struct Samples {
  std::vector<double> seconds;
  double mean() const;
  double stdev() const;  // sample standard deviation (0 for one sample)
  double min() const;
};

template <typename Fn>
double time_once(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn `warmup` times untimed, then `repeat` timed times.
template <typename Fn>
Samples measure(int warmup, int repeat, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  Samples s;
  for (int i = 0; i < repeat; ++i) s.seconds.push_back(time_once(fn));
  return s;
}

struct BenchEnv {
  std::string commit, cpu;
  int threads = 1;
};
BenchEnv bench_env(int threads);  // CPU model from /proc/cpuinfo ("unknown" elsewhere)

// Read bandwidth (GB/s) of summing a `bytes` f32 buffer split over `threads` threads: the
// memory system's practical limit for a streaming kernel. Samples of one pass each.
Samples stream_read(std::size_t bytes, int threads, int warmup, int repeat);

// Peak f32 fused multiply-adds per second (billions) over `threads` threads, from independent
// chains kept in registers and vectorized as this build vectorizes (x86-64-v3: 256-bit): the
// compute limit of a kernel that needs one multiply-add per element and head. Samples of one
// pass each.
Samples fma_peak(int threads, int warmup, int repeat);

// Throws InvalidInput naming `what` when fast and reference results differ by more than `tol`
// (relative L2 error); every suite checks its kernels this way before timing.
// ||x - ref|| / ||ref|| (L2 over all elements).
double relative_error(const std::vector<float>& x, const std::vector<float>& ref);
void check_close(const std::vector<float>& fast, const std::vector<float>& ref, double tol,
                 const std::string& what);

struct BenchColumn {
  std::string key, header;
  int precision = -1;  // digits after the point for numbers; -1: as is
};

class BenchReport {
 public:
  BenchReport(std::string suite, BenchEnv env) : suite_(std::move(suite)), env_(std::move(env)) {}
  // A row: its parameters and figures; the environment and the timing statistics (seconds:
  // mean, stdev, min, samples) are added.
  void add(nlohmann::ordered_json row, const Samples& t);
  void note(std::string line) { notes_.push_back(std::move(line)); }  // table header lines
  void set_extra(const std::string& key, nlohmann::ordered_json value) { extra_[key] = std::move(value); }
  // The options that define the run (JSON "params"; the parts of a sharded run must agree).
  void set_params(nlohmann::ordered_json params) { params_ = std::move(params); }
  // Marks the report as shard s of a run of `cases` work units (docs/scale.md): to_json then
  // writes format akv-bench-part with shard, shards, cases and the table notes, and every row
  // added afterwards carries "shard".
  void set_shard(const Shard& s, std::size_t cases);
  std::vector<nlohmann::ordered_json>& rows() { return rows_; }
  const std::vector<nlohmann::ordered_json>& rows() const { return rows_; }
  const std::string& suite() const { return suite_; }
  const BenchEnv& env() const { return env_; }

  std::string to_table(const std::vector<BenchColumn>& columns) const;
  std::string to_csv() const;  // every field of every row; samples joined with ';'
  nlohmann::ordered_json to_json() const;

 private:
  std::string suite_;
  BenchEnv env_;
  std::vector<std::string> notes_;
  std::vector<nlohmann::ordered_json> rows_;
  nlohmann::ordered_json extra_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json params_ = nlohmann::ordered_json::object();
  std::optional<Shard> shard_;
  std::size_t cases_ = 0;
};

enum class BenchFormat { table, csv, json };

}  // namespace akv
