#pragma once
// The end-of-prompt decision of a cache method, one function for `akv compress` over a dump and
// for the runtime caches at the end of a prompt inside the model: which positions each KV head
// keeps (the eviction plan, or the joint tokens x bits plan) and at how many bits (a calibration
// file, a joint plan, or the per-head bits of a joint budgets file), as per-head parameters.
// The source is read a layer at a time, so dumps still stream.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "akv/alloc/eviction.h"
#include "akv/core/progress.h"
#include "akv/method/params.h"
#include "akv/tensor/kv_shape.h"
#include "akv/tensor/tensor.h"

namespace akv {

// Fills one layer's window queries [n_heads, m.n_query, hd] (the last n_query positions) and keys
// [n_kv_heads, m.n_tokens, hd]; `value` (the same shape as keys) only when it is not nullptr.
using PromptSource = std::function<void(std::size_t layer, Tensor3& query, Tensor3& key, Tensor3* value)>;

struct PromptPlan {
  CompressParams params;                 // as planned: head_bits filled, the eviction mode as planned
  std::optional<EvictionPlan> eviction;  // eviction and joint methods

  // Head (layer, head)'s kept positions, ascending; empty = every position.
  const std::vector<std::int32_t>& kept(std::size_t layer, std::size_t head) const;
  // Head (layer, head)'s quantizer parameters (its bits; f16 heads of a joint plan: none).
  CompressParams head(std::size_t layer, std::size_t head, std::size_t n_kv_heads) const {
    return params.for_head(layer, head, n_kv_heads);
  }
};

// What a method's calibration file gives it, read once for shape `m` (each part unless already
// set): kivi's per-head bits (calibration=) and nuq's codebooks at its key and value bits (none
// without a file: resolve_method_spec_for_bytes, for byte counts; coding rows refuses that).
void read_calibration_inputs(CompressParams& p, const KvWindow& m);

// The plan of `params` for a sequence of shape `m`. Its calibration inputs are read
// (read_calibration_inputs); a joint budgets file (--budgets from `akv allocate --method joint`) brings its
// bits, group, residual and layout (and each head's rotation when it records them) and needs
// --quant kivi (UsageError). Progress covers the
// scoring pass.
// `given`: the model's scores of a kvzip method ([layer][kv head][token]; alloc/eviction.h);
// `out_proj`: each layer's W_o for CriticalKV (alloc/eviction.h).
PromptPlan plan_prompt(const KvWindow& m, const PromptSource& source, const CompressParams& params,
                       int threads, const ProgressFn& progress, const TokenScores* given = nullptr,
                       const OutProjSource& out_proj = {});

}  // namespace akv
