#include "akv/eval/prompt_lanes.h"

#include "akv/core/parallel.h"

namespace akv {

PromptLanes prefill_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::optional<CompressParams>>& methods, std::size_t max_positions,
                          int threads) {
  const ModelConfig& c = model.config();
  const KvGeometry g{c.kv_shape(), max_positions};
  const std::size_t n = prompts.size(), n_methods = methods.size();
  PromptLanes out;
  out.caches.resize(n * n_methods);
  out.last_logits.resize(n);
  // Prefill of prompt i on `inner` threads, then its caches on `ingest` threads.
  auto one = [&](std::size_t i, int inner, int ingest) {
    const PrefillResult pre = model.prefill(prompts[i], false, inner);
    parallel_for(n_methods, ingest, [&](std::size_t m) {
      auto& cache = out.caches[i * n_methods + m];
      cache = make_kv_policy(methods[m], g, 1);
      cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompts[i].size()});
    });
    const auto last = pre.logits.row(pre.logits.rows() - 1);
    out.last_logits[i].assign(last.data(), last.data() + last.size());
  };
  if (n < static_cast<std::size_t>(threads)) {
    for (std::size_t i = 0; i < n; ++i) one(i, threads, threads);
  } else {
    parallel_for(n, threads, [&](std::size_t i) { one(i, 1, 1); });
  }
  return out;
}

}  // namespace akv
