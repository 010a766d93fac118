#pragma once
// Token eviction: which tokens each KV head keeps, from importance scores and a budget
// allocator. See docs/eviction.md.
//
// Per head, the forced tokens - the first `sinks` positions and the observation window (the
// last W positions) - are always kept and counted in the budget. The allocator decides how many
// other ("selectable") tokens each head keeps; each head keeps its best-scored selectable tokens
// (ties: earlier position) and stores all kept tokens in chronological order. With a threshold
// (EvictionParams::threshold, kvpress's DMSPress) there is no budget: each head keeps every
// selectable token scored >= threshold, and the plan's budget_per_head is the mean kept.
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/io/dump.h"
#include "akv/method/eviction_params.h"
#include "akv/score/critical.h"
#include "akv/score/kvzip.h"
#include "akv/score/score.h"

namespace akv {

struct HeadPlan {
  std::size_t tokens = 0;          // kept, forced included
  std::vector<std::int32_t> kept;  // ascending positions
  std::vector<double> kept_score;  // the score of each kept token (H2O: its accumulated attention)
  double retained_mass = 0;        // window attention mass on kept tokens (of 1)
};

struct EvictionPlan {
  EvictionParams params;
  std::size_t n_tokens = 0, forced = 0, budget_per_head = 0;
  std::vector<std::vector<HeadPlan>> heads;  // [layer][kv head]
  std::size_t total_tokens() const;
  double fraction() const;                   // kept / (layers * kv heads * n_tokens)
  double retained_min() const;
  double retained_mean() const;
  nlohmann::json summary_json() const;
};

// Tokens every head keeps whatever its budget: the first `sinks` and the last `window`
// positions, at most n_tokens.
std::size_t forced_tokens(std::size_t n_tokens, std::size_t sinks, std::size_t window);
// Whether position t of n_tokens is one of them.
bool is_forced(std::size_t t, std::size_t n_tokens, std::size_t sinks, std::size_t window);

// Budget per head in tokens from the params; throws InvalidInput when it is not above the
// forced tokens (window + sinks) or a fraction lies outside (0, 1].
std::size_t budget_per_head(const EvictionParams& p, const KvWindow& m);

// Streaming eviction during decode (h2o, streamingllm in the model's runtime cache, whose rows
// are in no particular order): the row to evict next, or n when every row is forced. Forced:
// positions below `sinks` and positions >= `newest` (the oldest row of the observation
// window). `oldest` (StreamingLLM): the lowest position; otherwise (H2O) the lowest score, ties
// to the lower position - the choices of a scan over the rows in chronological order.
std::size_t streaming_victim(const std::int32_t* position, const double* score, std::size_t n,
                             std::size_t sinks, std::int64_t newest, bool oldest);

// Whether the allocator splits each layer's budget on its own (uniform, adakv, waterfill, pyramid,
// adakv-pyramid, a budgets file), so a layer's plan needs only that layer's scores; adakv-global,
// duo and joint allocate over every layer.
bool allocates_per_layer(AllocMethod a);
// Whether e's plan of a layer needs only that layer's scores: a threshold (each head keeps its
// tokens scored >= threshold) or an allocator that allocates per layer.
bool plans_each_layer(const EvictionParams& e);

// Plans eviction a layer at a time. add_layer scores one layer's heads (layers in order). With an
// allocator that splits budgets within each layer (layer_local(): uniform, adakv, waterfill,
// pyramid, adakv-pyramid, a budgets file) that layer's plan is final at once and its scores are
// dropped: take_layer hands it out, so a caller fed by a prefill holds one layer's tensors at a
// time. adakv-global and duo allocate over every layer in finish(). Each head's plan does not
// depend on whether it was taken early: plan_eviction is add_layer over every layer, then finish.
class EvictionPlanner {
 public:
  // Reads what the method's files give (a budgets file, Q-Filters, duo's head scores) and checks
  // the parameters against `m` (the errors of plan_eviction below). `out_proj`: W_o will come
  // with each layer (CriticalKV needs it: UsageError otherwise).
  EvictionPlanner(const KvWindow& m, const EvictionParams& requested, const TokenScores* given = nullptr,
                  bool out_proj = false);
  ~EvictionPlanner();
  EvictionPlanner(EvictionPlanner&&) noexcept;
  EvictionPlanner& operator=(EvictionPlanner&&) noexcept;

  // The parameters planned with (a budgets file's own score options, sinks and allocator).
  const EvictionParams& params() const;
  bool layer_local() const;
  // Whether add_layer reads values (score_reads_values, CriticalKV) and W_o (CriticalKV).
  bool reads_values() const;
  bool reads_out_proj() const;
  // Layer l (the next one): query [n_heads, m.n_query, hd] (the last n_query positions), key
  // [n_kv_heads, T, hd], value (the keys' shape) and wo (W_o [dim, n_heads * hd]) when read.
  void add_layer(std::size_t l, const Tensor3& query, const Tensor3& key, const Tensor3* value,
                 const RowMatrix* wo, int threads);
  // layer_local(): layer l's plan [kv head], once added; each layer once.
  std::vector<HeadPlan> take_layer(std::size_t l);
  // The plan of every layer added (after the last one); layers taken are empty in it.
  EvictionPlan finish(int threads);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Scores every layer (reading keys and queries a layer at a time), allocates and selects.
// CriticalKV (p.critical) reads the dump's /layers/L/o_proj (InvalidInput naming it when absent).
EvictionPlan plan_eviction(const DumpReader& dump, const EvictionParams& p, int threads,
                           const ProgressFn& progress);
// A layer's output projection from a dump (DumpReader::read_out_proj); InvalidInput naming the file
// and /layers/0/o_proj when the dump lacks it.
OutProjSource dump_out_proj(const DumpReader& dump);
// The scores a dump gives for a score the planner cannot compute (p's, or its budgets file's):
// kvzap's, its surrogate (score.surrogate) applied to each layer's /layers/L/attn_input; nullopt
// for every other score. UsageError naming the dataset when the dump has no attention inputs.
std::optional<TokenScores> dump_given_scores(const DumpReader& dump, const EvictionParams& p);
// The same from any source of per-layer tensors: `source(l, query, key, value)` fills query
// [n_heads, m.n_query, hd] (the last n_query positions) and key [n_kv_heads, m.n_tokens, hd], and
// value (the keys' shape) when it is not nullptr: only for scores that read values
// (score_reads_values).
using LayerSource = std::function<void(std::size_t layer, Tensor3& query, Tensor3& key, Tensor3* value)>;
// The dump's layers as such a source (DumpReader::read_into; the reader must outlive it).
LayerSource dump_layer_source(const DumpReader& dump);
// `given`: the scores of a score the model computes (kvzip, [layer][kv head][token]); without
// them such a score is refused (UsageError: a dump cannot run the model). `out_proj`: each layer's
// W_o for CriticalKV (p.critical; UsageError without it); the source then also fills values.
// CriticalKV: each head's budget b (forced tokens included) as the allocator set it; stage 1
// keeps the forced tokens and the best-scored selectable ones up to floor(first_stage x b) (at
// least those the kvpress capacity rule protected), stage 2 the rest (critical_select).
EvictionPlan plan_eviction(const KvWindow& m, const LayerSource& source, const EvictionParams& p,
                           int threads, const ProgressFn& progress, const TokenScores* given = nullptr,
                           const OutProjSource& out_proj = {});

}  // namespace akv
