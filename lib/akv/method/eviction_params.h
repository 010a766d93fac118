#pragma once
// Eviction methods and their parameters: which score ranks the tokens, which allocator spreads
// the budget over heads (docs/eviction.md). What a cache file records and the planner
// (alloc/eviction.h) is told.
#include <cstddef>
#include <optional>
#include <string>
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

// The eviction parameters a flag sets as given, one row each: SnapKV pooling's (kernel, pool,
// gqa-reduce), the allocators' (alpha, beta, capacity-rule, min-tokens, step) and each score's own
// (future, covariance, vnorm, lag, plus, and the calibration files qfilters, surrogate). A row
// holds the registry parameter (its JSON key with _ for -), where the request and the parameters
// hold it (`at`, or `score_at` in the score's options: a count, a real, a switch on | off stored
// as a bool, a word stored as its enum, or a file path), and:
//   score, verb, what   a score's own parameter: it applies only when that score ranks the tokens
//                       ("this flag <verb> <score>'s <what>, not <other>'s" otherwise), is in JSON
//                       only then, and a path there is the calibration file the score needs
//   allocator           it tunes the allocator (threshold= refuses it)
//   absent, omit_absent what a file without the key meant (nullptr: the key is required); omitted:
//                       to_json leaves it out at that value (files written before it stay the same)
// The flags, to_json, from_json, a method's input files and the checks read this table: a new
// such parameter is its request field, its field, a row here and its registry parameter.
struct EvictionField {
  template <class T, class Given>
  struct Of {
    std::optional<Given> EvictionRequest::*given;
    T EvictionParams::*at;
    T ScoreOptions::*score_at;
  };
  using Count = Of<std::size_t, long long>;
  using Switch = Of<bool, std::string>;
  using File = Of<std::string, std::string>;
  const char* param;
  std::variant<Count, Of<double, double>, Switch, File, Of<PoolKind, std::string>, Of<GqaReduce, std::string>,
               Of<CapacityRule, std::string>>
      field;
  std::optional<ScoreMethod> score = std::nullopt;
  const char* verb = nullptr;  // "sets" or "gives"
  const char* what = nullptr;  // e.g. "partitions": "this flag sets lagkv's partitions, not tova's"
  bool allocator = false;
  const char* absent = nullptr;
  bool omit_absent = false;
};
const std::vector<EvictionField>& eviction_fields();
// The table's flags given in r set in e, a score's checked against e's score (UsageError naming
// the flag and value).
void apply_eviction_fields(EvictionParams& e, const EvictionRequest& r);
// The allocator's flags of the table (", "-separated), and whether r gives one of them.
std::string allocator_flag_list();
bool gives_allocator_flag(const EvictionRequest& r);
// A score of the table without its file: UsageError "<score> scores with the <what> `akv
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
