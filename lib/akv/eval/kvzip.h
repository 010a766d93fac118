#pragma once
// KVzip's reconstruction pass inside akv's model (score/kvzip.h has the scores' definition): the
// context is cut into chunks of kKvzipChunk tokens; chunk i is prefilled again after the context
// as  prompt_i + suffix + chunk_i  (kvpress's KVzipPress for a model without a chat template:
// prompt_0 = "\n\nRepeat the previous context exactly.", prompt_i = "\n\nRepeat the part of the
// previous context exactly, starting with" + the last 8 tokens of chunk i-1, suffix = "\n"), one
// full-precision causal prefill of context + repeat per chunk, whose queries and keys score the
// chunk's tokens layer by layer. The cost: one prefill of n + about 2048 tokens per 2048 tokens
// of context.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "akv/model/model.h"
#include "akv/model/tokenizer.h"
#include "akv/score/kvzip.h"

namespace akv {

inline constexpr std::size_t kKvzipChunk = 2048;
inline constexpr std::size_t kKvzipPrevious = 8;  // tokens of the previous chunk the prompt quotes

// The repeat prompts as tokens of the model's tokenizer.
struct KvzipPrompts {
  std::vector<std::int32_t> first, later, suffix;
};
KvzipPrompts kvzip_prompts(const Tokenizer& tok);

// Scores [layer][kv head][token] of the context (the whole prompt, BOS included), `sinks` the
// first tokens each repeat query also attends to (kvpress's n_sink); `plus`: KVzip+'s
// normalization (score/kvzip.h; W_o dequantized to f32 per layer and chunk). Runs on `threads`;
// the scores do not depend on them.
TokenScores kvzip_scores(const Model& model, const std::vector<std::int32_t>& context, const KvzipPrompts& prompts,
                         std::size_t sinks, int threads, std::size_t chunk = kKvzipChunk, bool plus = false);

}  // namespace akv
