#include "akv/alloc/eviction.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <fstream>
#include <numeric>

#include "akv/alloc/alloc.h"
#include "akv/alloc/budgets_file.h"
#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/score/kvzap.h"
#include "akv/score/qfilter.h"

namespace akv {
namespace {

// duo's calibrated head scores (EvictionParams::duo_heads), flattened layer by layer; the file's
// streaming heads must be the method's (InvalidInput naming the field otherwise).
std::vector<double> read_duo_heads(const EvictionParams& p, const KvShape& shape) {
  const DuoHeadScores d = read_calibration_duo(p.duo_heads, shape);
  const std::pair<const char*, std::pair<std::size_t, std::size_t>> checks[] = {{"sinks", {d.sinks, p.sinks}},
                                                                               {"window", {d.window, p.score.window}}};
  for (const auto& [name, v] : checks) {
    if (v.first != v.second) {
      throw InvalidInput("head scores measured with streaming heads of another " + std::string(name) + " (the method's: " +
                             std::to_string(v.second) + "; calibrate with --duo-" + name + ")",
                         {p.duo_heads, std::string("summary.duo.") + name, std::to_string(v.first)});
    }
  }
  std::vector<double> flat;
  for (const auto& l : d.error) flat.insert(flat.end(), l.begin(), l.end());
  return flat;
}

// The allocator's base (selectable tokens per head) of each layer: PyramidKV's schedule for
// pyramid and adakv-pyramid, else `base`.
std::vector<std::size_t> layer_bases(const EvictionParams& p, AllocMethod alloc, std::size_t L, std::size_t base,
                                     std::size_t T, std::size_t forced) {
  if (alloc != AllocMethod::pyramid && alloc != AllocMethod::adakv_pyramid) return std::vector<std::size_t>(L, base);
  if (p.capacity_rule == CapacityRule::exact_total) return pyramid_layer_budgets(L, base, p.beta, T - forced);
  // KVCache-Factory's PyramidKVCluster: prompts shorter than twice the base get no pyramid.
  if (alloc == AllocMethod::pyramid && T < 2 * base) return std::vector<std::size_t>(L, base);
  return pyramid_layer_budgets_official(L, base, p.beta, T - forced);
}

// Runs `allocate` over the heads of every layer at once (flattened layer by layer, moved out of
// `sorted`) and splits its counts back into layers.
template <class Allocate>
std::vector<std::vector<std::size_t>> across_layers(std::vector<SortedScores>& sorted, const Allocate& allocate) {
  SortedScores all;
  for (auto& l : sorted) {
    for (auto& h : l) all.push_back(std::move(h));
  }
  const std::vector<std::size_t> c = allocate(all);
  std::vector<std::vector<std::size_t>> extra;
  std::size_t at = 0;
  for (const auto& l : sorted) {
    extra.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(at), c.begin() + static_cast<std::ptrdiff_t>(at + l.size()));
    at += l.size();
  }
  return extra;
}

}  // namespace

bool allocates_per_layer(AllocMethod a) {
  return a != AllocMethod::adakv_global && a != AllocMethod::duo && a != AllocMethod::joint;
}

bool plans_each_layer(const EvictionParams& e) { return e.threshold || allocates_per_layer(e.alloc); }

bool is_forced(std::size_t t, std::size_t T, std::size_t sinks, std::size_t window) {
  return t < sinks || t + window >= T;
}

std::size_t forced_tokens(std::size_t n_tokens, std::size_t sinks, std::size_t window) {
  return std::min(n_tokens, sinks + window);
}

std::size_t budget_per_head(const EvictionParams& p, const KvWindow& m) {
  const std::size_t T = m.n_tokens;
  std::size_t b = 0;
  if (p.budget_fraction) {
    const double f = *p.budget_fraction;
    if (!(f > 0.0 && f <= 1.0)) {
      throw InvalidInput("budget fraction must be in (0, 1]", {"", "--budget", format_number(f)});
    }
    b = static_cast<std::size_t>(std::llround(f * static_cast<double>(T)));
  } else if (p.budget_tokens) {
    b = *p.budget_tokens;
  } else {
    throw UsageError("an eviction method needs --budget, --budget-tokens or --budgets", {"", "--budget"});
  }
  const std::size_t forced = forced_tokens(T, p.sinks, p.score.window);
  if (b <= forced && b < T) {
    throw InvalidInput("budget must exceed the always-kept tokens (window " +
                           std::to_string(p.score.window) + " + sinks " + std::to_string(p.sinks) +
                           " = " + std::to_string(forced) + " per head)",
                       {"", p.budget_fraction ? "--budget" : "--budget-tokens",
                        p.budget_fraction ? format_number(*p.budget_fraction) + " (" + std::to_string(b) + " tokens)"
                                          : std::to_string(b)});
  }
  return std::min(b, T);
}

