#include "akv/method/tiered_params.h"

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/method/registry.h"

namespace akv {

nlohmann::json TieredParams::to_json() const {
  nlohmann::json j = {{"preset", preset}, {"hot", hot}, {"warm_bits_key", warm_bits_key},
                      {"warm_bits_value", warm_bits_value}, {"cold_bits", cold_bits},
                      {"protect_first", protect_first}, {"protect_last", protect_last},
                      {"anchors", anchors}, {"decay", decay}, {"w_attn", w_attn},
                      {"w_recency", w_recency}, {"margin", margin}, {"block", block},
                      {"demotion", demotion == Demotion::fifo ? "fifo" : "importance"}};
  j["warm"] = warm ? nlohmann::json(*warm) : nlohmann::json();
  return j;
}

TieredParams TieredParams::from_json(const nlohmann::json& j, const std::string& file) {
  TieredParams t;
  const std::string at = "params.tiered.";
  auto integer = [&](const char* key, const char* param) { return file_integer(j, key, param, file, at + key); };
  auto real = [&](const char* key, const char* param) { return file_real(j, key, param, file, at + key); };
  t.preset = j.at("preset").get<std::string>();
  t.hot = static_cast<std::size_t>(integer("hot", "hot"));
  if (!j.at("warm").is_null()) t.warm = static_cast<std::size_t>(integer("warm", "warm"));
  t.warm_bits_key = static_cast<int>(integer("warm_bits_key", "warm-bits-key"));
  t.warm_bits_value = static_cast<int>(integer("warm_bits_value", "warm-bits-value"));
  t.cold_bits = static_cast<int>(integer("cold_bits", "cold-bits"));
  t.protect_first = static_cast<std::size_t>(integer("protect_first", "protect-first"));
  t.protect_last = static_cast<std::size_t>(integer("protect_last", "protect-last"));
  t.anchors = static_cast<std::size_t>(integer("anchors", "anchors"));
  t.decay = real("decay", "decay");
  t.w_attn = real("w_attn", "w-attn");
  t.w_recency = real("w_recency", "w-recency");
  t.margin = real("margin", "margin");
  t.block = file_count(j, "block", file, at + "block");
  const std::string d = j.at("demotion").get<std::string>();
  if (d != "fifo" && d != "importance") throw CorruptData("unknown demotion", {file, at + "demotion", d});
  t.demotion = d == "fifo" ? Demotion::fifo : Demotion::importance;
  if (t.block == 0) throw CorruptData("block must be >= 1", {file, at + "block", "0"});
  return t;
}

void validate_tiered(const TieredParams& t, std::size_t head_dim) {
  const std::size_t b = t.block;
  // At most: the sink blocks, the blocks covering the last protect_last positions (with the
  // open block: protect_last + b - 1 tokens), the anchor blocks.
  const std::size_t need = b * ceil_div(t.protect_first, b) + t.protect_last + b - 1 + b * ceil_div(t.anchors, b);
  if (t.hot < need) {
    throw InvalidInput("hot budget cannot hold the protected tokens (sinks, recent window, open block, "
                       "anchors) of " + std::to_string(need) + " tokens in blocks of " + std::to_string(b),
                       {"", "hot", std::to_string(t.hot)});
  }
  if (t.warm && *t.warm % b != 0) {
    throw InvalidInput("warm budget must be a multiple of the block size " + std::to_string(b),
                       {"", "warm", std::to_string(*t.warm)});
  }
  if (head_dim % 8 != 0) {
    throw InvalidInput("the tiered cache needs head_dim a multiple of 8", {"", "head_dim", std::to_string(head_dim)});
  }
}

}  // namespace akv
