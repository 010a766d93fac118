#pragma once
// `akv evaluate --model`: perplexity, KL and top-1 agreement of cache methods inside the
// model's decode loop. For each sequence the first P tokens are the prompt (one full-precision
// prefill, which every method then ingests: stores, compresses, evicts); the remaining tokens
// are teacher-forced through the method's cache, each attending to the cache as it stands after
// its own append (several tokens per model call when the caches allow: token_block below, the
// same results as one at a time). The reference ("full") keeps f32 K/V. Metrics are over the
// continuation tokens (positions P..n-1).
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/eval/batch.h"
#include "akv/eval/lanes.h"
#include "akv/kv/policy.h"
#include "akv/method/params.h"
#include "akv/model/model.h"

namespace akv {

struct PplMethod {
  std::string spec;                       // as given ("full", "kivi-2", "adakv:budget=0.2")
  std::optional<CompressParams> params;   // nullopt = full
};

// The methods of a model run: the full cache first (put there unless given first), then `given`.
std::vector<PplMethod> full_first(const std::vector<PplMethod>& given);
// A method's description in reports: describe(params), with "; int8 attention" when `int8`, or
// the reference's "f32 K/V (reference)".
std::string method_description(const PplMethod& m, bool int8);
// The same in a run of prompts (passkey, RULER): int8 from `attention`, and "; prompt MODE" when
// the prompt is not computed exactly.
std::string method_description(const PplMethod& m, AttentionMode attention, PrefillMode prefill);

struct PplOptions {
  std::vector<PplMethod> methods;  // "full" first is added by evaluate_perplexity if missing
  std::optional<std::size_t> prefill;  // prompt tokens; default half of each sequence
  std::size_t max_sequences = 0;       // 0 = all
  int threads = 1;
  // Sequences decoded together (0 = all, kBatchAuto: batch.h): each step decodes every
  // (sequence, method) pair of the batch in one Model::decode_lanes call. Metrics do not depend
  // on it (nor on threads).
  std::size_t batch = kBatchAuto;
  // Teacher-forced tokens each lane decodes per model call (0 = auto: batch.h). Applies when
  // every method's cache is layer-local (KvPolicy::layer_local); otherwise 1 (streaming
  // eviction and tiered caches act after every step). Metrics do not depend on it.
  std::size_t token_block = 0;
  // Decode attention path of every method's cache (decode_attention.h; "full" keeps f32 rows,
  // which both paths read exactly).
  AttentionMode attention = AttentionMode::exact;
  // How each prompt enters the caches (eval/lanes.h): exact prefill, chunked:N, or llama.cpp's batch.
  PrefillMode prefill_mode = PrefillMode::exact;
  // kvzip's repeat prompts (text runs: from the tokenizer); kvzip is refused without them.
  std::optional<KvzipPrompts> kvzip;
};

struct PplSums {
  double nll = 0, kl = 0;
  std::size_t top1 = 0, tokens = 0;
  std::uint64_t bytes = 0;      // cache bytes at the end of the sequence
  std::uint64_t host_bytes = 0;  // of which in host memory (the cold tier of tiered caches)
  std::uint64_t f16_bytes = 0;  // f16 size of K/V of the whole sequence
  // The most KV bytes resident at once for the sequence (Continuations::peak_bytes' rule: the
  // prompt's rows not yet compressed in f32, then the cache's peak_bytes after every call).
  std::uint64_t peak_bytes = 0;
  PplSums& operator+=(const PplSums& o);
  double ppl() const;
  // f(name, member) for every field, by its name in partial reports (+=, the part format).
  template <typename F>
  static void fields(F&& f) {
    f("nll", &PplSums::nll), f("kl", &PplSums::kl), f("top1", &PplSums::top1), f("tokens", &PplSums::tokens);
    f("bytes", &PplSums::bytes), f("host_bytes", &PplSums::host_bytes), f("f16_bytes", &PplSums::f16_bytes);
    f("peak_bytes", &PplSums::peak_bytes);
  }
};

// Cache bytes of one method along the first sequence (the prompt, then every decode step; at
// most kMaxTracePoints points, evenly spaced, the last step always included). Tier columns are
// filled for tiered caches only.
struct MemoryTrace {
  static constexpr std::size_t kMaxTracePoints = 128;
  std::vector<std::size_t> tokens;        // tokens the cache has seen (prompt + decoded)
  std::vector<std::uint64_t> bytes;       // all bytes stored
  std::vector<TierBytes> tiers;           // bytes and tokens per tier (tiered caches)
  nlohmann::json to_json() const;
  // f(name in partial reports, name in the report, member) for every tier column.
  template <typename F>
  static void tier_columns(F&& f) {
    f("hot", "hot_bytes", &TierBytes::hot), f("warm", "warm_bytes", &TierBytes::warm);
    f("cold", "cold_bytes", &TierBytes::cold), f("hot_tokens", "hot_tokens", &TierBytes::hot_tokens);
    f("warm_tokens", "warm_tokens", &TierBytes::warm_tokens), f("cold_tokens", "cold_tokens", &TierBytes::cold_tokens);
  }
  template <typename T>
  std::vector<T> column(T TierBytes::*member) const {
    std::vector<T> c;
    for (const TierBytes& t : tiers) c.push_back(t.*member);
    return c;
  }
};

struct PplReport {
  std::vector<std::string> specs;              // [methods], specs[0] == "full"
  std::vector<std::string> descriptions;
  std::vector<std::vector<PplSums>> sequences;  // [sequence][method]
  std::vector<std::size_t> prompt_tokens;       // [sequence]
  std::vector<MemoryTrace> traces;              // [method], along sequence 0
  AttentionMode attention = AttentionMode::exact;
  PrefillMode prefill_mode = PrefillMode::exact;  // reported only when not exact
  PplSums total(std::size_t method) const;
  nlohmann::json to_json() const;
  std::string to_csv() const;    // one row per sequence and method
  std::string to_table() const;
};

// Text cut as llama.cpp's llama-perplexity cuts it: `tokens` (the whole text, tokenized with a
// leading BOS when `bos` >= 0) into floor(n / n_ctx) chunks of n_ctx consecutive tokens (at most
// max_chunks; 0 = all), each chunk's first token replaced by BOS (bos >= 0). Scoring the second
// half as llama-perplexity does (tokens n_ctx/2 + 1 .. n_ctx - 1 of each chunk, each from the
// logits of the token before it) is evaluate_perplexity with prefill n_ctx / 2 + 1. InvalidInput
// when n_ctx < 4 or the text holds fewer than n_ctx tokens.
std::vector<std::vector<std::int32_t>> perplexity_chunks(std::vector<std::int32_t> tokens, std::size_t n_ctx,
                                                         std::int32_t bos, std::size_t max_chunks);

PplReport evaluate_perplexity(const Model& model,
                              const std::vector<std::vector<std::int32_t>>& sequences,
                              const PplOptions& o, const ProgressFn& progress);

}  // namespace akv