std::size_t EvictionPlan::total_tokens() const {
  std::size_t n = 0;
  for (const auto& l : heads) {
    for (const auto& h : l) n += h.tokens;
  }
  return n;
}

double EvictionPlan::fraction() const {
  std::size_t slots = 0;
  for (const auto& l : heads) slots += l.size() * n_tokens;
  return slots ? static_cast<double>(total_tokens()) / static_cast<double>(slots) : 0.0;
}

double EvictionPlan::retained_min() const {
  double v = INFINITY;
  for (const auto& l : heads) {
    for (const auto& h : l) v = std::min(v, h.retained_mass);
  }
  return std::isfinite(v) ? v : 0.0;
}

double EvictionPlan::retained_mean() const {
  double s = 0;
  std::size_t n = 0;
  for (const auto& l : heads) {
    for (const auto& h : l) {
      s += h.retained_mass;
      ++n;
    }
  }
  return n ? s / static_cast<double>(n) : 0.0;
}

nlohmann::json EvictionPlan::summary_json() const {
  return {{"params", params.to_json()},
          {"budget_tokens_per_head", budget_per_head},
          {"forced_tokens_per_head", forced},
          {"total_tokens", total_tokens()},
          {"fraction", fraction()},
          {"retained_mass_min", retained_min()},
          {"retained_mass_mean", retained_mean()}};
}

LayerSource dump_layer_source(const DumpReader& dump) {
  return [&dump](std::size_t l, Tensor3& query, Tensor3& key, Tensor3* value) {
    dump.read_into(key, l, DumpField::key);
    dump.read_into(query, l, DumpField::query);
    if (value) dump.read_into(*value, l, DumpField::value);
  };
}

OutProjSource dump_out_proj(const DumpReader& dump) {
  if (!dump.has_out_proj()) {
    throw InvalidInput("CriticalKV weighs values by the attention output projection; this dump has none (write it "
                       "with akv dump --out-proj, or /layers/L/o_proj with h5py)",
                       {dump.path(), "/layers/0/o_proj", "missing"});
  }
  return [&dump](std::size_t l, RowMatrix& wo) { wo = dump.read_out_proj(l); };
}

std::optional<TokenScores> dump_given_scores(const DumpReader& dump, const EvictionParams& p) {
  const EvictionParams e = p.alloc == AllocMethod::file ? read_budgets(p.budgets_file, dump.meta()).params : p;
  if (e.score.method != ScoreMethod::kvzap) return std::nullopt;
  check_score_file(e.score);
  if (!dump.has_matrix(DumpMatrix::attn_input)) {
    throw UsageError("kvzap scores tokens from their attention inputs: write the dump with akv dump --kvzap",
                     {dump.path(), dump_matrix_path(0, DumpMatrix::attn_input), "missing"});
  }
  const DumpMeta& m = dump.meta();
  const KvzapModel zap = read_calibration_kvzap(e.score.surrogate, m, dump.input_dim());
  TokenScores out(m.n_layers);
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    kvzap_layer_scores(zap[l], dump.read_matrix(l, DumpMatrix::attn_input), out[l]);
  }
  return out;
}

EvictionPlan plan_eviction(const DumpReader& dump, const EvictionParams& p, int threads,
                           const ProgressFn& progress) {
  require_windows_hold_tokens(dump.meta(), dump.path(), "eviction planning");
  // A budgets file may bring CriticalKV with its parameters: W_o whenever the dump has it.
  const bool out_proj = p.critical || dump.has_out_proj();
  const std::optional<TokenScores> given = dump_given_scores(dump, p);
  return plan_eviction(
      dump.meta(),
      dump_layer_source(dump),
      p, threads, progress, given ? &*given : nullptr, out_proj ? dump_out_proj(dump) : OutProjSource{});
}

