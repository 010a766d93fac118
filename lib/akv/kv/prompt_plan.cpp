#include "akv/kv/prompt_plan.h"

#include "akv/alloc/budgets_file.h"
#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/kv/joint.h"

namespace akv {

const std::vector<std::int32_t>& PromptPlan::kept(std::size_t layer, std::size_t head) const {
  static const std::vector<std::int32_t> all;
  return eviction ? eviction->heads[layer][head].kept : all;
}

void read_calibration_inputs(CompressParams& p, const KvWindow& m) {
  if (!p.calibration_file.empty() && p.head_bits.empty()) p.head_bits = read_calibration(p.calibration_file, m);
  if (auto* g = std::get_if<GgmlCacheParams>(&p.mode); g && !g->types.empty() && g->head_types.empty()) {
    const CalibrationTypes t = read_calibration_types(g->types, m);
    const std::string rotate = rotation_name(p.rotate);
    if (t.rotate != rotate || (p.rotate == RotationKind::random && p.rotate_seed != 0)) {
      throw UsageError("the calibration's types were measured with rotate=" + t.rotate + " (random: seed 0); this cache rotates " + rotate,
                       {g->types, "params.rotate", t.rotate});
    }
    g->head_types = t.types;
  }
  if (p.method == Quantizer::nuq && !p.codebooks && !p.codebook_file.empty()) {
    p.codebooks = std::make_shared<const NuqCodebooks>(read_calibration_nuq(p.codebook_file, m, p.key.bits, p.value.bits));
  }
}

PromptPlan plan_prompt(const KvWindow& m, const PromptSource& source, const CompressParams& params,
                       int threads, const ProgressFn& progress, const TokenScores* given,
                       const OutProjSource& out_proj) {
  PromptPlan plan;
  plan.params = params;
  CompressParams& p = plan.params;
  read_calibration_inputs(p, m);
  if (!p.eviction()) return plan;
  if (p.eviction()->alloc == AllocMethod::joint) {
    plan.eviction = joint_plan(
        m, [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3& v) { source(l, q, k, &v); }, params, threads,
        progress, p);
    return plan;
  }
  plan.eviction = plan_eviction(
      m, [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3* v) { source(l, q, k, v); }, *params.eviction(), threads,
      progress, given, out_proj);
  p.mode = plan.eviction->params;
  if (plan.eviction->params.alloc == AllocMethod::file) {
    // Joint budgets carry per-head bits (and the quantizer they were measured with).
    const std::string& path = plan.eviction->params.budgets_file;
    const BudgetsRead file = read_budgets(path, m);
    if (!file.bits.empty()) {
      if (params.method != Quantizer::kivi) {
        throw UsageError("these budgets carry per-head bits (joint allocation): add --quant kivi",
                         {path, "--quant", quantizer_name(params.method)});
      }
      p.head_bits = file.bits;
      p.head_tensor_types = file.types;
      p.calibration_file = path;
      if (!file.rotate.empty()) {  // each head rotated as the plan chose (random: its seed)
        p.head_rotate = file.rotate;
        p.rotate_seed = file.rotate_seed;
      }
      if (file.joint) {
        p.key.group = p.value.group = file.group.value_or(p.key.group);
        p.residual = file.residual.value_or(p.residual);
        p.key.axis = QuantAxis::channel;
        p.value.axis = QuantAxis::token;
      }
    }
  }
  return plan;
}

}  // namespace akv
