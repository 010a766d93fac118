#include "akv/eval/kvzip.h"

#include <algorithm>

#include "akv/core/parallel.h"
#include "akv/score/critical.h"

namespace akv {

KvzipPrompts kvzip_prompts(const Tokenizer& tok) {
  KvzipPrompts p;
  p.first = tok.encode("\n\nRepeat the previous context exactly.");
  p.later = tok.encode("\n\nRepeat the part of the previous context exactly, starting with");
  p.suffix = tok.encode("\n");
  return p;
}

TokenScores kvzip_scores(const Model& model, const std::vector<std::int32_t>& context, const KvzipPrompts& prompts,
                         std::size_t sinks, int threads, std::size_t chunk, bool plus) {
  const ModelConfig& c = model.config();
  const std::size_t n = context.size();
  TokenScores scores(c.n_layers, std::vector<std::vector<double>>(c.n_kv_heads, std::vector<double>(n, 0.0)));
  for (std::size_t start = 0; start < n; start += chunk) {
    const std::size_t end = std::min(n, start + chunk);
    std::vector<std::int32_t> tokens(context);
    tokens.insert(tokens.end(), start == 0 ? prompts.first.begin() : prompts.later.begin(),
                  start == 0 ? prompts.first.end() : prompts.later.end());
    if (start > 0) tokens.insert(tokens.end(), context.begin() + static_cast<std::ptrdiff_t>(start - std::min(start, kKvzipPrevious)),
                                 context.begin() + static_cast<std::ptrdiff_t>(start));
    tokens.insert(tokens.end(), prompts.suffix.begin(), prompts.suffix.end());
    tokens.insert(tokens.end(), context.begin() + static_cast<std::ptrdiff_t>(start),
                  context.begin() + static_cast<std::ptrdiff_t>(end));
    const PrefillResult pre = model.prefill(tokens, false, threads);
    parallel_for(c.n_layers, threads, [&](std::size_t l) {
      if (!plus) {
        kvzip_chunk_scores(pre.query[l], pre.key[l], c.kv_shape(), n, start, end, sinks, scores[l]);
        return;
      }
      // KVzip+: ||W_o[h] v_t|| of the chunk's tokens for every query head.
      const Tensor3 chunk_value = pre.value[l].rows(start, end - start);
      const auto out = head_value_out_norms(chunk_value, model.weights().layers[l].wo.to_f32(), c.n_heads, 2);
      kvzip_chunk_scores(pre.query[l], pre.key[l], c.kv_shape(), n, start, end, sinks, scores[l],
                         {&pre.input_norm[l], &out});
    });
  }
  return scores;
}

}  // namespace akv
