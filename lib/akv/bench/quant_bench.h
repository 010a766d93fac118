#pragma once
// `akv bench quant`: throughput of quantize+pack and unpack+dequantize on a synthetic f32 tensor
// [heads, tokens, head_dim], next to a memcpy of the same buffer measured in the same run with
// the same threads (heads split over threads the same way). Figures are GB/s of f32 processed.
#include <cstdint>
#include <optional>
#include <vector>

#include "akv/bench/report.h"
#include "akv/quant/affine.h"

namespace akv {

struct QuantBenchOptions {
  std::size_t heads = 8, tokens = 32768, head_dim = 128, group = 32;
  std::vector<int> bits = {2, 3, 4, 8};
  std::vector<QuantAxis> axes = {QuantAxis::channel, QuantAxis::token};
  QuantRule rule = QuantRule::kivi;  // timed rule; the kernel check covers both
  int warmup = 1, repeat = 5, threads = 0;
  std::uint64_t seed = 1;
  // Shard K of N (docs/scale.md): cases are (axis, bits) pairs, axis-major; a shard times a
  // contiguous range of them next to its own memcpy row. Unset: the whole run.
  std::optional<Shard> shard;
};

// Checks the fast kernels against the reference (bitwise) on a small case, then times. Rows:
// memcpy, then quantize and dequantize per (axis, bits); gbs from the mean, vs_memcpy = ratio
// of mean throughputs.
BenchReport bench_quant(const QuantBenchOptions& o);
std::vector<BenchColumn> quant_columns();

}  // namespace akv
