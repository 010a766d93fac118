#pragma once
// The start of batched evaluation (perplexity and passkey): each prompt of a batch prefilled,
// then ingested by one cache per method, its lanes. A prompt's prefill tensors (queries, keys
// and values of every layer) are released as soon as its caches hold them, so a batch never
// holds more than one prompt's tensors per thread beside its caches.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "akv/kv/runtime.h"
#include "akv/model/model.h"

namespace akv {

struct PromptLanes {
  // Lane i * methods + m: prompt i through method m (nullopt: the full f32 cache).
  std::vector<std::unique_ptr<KvPolicy>> caches;
  std::vector<std::vector<float>> last_logits;  // per prompt: the logits after its last token
};

// Prompts on the threads (each prefill on one), or, with fewer prompts than threads, one prompt
// at a time on all of them, its caches filled on the threads. Caches and logits do not depend on
// the thread count. `max_positions`: the longest sequence (prompt and continuation) any lane
// will hold.
PromptLanes prefill_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::optional<CompressParams>>& methods, std::size_t max_positions,
                          int threads);

}  // namespace akv
