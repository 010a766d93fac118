#pragma once
// The calibration file, reader and writer: format "akv-calibration", version 1
// (docs/formats.md). Written by `akv calibrate` (eval/calibrate.h), read by `akv compress
// --calibration`, the runtime cache and `akv plan --calibration` for per-head bits.
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/io/dump.h"

namespace akv {

inline constexpr const char* kCalibrationFormat = "akv-calibration";
inline constexpr int kCalibrationVersion = 1;

// One KV head's measurements and assignment.
struct CalibrationHead {
  std::vector<double> key_error, value_error;  // [candidate]: error with keys (values) quantized
  double norm_variance = 0, entropy = 0, outlier_ratio = 0;
  int bits_key = 0, bits_value = 0;
  std::optional<double> predicted_error;       // unset when a bit width is not a candidate
};

struct CalibrationFile {
  std::vector<std::pair<std::string, std::string>> dumps;  // {path, hash}
  KvWindow shape;                                           // n_layers, n_heads, n_kv_heads, head_dim
  std::vector<int> candidates;                              // ascending bit widths
  nlohmann::json params;                                    // how it was calibrated
  nlohmann::json summary;                                   // achieved bits, proxies' correlation...
  std::vector<std::vector<CalibrationHead>> heads;          // [layer][kv head]
};

nlohmann::json calibration_to_json(const CalibrationFile& f);

// Per-head {key bits, value bits} [layer * n_kv_heads + head] from a calibration file, checked
// against the dump's shape (InvalidInput naming the field otherwise).
std::vector<std::pair<int, int>> read_calibration(const std::string& path, const KvWindow& m);

}  // namespace akv
