#pragma once
// `akv bench quant`: throughput of quantize+pack and unpack+dequantize on a synthetic f32 tensor
// [heads, tokens, head_dim], next to a memcpy of the same buffer measured in the same run with
// the same threads (heads split over threads the same way). Figures are GB/s of f32 processed.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/quant/affine.h"

namespace akv {

struct QuantBenchOptions {
  std::size_t heads = 8, tokens = 32768, head_dim = 128, group = 32;
  std::vector<int> bits = {2, 3, 4, 8};
  std::vector<QuantAxis> axes = {QuantAxis::channel, QuantAxis::token};
  int repeats = 5;  // best of N
  int threads = 0;
  std::uint64_t seed = 1;
};

struct QuantBenchRow {
  int bits = 4;
  QuantAxis axis = QuantAxis::channel;
  double quantize_gbs = 0, dequantize_gbs = 0;
  double quantize_ratio = 0, dequantize_ratio = 0;  // vs memcpy
  std::uint64_t bytes_stored = 0;
};

struct QuantBenchResult {
  QuantBenchOptions options;
  int threads = 1;
  double memcpy_gbs = 0;
  std::vector<QuantBenchRow> rows;
  nlohmann::json to_json() const;
  std::string to_table() const;
};

QuantBenchResult bench_quant(const QuantBenchOptions& o);

}  // namespace akv
