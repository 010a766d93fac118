#include "akv/bench/quant_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"

namespace akv {
namespace {

// Keys-like data: a few channels with a large offset and spread.
void fill_keys(float* p, std::size_t n, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  for (std::size_t i = 0; i < n; ++i) {
    const double base = rng.normal();
    p[i] = static_cast<float>(i % d < 2 ? 8.0 + 4.0 * base : base);
  }
}

void check_kernels(const QuantBenchOptions& o) {
  const std::size_t rows = 97, d = o.head_dim;
  std::vector<float> x(rows * d), a(x.size()), b(x.size());
  fill_keys(x.data(), x.size(), d, o.seed);
  for (QuantRule rule : {QuantRule::kivi, QuantRule::bounded}) {
    for (QuantAxis axis : o.axes) {
      for (int bits : o.bits) {
        const QuantizedBlock f = quantize_block(x.data(), rows, d, axis, bits, o.group, rule);
        const QuantizedBlock r = quantize_block_ref(x.data(), rows, d, axis, bits, o.group, rule);
        dequantize_block(f, a.data());
        dequantize_block_ref(r, b.data());
        if (f.codes != r.codes || f.scale != r.scale || f.zero != r.zero || a != b) {
          throw InvalidInput("kernel check failed: fast quantizer differs from the reference",
                             {"", "quant " + quant_rule_name(rule) + " " + quant_axis_name(axis),
                              std::to_string(bits)});
        }
      }
    }
  }
}

}  // namespace

std::vector<BenchColumn> quant_columns() {
  return {{"op", "op"},           {"axis", "axis"},       {"bits", "bits"},
          {"ms_mean", "ms", 2},   {"ms_stdev", "stdev", 2}, {"gbs", "GB/s", 2},
          {"vs_memcpy", "x memcpy", 2}};
}

BenchReport bench_quant(const QuantBenchOptions& o) {
  if (o.heads == 0 || o.tokens == 0 || o.head_dim == 0 || o.group == 0 || o.repeat < 1 || o.warmup < 0) {
    throw InvalidInput("bench sizes must be >= 1", {"", "--heads/--tokens/--head-dim/--group/--repeat"});
  }
  check_kernels(o);
  const int threads = resolve_threads(o.threads);
  BenchReport rep("quant", bench_env(threads));
  std::vector<std::string> axes;
  for (QuantAxis a : o.axes) axes.push_back(quant_axis_name(a));
  rep.set_params({{"heads", o.heads}, {"tokens", o.tokens}, {"head_dim", o.head_dim}, {"group", o.group},
                  {"bits", o.bits}, {"axes", axes}, {"rule", quant_rule_name(o.rule)}, {"warmup", o.warmup},
                  {"repeat", o.repeat}, {"seed", o.seed}});
  const std::size_t n_cases = o.axes.size() * o.bits.size();
  const auto [first_case, end_case] = o.shard ? o.shard->range(n_cases) : std::pair<std::size_t, std::size_t>{0, n_cases};
  if (o.shard) rep.set_shard(*o.shard, n_cases);
  const std::size_t per_head = o.tokens * o.head_dim;
  std::vector<float> x(o.heads * per_head), y(x.size());
  parallel_for(o.heads, threads, [&](std::size_t h) {
    fill_keys(x.data() + h * per_head, per_head, o.head_dim, stream_seed(o.seed, {h}));
  });
  const double gb = static_cast<double>(x.size() * sizeof(float)) / 1e9;
  rep.note(fmt::format("f32 tensor [{} x {} x {}] ({:.0f} MB), G = {}, rule {}; GB/s of f32 from the "
                       "mean; kernels checked bitwise against the reference first",
                       o.heads, o.tokens, o.head_dim, gb * 1e3, o.group, quant_rule_name(o.rule)));
  std::fill(y.begin(), y.end(), 0.0f);  // touch the pages before timing
  const Samples copy = measure(o.warmup, o.repeat, [&] {
    parallel_for(o.heads, threads, [&](std::size_t h) {
      std::memcpy(y.data() + h * per_head, x.data() + h * per_head, per_head * sizeof(float));
    });
  });
  const double memcpy_gbs = gb / copy.mean();
  auto row = [&](const std::string& op, const std::string& axis, int bits, const Samples& t,
                 std::uint64_t stored) {
    const double gbs = gb / t.mean();
    rep.add({{"op", op}, {"axis", axis}, {"bits", bits}, {"heads", o.heads}, {"tokens", o.tokens},
             {"head_dim", o.head_dim}, {"group", o.group}, {"rule", quant_rule_name(o.rule)},
             {"bytes_stored", stored},
             {"ms_mean", t.mean() * 1e3}, {"ms_stdev", t.stdev() * 1e3}, {"gbs", gbs},
             {"vs_memcpy", gbs / memcpy_gbs}},
            t);
  };
  row("memcpy", "-", 32, copy, x.size() * sizeof(float));
  for (std::size_t c = first_case; c < end_case; ++c) {
    const QuantAxis axis = o.axes[c / o.bits.size()];
    const int bits = o.bits[c % o.bits.size()];
    std::vector<QuantizedBlock> q(o.heads);
    const Samples tq = measure(o.warmup, o.repeat, [&] {
      parallel_for(o.heads, threads, [&](std::size_t h) {
        q[h] = quantize_block(x.data() + h * per_head, o.tokens, o.head_dim, axis, bits, o.group, o.rule);
      });
    });
    const Samples td = measure(o.warmup, o.repeat, [&] {
      parallel_for(o.heads, threads, [&](std::size_t h) { dequantize_block(q[h], y.data() + h * per_head); });
    });
    std::uint64_t stored = 0;
    for (const auto& b : q) stored += b.bytes();
    row("quantize", quant_axis_name(axis), bits, tq, stored);
    row("dequantize", quant_axis_name(axis), bits, td, stored);
  }
  return rep;
}

}  // namespace akv
