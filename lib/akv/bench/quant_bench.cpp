#include "akv/bench/quant_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"

namespace akv {
namespace {

template <typename Fn>
double best_seconds(int repeats, Fn&& fn) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

QuantBenchResult bench_quant(const QuantBenchOptions& o) {
  if (o.heads == 0 || o.tokens == 0 || o.head_dim == 0 || o.group == 0 || o.repeats < 1) {
    throw InvalidInput("bench sizes must be >= 1", {"", "--heads/--tokens/--head-dim/--group/--repeats"});
  }
  QuantBenchResult res;
  res.options = o;
  res.threads = resolve_threads(o.threads);
  const std::size_t per_head = o.tokens * o.head_dim;
  std::vector<float> x(o.heads * per_head), y(x.size());
  parallel_for(o.heads, res.threads, [&](std::size_t h) {
    Rng rng(stream_seed(o.seed, {h}));
    float* p = x.data() + h * per_head;
    for (std::size_t i = 0; i < per_head; ++i) {
      // Keys-like data: a few channels with a large offset and spread.
      const double base = rng.normal();
      p[i] = static_cast<float>(i % o.head_dim < 2 ? 8.0 + 4.0 * base : base);
    }
  });
  const double gb = static_cast<double>(x.size() * sizeof(float)) / 1e9;
  std::fill(y.begin(), y.end(), 0.0f);  // touch the pages before timing
  const double t_copy = best_seconds(o.repeats, [&] {
    parallel_for(o.heads, res.threads, [&](std::size_t h) {
      std::memcpy(y.data() + h * per_head, x.data() + h * per_head, per_head * sizeof(float));
    });
  });
  res.memcpy_gbs = gb / t_copy;
  for (QuantAxis axis : o.axes) {
    for (int bits : o.bits) {
      std::vector<QuantizedBlock> q(o.heads);
      const double tq = best_seconds(o.repeats, [&] {
        parallel_for(o.heads, res.threads, [&](std::size_t h) {
          q[h] = quantize_block(x.data() + h * per_head, o.tokens, o.head_dim, axis, bits, o.group);
        });
      });
      const double td = best_seconds(o.repeats, [&] {
        parallel_for(o.heads, res.threads, [&](std::size_t h) {
          dequantize_block(q[h], y.data() + h * per_head);
        });
      });
      QuantBenchRow row;
      row.bits = bits;
      row.axis = axis;
      row.quantize_gbs = gb / tq;
      row.dequantize_gbs = gb / td;
      row.quantize_ratio = row.quantize_gbs / res.memcpy_gbs;
      row.dequantize_ratio = row.dequantize_gbs / res.memcpy_gbs;
      for (const auto& b : q) row.bytes_stored += b.bytes();
      res.rows.push_back(row);
    }
  }
  return res;
}

nlohmann::json QuantBenchResult::to_json() const {
  nlohmann::json j;
  j["shape"] = {options.heads, options.tokens, options.head_dim};
  j["group"] = options.group;
  j["threads"] = threads;
  j["repeats"] = options.repeats;
  j["memcpy_gbs"] = memcpy_gbs;
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& r : rows) {
    rows_j.push_back({{"bits", r.bits},
                      {"axis", quant_axis_name(r.axis)},
                      {"quantize_gbs", r.quantize_gbs},
                      {"dequantize_gbs", r.dequantize_gbs},
                      {"quantize_vs_memcpy", r.quantize_ratio},
                      {"dequantize_vs_memcpy", r.dequantize_ratio},
                      {"bytes_stored", r.bytes_stored}});
  }
  j["rows"] = rows_j;
  return j;
}

std::string QuantBenchResult::to_table() const {
  std::string out = fmt::format(
      "f32 tensor [{} x {} x {}] ({:.0f} MB), G = {}, {} threads, best of {}\n"
      "memcpy baseline: {:.2f} GB/s\n",
      options.heads, options.tokens, options.head_dim,
      static_cast<double>(options.heads * options.tokens * options.head_dim * 4) / 1e6,
      options.group, threads, options.repeats, memcpy_gbs);
  out += fmt::format("{:>8} {:>5} {:>14} {:>10} {:>14} {:>10}\n", "axis", "bits", "quantize GB/s",
                     "x memcpy", "dequant GB/s", "x memcpy");
  for (const auto& r : rows) {
    out += fmt::format("{:>8} {:>5} {:>14.2f} {:>10.2f} {:>14.2f} {:>10.2f}\n",
                       quant_axis_name(r.axis), r.bits, r.quantize_gbs, r.quantize_ratio,
                       r.dequantize_gbs, r.dequantize_ratio);
  }
  return out;
}

}  // namespace akv
