#pragma once
// Eviction flags shared by `akv compress` (eviction methods) and `akv allocate`.
#include <CLI/CLI.hpp>

#include "akv/method/params.h"

namespace akv::cli {

template <typename T>
void add_optional(CLI::App* sub, const std::string& name, std::optional<T>& target,
                  const std::string& help) {
  sub->add_option_function<T>(name, [&target](const T& v) { target = v; }, help);
}

inline void add_eviction_flags(CLI::App* sub, EvictionRequest& r, bool with_budgets_file) {
  add_optional(sub, "--budget", r.budget,
               "Budget as a fraction of the tokens, in (0, 1]: round(f * n_tokens) tokens per KV "
               "head on average, window and sinks included");
  add_optional(sub, "--budget-tokens", r.budget_tokens,
               "Budget as tokens per KV head on average (window and sinks included)");
  if (with_budgets_file) {
    add_optional(sub, "--budgets", r.budgets_file,
                 "Per-head budgets from `akv allocate -o` (its scoring settings are used)");
  }
  add_optional(sub, "--window", r.window,
               "Observation window W: the last W query positions score the tokens and the last W "
               "tokens are always kept (default 32; <= the dump's n_query)");
  add_optional(sub, "--sinks", r.sinks,
               "First tokens always kept (default 4 for streamingllm, 0 otherwise)");
  add_optional(sub, "--pool", r.pool, "SnapKV pooling over tokens: max (default) or avg");
  add_optional(sub, "--kernel", r.kernel, "SnapKV pooling kernel, odd (default 7; 1 = none)");
  add_optional(sub, "--gqa-reduce", r.gqa_reduce,
               "Combine the scores of a KV group's query heads: mean (default) or max");
  add_optional(sub, "--alpha", r.alpha, "Ada-KV floor fraction in [0, 1] (default 0.2)");
  add_optional(sub, "--beta", r.beta, "PyramidKV beta >= 1 (default 20)");
  add_optional(sub, "--min-tokens", r.min_tokens,
               "Water-filling: selectable tokens every head starts with (default 0)");
  add_optional(sub, "--step", r.step, "Water-filling: tokens awarded per step (default 1)");
}

}  // namespace akv::cli
