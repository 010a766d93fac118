#pragma once
// What a user asked for, before resolution into typed parameters (params.h): the method name
// and every flag that was given, unset fields meaning "the method's default". Filled from the
// command line or a method spec through the registry (registry.h).
#include <optional>
#include <string>

namespace akv {

// Eviction flags (see alloc/eviction.h); only with an eviction method.
struct EvictionRequest {
  std::optional<double> budget;
  std::optional<long long> budget_tokens;
  std::optional<std::string> budgets_file;
  std::optional<long long> window, sinks, kernel, min_tokens, step, future, lag, every, target;
  std::optional<std::string> score, pool, gqa_reduce, capacity_rule, covariance, vnorm, critical, plus, qfilters, surrogate,
      duo_heads, decoding, rotate_choice, cache_types;
  std::optional<double> alpha, beta, first_stage, threshold;
  bool operator==(const EvictionRequest&) const = default;
  bool any() const { return *this != EvictionRequest{}; }  // some flag given
};

struct TieredRequest {
  std::optional<std::string> preset, demotion;
  std::optional<long long> hot, warm, warm_bits_key, warm_bits_value, cold_bits, protect_first,
      protect_last, anchors;
  std::optional<double> decay, w_attn, w_recency, margin;
  bool operator==(const TieredRequest&) const = default;
  bool any() const { return *this != TieredRequest{}; }  // some flag given
};

// llama.cpp cache types (method ggml).
struct GgmlRequest {
  std::optional<std::string> k, v, scale;
  std::optional<long long> boundary;  // turboquant only
  std::optional<std::string> qjl;      // turboquant only: on | off
  std::optional<std::string> types;    // ggml only: per-head types from a calibration file
  bool operator==(const GgmlRequest&) const = default;
  bool any() const { return *this != GgmlRequest{}; }  // some flag given
};

// What the user asked for on the command line; unset fields take the method's defaults.
struct CompressRequest {
  TieredRequest tiered;
  GgmlRequest ggml;
  std::string method = "kivi";  // a quantization method, preset, or eviction method
  std::optional<std::string> quant;  // with an eviction method: quantization method or preset
  EvictionRequest eviction;
  std::optional<long long> bits, bits_key, bits_value;
  std::optional<std::string> key_axis, value_axis, quant_rule;
  std::optional<long long> group, residual;
  std::optional<double> outlier_fraction;
  bool pre_rope = false;
  std::optional<std::string> rotate;      // none | hadamard | random (quant/rotation.h)
  std::optional<long long> rotate_seed;
  std::optional<std::string> calibration;  // calib.json from `akv calibrate`
};

}  // namespace akv
