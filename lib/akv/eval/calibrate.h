#pragma once
// `akv calibrate`: measured per-head sensitivity to key and value quantization, head proxies
// (key-norm variance, attention entropy, outlier channels), and per-head bit assignment under a
// target average (exact knapsack on the measured errors, or the AdaKV-proxy rule on a proxy).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/io/dump.h"
#include "akv/quant/affine.h"
#include "akv/quant/rotation.h"

namespace akv {

struct CalibrateOptions {
  std::vector<int> candidates = {2, 3, 4};
  std::size_t group = 32, residual = 128;
  QuantRule rule = QuantRule::kivi;   // quantization rule of the measured errors (quant/affine.h)
  RotationKind rotate = RotationKind::none;  // rows rotated before quantization (random: seed 0)
  double target_bits = 3.0;
  std::string aggregate = "mean";     // over dumps: mean | max
  std::string allocator = "measured"; // measured | adakv-proxy | entropy
  int lo = 2, mid = 3, hi = 4;        // proxy levels
  std::size_t update_interval = 0;    // adakv-proxy: re-allocate every N tokens (0 = once)
  // DuoAttention head scores: the attention-output error of a streaming head that keeps the
  // first duo_sinks and the last duo_window tokens (measured when every dump is longer).
  std::size_t duo_sinks = 128, duo_window = 256;
  // KVQuant's nuq codebooks (quant/nuq.h), fitted when every dump has key_pre_rope: for each bit
  // width, each layer's levels for keys (pre-RoPE, thresholds per channel) and values (thresholds
  // per token and KV head), with KVQuant's sparsity threshold and its fp16 sink rows (the first
  // nuq_sink tokens of each dump, left out of the fit). Empty nuq_bits: none fitted.
  std::vector<int> nuq_bits = {2, 3, 4};
  double nuq_sparsity = 0.99;
  std::size_t nuq_sink = 1;
  // Cache types (ggml_cache_type_names(): llama.cpp's, fp8, TurboQuant) to measure every head's
  // keys and values with (rotated as `rotate`), and to assign per head under types_target_bits
  // (stored bits per element, mean over K and V of every head; 0: target_bits): keys take every
  // type but tqv*, values every type but TurboQuant's key types. Empty: none.
  std::vector<std::string> types;
  double types_target_bits = 0;
  // KVzap's surrogate (score/kvzap.h), fitted when every dump has attn_input and kvzip_plus (akv
  // dump --kvzap): per layer, ridge regression (kvzap_alpha) of the log KVzip+ scores of each KV
  // head on the attention inputs, every token of every dump but its first kvzap_sinks.
  double kvzap_alpha = 1.0;
  std::size_t kvzap_sinks = 4;
  int threads = 1;
};

// Per-head measurements and assignment, as written to calib.json (format akv-calibration v1,
// docs/formats.md). Throws InvalidInput for bad options or dumps of different shapes.
nlohmann::json calibrate(const std::vector<std::string>& dumps, const CalibrateOptions& o,
                         const ProgressFn& progress);

std::string render_calibration(const nlohmann::json& j);

// Spearman rank correlation (average ranks for ties); 0 when a side is constant.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace akv
