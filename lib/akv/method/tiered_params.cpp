#include "akv/method/tiered_params.h"

#include "akv/core/errors.h"
#include "akv/quant/pack.h"

namespace akv {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

}  // namespace

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
  t.preset = j.at("preset").get<std::string>();
  t.hot = j.at("hot").get<std::size_t>();
  if (!j.at("warm").is_null()) t.warm = j.at("warm").get<std::size_t>();
  t.warm_bits_key = j.at("warm_bits_key").get<int>();
  t.warm_bits_value = j.at("warm_bits_value").get<int>();
  t.cold_bits = j.at("cold_bits").get<int>();
  t.protect_first = j.at("protect_first").get<std::size_t>();
  t.protect_last = j.at("protect_last").get<std::size_t>();
  t.anchors = j.at("anchors").get<std::size_t>();
  t.decay = j.at("decay").get<double>();
  t.w_attn = j.at("w_attn").get<double>();
  t.w_recency = j.at("w_recency").get<double>();
  t.margin = j.at("margin").get<double>();
  t.block = j.at("block").get<std::size_t>();
  const std::string d = j.at("demotion").get<std::string>();
  if (d != "fifo" && d != "importance") throw CorruptData("unknown demotion", {file, "params.tiered.demotion", d});
  t.demotion = d == "fifo" ? Demotion::fifo : Demotion::importance;
  check_bits(t.warm_bits_key, "params.tiered.warm_bits_key");
  check_bits(t.warm_bits_value, "params.tiered.warm_bits_value");
  if (t.cold_bits != 16) check_bits(t.cold_bits, "params.tiered.cold_bits");
  if (t.block == 0) throw CorruptData("block must be >= 1", {file, "params.tiered.block", "0"});
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
