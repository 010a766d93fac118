#include "akv/eval/lanes.h"

#include <algorithm>

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

void run_lanes(const Model& model, const std::vector<DecodeLane>& lanes, std::size_t block,
               const NextToken& next_token, const TakeRows& take, int threads, AttentionMode attention) {
  std::vector<std::size_t> done(lanes.size(), 0);
  std::vector<std::int32_t> chosen(lanes.size());  // tokens next_token chose for this call
  std::vector<Model::Lane> call;
  std::vector<LaneRows> rows;
  RowMatrix logits;  // [rows of the call, vocab], one buffer for all calls
  for (;;) {
    call.clear();
    rows.clear();
    std::size_t row = 0;
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      const DecodeLane& l = lanes[i];
      if (done[i] >= l.steps) continue;
      const bool several = l.known && l.cache->layer_local();
      const std::size_t n = several ? std::min(block, l.steps - done[i]) : 1;
      const std::int32_t* tokens = l.known ? l.known + done[i] : &chosen[i];
      if (!l.known) chosen[i] = next_token(i, done[i]);
      call.push_back({l.cache, tokens, l.pos + done[i], n, l.bytes_after});
      rows.push_back({i, done[i], n, row});
      row += n;
    }
    if (call.empty()) return;
    model.decode_lanes(call.data(), call.size(), logits, threads, attention);
    for (const LaneRows& r : rows) done[r.lane] += r.n;
    take(rows, logits);
  }
}

}  // namespace akv