struct EvictionPlanner::State {
  KvWindow m;
  EvictionParams p;
  AllocMethod planned = AllocMethod::uniform;  // the allocator, a budgets file's own
  const TokenScores* given = nullptr;
  std::vector<std::vector<std::size_t>> file_budgets;
  QFilters qfilters;              // qfilter: [layer][kv head][head_dim]
  std::vector<double> duo_heads;  // duo with heads=: [layer * H + head] streaming errors
  EvictionPlan plan;
  std::size_t base = 0;                   // selectable tokens per head (the allocator's base)
  std::vector<std::size_t> layer_base;    // pyramid, adakv-pyramid: each layer's base
  std::vector<std::size_t> critical_base; // CriticalKV under kvpress's capacity rule: each layer's base
  bool protects = false;                  // CriticalKV: stage 1 keeps what the capacity rule protected
  // Per layer until its plan is made: each head's scores, selectable positions by score, their
  // scores in that order, and (CriticalKV) the norms of its values through W_o.
  std::vector<std::vector<HeadScores>> scores;
  std::vector<std::vector<std::vector<std::size_t>>> order;
  std::vector<SortedScores> sorted;
  std::vector<std::vector<std::vector<double>>> out_norm;
  std::size_t added = 0, kept = 0;  // kept: tokens selected so far (threshold: the mean is the budget)
  std::vector<bool> taken;

  bool local() const { return plans_each_layer(p); }

  // Layer l's extra (selectable) tokens per head, for a layer-local allocator or a threshold.
  std::vector<std::size_t> layer_extra(std::size_t l) const {
    const std::size_t H = m.n_kv_heads;
    if (p.threshold) {  // each head's selectable scores >= threshold (sorted descending)
      std::vector<std::size_t> extra(H);
      for (std::size_t h = 0; h < H; ++h) {
        const std::vector<double>& sc = sorted[l][h];
        extra[h] = static_cast<std::size_t>(
            std::partition_point(sc.begin(), sc.end(), [&](double v) { return v >= *p.threshold; }) - sc.begin());
      }
      return extra;
    }
    switch (p.alloc) {
      case AllocMethod::uniform: return allocate_uniform(sorted[l], base);
      case AllocMethod::adakv: return allocate_adakv(sorted[l], base, p.alpha, p.capacity_rule, plan.forced);
      case AllocMethod::waterfill: return allocate_waterfill(sorted[l], H * base, p.min_tokens, p.step);
      case AllocMethod::pyramid: return allocate_uniform(sorted[l], layer_base[l]);
      case AllocMethod::adakv_pyramid:
        return allocate_adakv(sorted[l], layer_base[l], p.alpha, p.capacity_rule, plan.forced);
      case AllocMethod::file: {
        std::vector<std::size_t> extra(H);
        for (std::size_t h = 0; h < H; ++h) extra[h] = file_budgets[l][h] - plan.forced;
        return extra;
      }
      default: throw std::logic_error("EvictionPlanner: not a layer-local allocator");
    }
  }

  // Layer l's heads planned with `extra` selectable tokens each; its scores dropped.
  void select(std::size_t l, const std::vector<std::size_t>& extra, int threads) {
    const std::size_t T = m.n_tokens, H = m.n_kv_heads, W = p.score.window;
    if (p.critical) {
      parallel_for(H, threads, [&](std::size_t h) {
        const std::size_t budget = plan.forced + extra[h];
        // Python's int(head_budget * first_stage_ratio), the forced tokens among them.
        const auto stage1 = static_cast<std::size_t>(static_cast<double>(budget) * p.first_stage);
        std::size_t first = stage1 > plan.forced ? stage1 - plan.forced : 0;
        if (protects) first = std::max(first, kvpress_protected(critical_base[l], plan.forced, p.alpha, order[l][h].size()));
        critical_select(order[l][h], extra[h], first, scores[l][h].score, out_norm[l][h]);
      });
    }
    for (std::size_t h = 0; h < H; ++h) {
      HeadPlan& hp = plan.heads[l][h];
      for (std::size_t t = 0; t < T; ++t) {
        if (is_forced(t, T, p.sinks, W)) hp.kept.push_back(static_cast<std::int32_t>(t));
      }
      for (std::size_t i = 0; i < extra[h]; ++i) hp.kept.push_back(static_cast<std::int32_t>(order[l][h][i]));
      std::sort(hp.kept.begin(), hp.kept.end());
      hp.tokens = hp.kept.size();
      kept += hp.tokens;
      for (std::int32_t t : hp.kept) {
        hp.retained_mass += scores[l][h].mass[static_cast<std::size_t>(t)];
        hp.kept_score.push_back(scores[l][h].score[static_cast<std::size_t>(t)]);
      }
    }
    scores[l] = {};
    order[l] = {};
    sorted[l] = {};
    if (p.critical) out_norm[l] = {};
  }
};

