#pragma once
// Eviction methods and their parameters: which score ranks the tokens, which allocator spreads
// the budget over heads (docs/eviction.md). What a cache file records and the planner
// (alloc/eviction.h) is told.
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/method/request.h"
#include "akv/score/score.h"

namespace akv {

enum class AllocMethod { uniform, adakv, waterfill, pyramid, adakv_pyramid, adakv_global, duo, file, joint };
std::string alloc_method_name(AllocMethod a);
AllocMethod parse_alloc_method(const std::string& s);  // InvalidInput naming the value
// The allocators `akv allocate --method` and the eviction methods' alloc= take (uniform, adakv,
// waterfill, pyramid, adakv-pyramid, adakv-global, duo), joined by `separator`.
std::string alloc_method_list(const char* separator);

// How Ada-KV turns the per-head winner counts into capacities, and PyramidKV its layer schedule
// into integers (docs/eviction.md):
//   official     Ada-KV: round(count_h * (1 - alpha) + int(alpha * base)) per head, in f32 with
//                ties to even, as FFY0/AdaKV computes it (a layer may keep a few tokens more or
//                fewer than H*base); PyramidKV: KVCache-Factory's integer-step schedule
//   exact_total  Ada-KV: alpha*base + (1 - alpha)*count_h made integer by largest remainder;
//                PyramidKV: the real schedule by largest remainder: budgets met exactly
//   kvpress      Ada-KV as kvpress's AdaKVPress: each head's int(alpha * kept) best protected,
//                the rest of the layer's budget to the best other scores of all heads (exact
//                totals; alloc/alloc.h); PyramidKV: as official
enum class CapacityRule { official, exact_total, kvpress };
std::string capacity_rule_name(CapacityRule r);
CapacityRule parse_capacity_rule(const std::string& s);  // InvalidInput naming the value

struct EvictionParams {
  ScoreOptions score;
  AllocMethod alloc = AllocMethod::uniform;
  std::optional<double> budget_fraction;      // of n_tokens, in (0, 1]
  std::optional<std::size_t> budget_tokens;   // per KV head on average, forced tokens included
  std::size_t sinks = 0;
  double alpha = 0.2;        // adakv floor fraction
  CapacityRule capacity_rule = CapacityRule::official;  // adakv capacities
  double beta = 20.0;        // pyramid
  std::size_t min_tokens = 0, step = 1;  // waterfill (selectable tokens)
  std::string budgets_file;  // alloc == file: per-head budgets from `akv allocate`
  // Threshold eviction (kvpress's DMSPress) instead of a budget: each head keeps its forced tokens
  // and every other token whose score is >= threshold, however many (alloc/eviction.h).
  // `decoding` (the model's runtime cache only): decoded tokens too, each decided when `window`
  // newer tokens follow it (kv/runtime.h).
  std::optional<double> threshold;
  bool decoding = false;
  // Decode-time compression (the model's runtime cache only; 0 = none): every `every` decoded
  // tokens each KV head is cut back to `target` rows (kv/decode_compression.h).
  std::size_t every = 0, target = 0;
  // CriticalKV (score/critical.h): scores weighed by |W_o v|_1, kept in two stages, the first
  // keeping the best-scored floor(first_stage x budget) of each head.
  bool critical = false;
  double first_stage = 0.5;
  // duo: a calibration file (`akv calibrate`) whose per-head streaming errors rank the heads
  // instead of the score (alloc/calibration_file.h read_calibration_duo); empty: the score ranks.
  std::string duo_heads;
  // joint: each head also chooses its quantizer's rotation, between none and the method's
  // rotate= (kv/joint.h); off: every head rotates as rotate= says.
  bool rotate_choice = false;
  // joint: cache types each tensor may also be stored as (cache-types=q4_0/fp8_e4m3/tq3+hadamard,
  // kv/joint.h JointOptions::types); empty: kivi codes only.
  std::vector<std::string> cache_types;

  nlohmann::json to_json() const;
  static EvictionParams from_json(const nlohmann::json& j, const std::string& file);
};

// The parameters of one score, one row each: they apply only when that score ranks the tokens.
// The registry parameter (also its key in a method's JSON), what it sets or gives (errors name
// it), and where the request and the score options hold it: a count, a switch (on | off) or a
// calibration file `akv calibrate` fits (which its score then needs). Flags, JSON, a method's
// input files and the checks all read this table: a new such parameter is a row here, its two
// fields and its registry parameter.
struct ScoreParam {
  using Count = std::pair<std::optional<long long> EvictionRequest::*, std::size_t ScoreOptions::*>;
  using Switch = std::pair<std::optional<std::string> EvictionRequest::*, bool ScoreOptions::*>;
  using File = std::pair<std::optional<std::string> EvictionRequest::*, std::string ScoreOptions::*>;
  ScoreMethod method;
  const char* param;
  const char* verb;  // "sets" or "gives"
  const char* what;  // e.g. "partitions": "this flag sets lagkv's partitions, not tova's"
  std::variant<Count, Switch, File> field;
  bool json_when_on = false;  // Switch: in JSON only when on (files written before it lack it)
};
const std::vector<ScoreParam>& score_params();
// A score's parameters given in r, checked against its score (UsageError "this flag <verb>
// <score>'s <what>, not <other>'s" naming the flag and value) and set in o.
void apply_score_params(ScoreOptions& o, const EvictionRequest& r);
// A score of that table without its file: UsageError "<score> scores with the <what> `akv
// calibrate` fits: give <param>=calib.json" naming --<param>.
void check_score_file(const ScoreOptions& o);
// The calibration files o's score reads.
std::vector<std::string> score_files(const ScoreOptions& o);

// Whether the whole cache can be cut back by e's score and allocator (kv/decode_compression.h:
// scores snapkv, knorm, keydiff, lagkv or qfilter, allocation uniform or adakv, no CriticalKV);
// UsageError "<what> scores with ..." naming the flag otherwise.
void check_cut(const EvictionParams& e, const std::string& what);
// Decode-time compression (EvictionParams::every > 0): check_cut, and a target above the sinks and
// window; UsageError / InvalidInput naming the flag otherwise.
void check_decode_compression(const EvictionParams& e);

// Threshold eviction while decoding (EvictionParams::decoding): scores each decoded token alone
// (knorm, qfilter, kvzap) and stores f16 rows; UsageError naming the flag otherwise.
void check_threshold_decoding(const EvictionParams& e, bool quantized);

// Eviction methods of `akv compress --method`: score + allocator (+ default sinks), the
// registry's rows of kind eviction and joint (method/registry.h):
//   snapkv = snapkv + uniform, h2o = h2o + uniform, streamingllm = sinks 4 + recent,
//   adakv = snapkv + adakv, waterfill = snapkv + waterfill, pyramid = snapkv + pyramid,
//   adakv-pyramid, adakv-global = snapkv + adakv over all heads of all layers, joint,
//   critical-snapkv, critical-adakv = snapkv / adakv (capacity rule kvpress) + CriticalKV,
//   duo = kvzip head scores + duo (retrieval heads keep all, streaming heads sinks 128 + recent 256).
std::vector<std::string> eviction_method_names();
bool is_eviction_method(const std::string& name);
EvictionParams eviction_method(const std::string& name);
// The method of a score and an allocator (joint -> "joint"; otherwise the allocator's name when
// no method pairs them, e.g. adakv with h2o scores).
// critical: the CriticalKV methods' names (critical-snapkv, critical-adakv).
std::string eviction_method_name(ScoreMethod score, AllocMethod alloc, bool critical = false);

}  // namespace akv
