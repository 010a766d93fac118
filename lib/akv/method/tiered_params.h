#pragma once
// Parameters of the three-tier cache (kv/tiered.h): budgets, bits, importance scoring and
// migration. Presets quality, balanced, compact (and the kivi presets' bits in the warm tier)
// are resolved in params.h from the registry's rows.
#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace akv {

enum class Demotion { fifo, importance };

// The three-tier cache (kv/tiered.h). Tokens move in blocks of `block` tokens (the key
// quantization group).
struct TieredParams {
  std::string preset;            // quality | balanced | compact | k4v2 | k4v3 | "" (custom)
  std::size_t hot = 128;         // hot (f16) budget, tokens, protected tokens included
  std::optional<std::size_t> warm;  // warm budget, tokens; unset = unlimited (no cold tier)
  int warm_bits_key = 3, warm_bits_value = 3;
  int cold_bits = 2;             // 2, 3, 4, 8; 16 = exact f16 copies in host memory
  std::size_t protect_first = 4, protect_last = 32, anchors = 0;  // compact: protect_last 0
  double decay = 0.95, w_attn = 1.0, w_recency = 0.0;
  double margin = 0.25;          // promotion hysteresis (relative score margin)
  Demotion demotion = Demotion::importance;
  std::size_t block = 32;

  nlohmann::json to_json() const;
  static TieredParams from_json(const nlohmann::json& j, const std::string& file);
};

// Throws InvalidInput for budgets the cache cannot keep (hot below what protection pins, warm
// not a multiple of the block) or a head_dim that is not a multiple of 8.
void validate_tiered(const TieredParams& t, std::size_t head_dim);

}  // namespace akv