EvictionPlanner::EvictionPlanner(const KvWindow& m, const EvictionParams& requested, const TokenScores* given,
                                 bool out_proj)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.m = m;
  s.given = given;
  EvictionParams& p = s.p;
  p = requested;
  s.planned = p.alloc;
  if (p.alloc == AllocMethod::file) {
    // Score options and sinks come from the file, so selection matches its allocation.
    BudgetsRead file = read_budgets(p.budgets_file, m);
    s.file_budgets = std::move(file.tokens);
    s.planned = file.params.alloc;
    EvictionParams fp = file.params;
    fp.alloc = AllocMethod::file;
    fp.budgets_file = p.budgets_file;
    p = fp;
  }
  if (p.score.method == ScoreMethod::kvzip && !given) {
    throw UsageError("kvzip scores tokens by the model's reconstruction of its context: it runs in "
                     "akv evaluate --model only", {"", "--score", "kvzip"});
  }
  if (p.score.method == ScoreMethod::kvzap && !given) {
    throw UsageError("kvzap scores tokens from their attention inputs: a dump written with akv dump --kvzap, "
                     "or akv evaluate --model", {"", "--score", "kvzap"});
  }
  check_score_file(p.score);
  validate_score_options(p.score, m);
  const std::size_t T = m.n_tokens, L = m.n_layers, H = m.n_kv_heads;
  if (score_is_given(p.score.method)) {
    if (given->size() != L || (*given)[0].size() != H || (*given)[0][0].size() != T) {
      throw std::logic_error("plan_eviction: the given scores do not match the shape");
    }
  }
  if (p.score.method == ScoreMethod::qfilter) s.qfilters = read_calibration_qfilters(p.score.qfilters, m);
  if (p.alloc == AllocMethod::duo && !p.duo_heads.empty()) s.duo_heads = read_duo_heads(p, m);
  if (p.critical && !out_proj) {
    throw UsageError("CriticalKV weighs values by the attention output projection: it needs a dump with "
                     "/layers/L/o_proj or akv evaluate --model", {"", "--critical", "on"});
  }
  if (p.alloc == AllocMethod::joint) {
    throw UsageError("joint plans are made by plan_joint (kv/joint.h), not by plan_eviction",
                     {"", "--method", "joint"});
  }
  EvictionPlan& plan = s.plan;
  plan.params = p;
  plan.n_tokens = T;
  plan.forced = forced_tokens(T, p.sinks, p.score.window);
  if (p.alloc == AllocMethod::file) {
    plan.budget_per_head = 0;
    for (const auto& l : s.file_budgets) plan.budget_per_head = std::accumulate(l.begin(), l.end(), plan.budget_per_head);
    plan.budget_per_head /= (L * H);
  } else if (p.threshold) {
    plan.budget_per_head = T;  // until finish(): the mean kept
  } else {
    plan.budget_per_head = budget_per_head(p, m);
  }
  plan.heads.assign(L, std::vector<HeadPlan>(H));
  s.base = plan.budget_per_head - std::min(plan.budget_per_head, plan.forced);
  s.layer_base = layer_bases(p, p.alloc, L, s.base, T, plan.forced);
  if (p.critical) {
    // Stage 1 also keeps what kvpress's capacity rule protected (a budgets file: as its allocator did).
    s.protects = p.capacity_rule == CapacityRule::kvpress &&
                 (s.planned == AllocMethod::adakv || s.planned == AllocMethod::adakv_pyramid ||
                  s.planned == AllocMethod::adakv_global);
    const std::size_t file_budget = p.alloc == AllocMethod::file ? budget_per_head(p, m) : 0;
    const std::size_t planned_base = p.alloc == AllocMethod::file ? file_budget - std::min(file_budget, plan.forced) : s.base;
    s.critical_base = s.protects ? layer_bases(p, s.planned, L, planned_base, T, plan.forced) : std::vector<std::size_t>(L, 0);
  }
  s.scores.resize(L);
  s.order.resize(L);
  s.sorted.resize(L);
  s.out_norm.resize(p.critical ? L : 0);
  s.taken.assign(L, false);
}

EvictionPlanner::~EvictionPlanner() = default;
EvictionPlanner::EvictionPlanner(EvictionPlanner&&) noexcept = default;
EvictionPlanner& EvictionPlanner::operator=(EvictionPlanner&&) noexcept = default;

const EvictionParams& EvictionPlanner::params() const { return s_->p; }
bool EvictionPlanner::layer_local() const { return s_->local(); }
bool EvictionPlanner::reads_values() const { return score_reads_values(s_->p.score) || s_->p.critical; }
bool EvictionPlanner::reads_out_proj() const { return s_->p.critical; }

