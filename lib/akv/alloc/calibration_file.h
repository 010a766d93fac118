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
#include "akv/quant/nuq.h"
#include "akv/score/kvzap.h"

namespace akv {

inline constexpr const char* kCalibrationFormat = "akv-calibration";
inline constexpr int kCalibrationVersion = 1;

// What `akv calibrate` measures of one KV head (eval/calibrate.h), as its file records it.
struct HeadStats {
  std::vector<double> key_error, value_error;  // [candidate]: error with keys (values) quantized
  double norm_variance = 0, entropy = 0, outlier_ratio = 0;
  double key_amax = 0, value_amax = 0;         // max |x| of its keys / values as stored (fp8 scales)
  std::vector<double> qfilter;                 // [head_dim] its Q-Filter (score/qfilter.h)
  std::optional<double> duo_error;             // its attention error as a DuoAttention streaming head
  // Its KVzap surrogate (score/kvzap.h): weight [dim] and bias; empty when not fitted.
  std::vector<double> kvzap_weight;
  double kvzap_bias = 0, kvzap_r2 = 0;  // and its R^2 on the fitted rows
  // --types: the error with keys (values) stored as each key (value) type, [type] (empty: not
  // calibrated with --types).
  std::vector<double> type_key_error, type_value_error;
  // f(name, member) for the measures the calibration file and the shard parts record under the
  // same names.
  template <typename F>
  static void measures(F&& f) {
    f("norm_variance", &HeadStats::norm_variance), f("entropy", &HeadStats::entropy);
    f("outlier_ratio", &HeadStats::outlier_ratio), f("key_amax", &HeadStats::key_amax);
    f("value_amax", &HeadStats::value_amax), f("qfilter", &HeadStats::qfilter);
  }
};

// A head's measurements and the bits (and types) calibrate assigned it.
struct CalibrationHead : HeadStats {
  int bits_key = 0, bits_value = 0;
  std::optional<double> predicted_error;  // unset when a bit width is not a candidate
  std::string type_key, type_value;       // --types: the assigned types (empty: not calibrated with --types)
};

// KVQuant's codebooks of every layer (akv calibrate, eval/calibrate.h): [layer][bit width].
struct CalibrationNuq {
  double sparsity = 0.99;
  std::size_t sink = 1;
  std::vector<int> bits;                                 // ascending
  bool fisher = false;                                   // fitted with the dumps' Fisher weights
  std::vector<std::vector<NuqCalibration>> key, value;  // [layer][bits index]; keys per channel
};

struct CalibrationFile {
  std::vector<std::pair<std::string, std::string>> dumps;  // {path, hash}
  KvWindow shape;                                           // n_layers, n_heads, n_kv_heads, head_dim
  std::vector<int> candidates;                              // ascending bit widths
  std::vector<std::string> key_types, value_types;          // --types: the candidates of keys / values
  nlohmann::json params;                                    // how it was calibrated
  nlohmann::json summary;                                   // achieved bits, proxies' correlation...
  std::vector<std::vector<CalibrationHead>> heads;          // [layer][kv head]
  std::optional<CalibrationNuq> nuq;                        // written as "nuq" when fitted
};

nlohmann::json calibration_to_json(const CalibrationFile& f);

// Every reader below reads a file written for a model's layers (KvShape::file_layers) and returns
// what it holds for the shape's layers (KvShape::file_layer: the global layers' alone for the
// method's cache of a model with sliding-window layers), indexed by the shape's layers.

// Per-head {key bits, value bits} [layer * n_kv_heads + head] from a calibration file, checked
// against the dump's shape (InvalidInput naming the field otherwise).
std::vector<std::pair<int, int>> read_calibration(const std::string& path, const KvWindow& m);

// Per-head {key amax, value amax} [layer * n_kv_heads + head] (max |x| as a cache stores the rows,
// rotated as params.rotate says), checked against the shape's layers and KV heads; CorruptData naming
// the field when a head has none (a file written before 2026-12-03) or one that is not finite
// and non-negative.
struct CalibrationAmax {
  std::vector<std::pair<double, double>> amax;  // [layer * n_kv_heads + head]: {key, value}
  std::string rotate = "none";                  // params.rotate: the rows' rotation (random: seed 0)
};
CalibrationAmax read_calibration_amax(const std::string& path, const KvShape& shape);

// Per-head cache types {key, value} [layer * n_kv_heads + head] of an `akv calibrate --types`
// assignment (layers[].heads[].ggml_types) and the rotation they were measured with
// (params.rotate; random: seed 0), checked against the shape's layers and KV heads (InvalidInput naming
// the field otherwise); CorruptData naming the field when a head has none (calibrated without
// --types) or a name that is not a cache type akv stores.
struct CalibrationTypes {
  std::vector<std::pair<std::string, std::string>> types;
  std::string rotate = "none";
};
CalibrationTypes read_calibration_types(const std::string& path, const KvShape& shape);

// Per-head Q-Filters [layer][kv head][head_dim] (score/qfilter.h), checked against the shape
// (InvalidInput naming the field otherwise); CorruptData naming the field when a head has none (a
// file written before commit f920cee, 2026-12-03) or a value that is not finite.
using QFilters = std::vector<std::vector<std::vector<double>>>;
QFilters read_calibration_qfilters(const std::string& path, const KvWindow& m);

// DuoAttention head scores (`akv calibrate`, eval/calibrate.h): every KV head's attention-output
// error when it keeps only the first `sinks` and the last `window` tokens, [layer][kv head], with
// the sinks and window of summary.duo. Checked against the shape's layers and KV heads (InvalidInput naming
// the field otherwise); CorruptData naming the field when the file has none (its dumps were not
// longer than sinks + window, or it was written before commit 8e5f798, 2026-12-03) or a value that is not finite
// and >= 0.
struct DuoHeadScores {
  std::size_t sinks = 0, window = 0;
  std::vector<std::vector<double>> error;  // [layer][kv head]
};
// KVQuant codebooks at key bits bk and value bits bv for method nuq (quant/nuq.h NuqCodebooks),
// checked against the shape (InvalidInput naming the field otherwise); InvalidInput naming "nuq"
// when the file has none (its dumps had no key_pre_rope, or it was written before 2026-12-03),
// naming nuq.bits when a width was not fitted; CorruptData naming the field for levels that are
// not 2^bits ascending finite values or thresholds that are not finite with lower <= upper.
NuqCodebooks read_calibration_nuq(const std::string& path, const KvShape& shape, int bk, int bv);

// KVzap surrogates [layer] (layers[].heads[].kvzap: weight [dim], bias), checked against
// the shape's layers and KV heads and the attention input's width `dim` (InvalidInput naming the field
// otherwise); CorruptData naming the field when a head has none (the dumps had no attention inputs
// and KVzip+ scores: akv dump --kvzap) or a value that is not finite.
KvzapModel read_calibration_kvzap(const std::string& path, const KvShape& shape, std::size_t dim);

DuoHeadScores read_calibration_duo(const std::string& path, const KvShape& shape);

}  // namespace akv