void EvictionPlanner::add_layer(std::size_t l, const Tensor3& query, const Tensor3& key, const Tensor3* value,
                                const RowMatrix* wo, int threads) {
  State& s = *s_;
  const EvictionParams& p = s.p;
  if (l != s.added || l >= s.m.n_layers) throw std::logic_error("EvictionPlanner: layers in order");
  if ((reads_values() && !value) || (p.critical && !wo)) throw std::logic_error("EvictionPlanner: values and W_o");
  const std::size_t T = s.m.n_tokens, H = s.m.n_kv_heads, W = p.score.window;
  if (p.critical) s.out_norm[l] = projected_value_norms(*value, *wo, s.m.n_heads, threads);
  s.scores[l].resize(H);
  s.order[l].resize(H);
  s.sorted[l].resize(H);
  parallel_for(H, threads, [&](std::size_t h) {
    HeadScores& hs = s.scores[l][h];
    hs = score_head(query, key, h, s.m, p.score, reads_values() ? value : nullptr, p.sinks);
    if (score_is_given(p.score.method)) hs.score = (*s.given)[l][h];
    if (p.score.method == ScoreMethod::qfilter) hs.score = qfilter_scores(key, h, s.qfilters[l][h]);
    const std::vector<double>& sc = hs.score;
    std::vector<std::size_t>& o = s.order[l][h];
    for (std::size_t t = 0; t < T; ++t) {
      if (!is_forced(t, T, p.sinks, W)) o.push_back(t);
    }
    std::stable_sort(o.begin(), o.end(), [&](std::size_t a, std::size_t b) { return sc[a] > sc[b]; });
    s.sorted[l][h].resize(o.size());
    for (std::size_t i = 0; i < o.size(); ++i) s.sorted[l][h][i] = sc[o[i]];
  });
  ++s.added;
  if (s.local()) s.select(l, s.layer_extra(l), threads);
}

std::vector<HeadPlan> EvictionPlanner::take_layer(std::size_t l) {
  State& s = *s_;
  if (!s.local() || l >= s.added || s.taken[l]) throw std::logic_error("EvictionPlanner: take an added layer once");
  s.taken[l] = true;
  return std::move(s.plan.heads[l]);
}

EvictionPlan EvictionPlanner::finish(int threads) {
  State& s = *s_;
  const std::size_t L = s.m.n_layers;
  if (s.added != L) throw std::logic_error("EvictionPlanner: finish after every layer");
  if (!s.local()) {
    std::vector<std::vector<std::size_t>> extra = across_layers(s.sorted, [&](const SortedScores& all) {
      return s.p.alloc == AllocMethod::duo
                 ? allocate_duo(all, s.base, s.duo_heads.empty() ? nullptr : &s.duo_heads)
                 : allocate_adakv(all, s.base, s.p.alpha, s.p.capacity_rule, s.plan.forced);
    });
    for (std::size_t l = 0; l < L; ++l) s.select(l, extra[l], threads);
  }
  if (s.p.threshold) s.plan.budget_per_head = s.kept / (L * s.m.n_kv_heads);
  return std::move(s.plan);
}

EvictionPlan plan_eviction(const KvWindow& m, const LayerSource& source,
                           const EvictionParams& requested, int threads,
                           const ProgressFn& progress, const TokenScores* given, const OutProjSource& out_proj) {
  EvictionPlanner planner(m, requested, given, static_cast<bool>(out_proj));
  Tensor3 key, query, value;  // each layer in the previous one's storage
  RowMatrix wo;
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    source(l, query, key, planner.reads_values() ? &value : nullptr);
    if (planner.reads_out_proj()) out_proj(l, wo);
    planner.add_layer(l, query, key, planner.reads_values() ? &value : nullptr, &wo, threads);
    if (progress) progress(l + 1, m.n_layers);
  }
  return planner.finish(threads);
}

std::size_t streaming_victim(const std::int32_t* position, const double* score, std::size_t n,
                             std::size_t sinks, std::int64_t newest, bool oldest) {
  const auto forced = [&](std::int32_t pos) { return static_cast<std::size_t>(pos) < sinks || pos >= newest; };
  if (oldest) {
    // Positions are distinct: the smallest candidate position (a branch-free reduction the
    // compiler vectorizes), then its row.
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    for (std::size_t i = 0; i < n; ++i) best = std::min(best, forced(position[i]) ? best : std::int64_t{position[i]});
    for (std::size_t i = 0; i < n; ++i) {
      if (position[i] == best) return i;
    }
    return n;
  }
  std::size_t victim = n;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t pos = position[i];
    if (forced(pos)) continue;
    if (victim == n || score[i] < score[victim] || (score[i] == score[victim] && pos < position[victim])) victim = i;
  }
  return victim;
}

}  // namespace akv
