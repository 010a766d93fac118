#pragma once
// The lane engine: the one decode loop of every evaluation (perplexity, passkey, bench decode).
// A lane is one sequence through one cache. prefill_lanes starts a batch: each prompt prefilled,
// then ingested by one cache per method (a prompt's prefill tensors are released as soon as its
// caches hold them, so a batch never holds more than one prompt's tensors per thread beside its
// caches). run_lanes then advances the lanes together: each call decodes the next tokens of
// every unfinished lane through one Model::decode_lanes, whose rows do not depend on which
// lanes share a call, so every lane equals one decoded alone.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "akv/eval/kvzip.h"
#include "akv/kv/runtime.h"
#include "akv/model/model.h"

namespace akv {

struct PromptLanes {
  // Lane i * methods + m: prompt i through method m (nullopt: the full f32 cache).
  std::vector<std::unique_ptr<KvPolicy>> caches;
  // Per lane: the logits after its prompt's last token (in exact mode equal for a prompt's lanes).
  std::vector<std::vector<float>> last_logits;
  // Per lane: the most KV bytes resident while its prompt entered the cache, the rows not yet
  // compressed counted as the prefill holds them (f32 keys and values): exact - the prompt's K/V
  // (or the cache after it, when larger); chunked - the earlier chunks' cache plus the chunk;
  // batch - the cache after the prompt.
  std::vector<std::uint64_t> peak_bytes;
};

// How a prompt enters the caches:
//   exact      one full-precision prefill per prompt, then every method's cache ingests its K/V
//              (the method compresses at the end of the prompt: KIVI's and kvpress's protocol);
//   chunked:N  the prompt in chunks of N tokens (the last one shorter), each run through the
//              lane engine while the method's cache of the earlier chunks stays as it is: each
//              chunk query attends to the compressed earlier chunks and, exactly (f32), to the
//              chunk's rows up to its own (kv/chunk_cache.h). After each chunk the method
//              compresses it (KvPolicy::ingest_chunk): quantizers store its rows as decoded rows
//              are stored (what leaves the residual window is quantized); one-shot eviction
//              plans the chunk alone, with the chunk's last W queries, keeping round(budget x
//              chunk tokens) per head (sinks in the first chunk only), and the earlier chunks'
//              rows stay. Refused (UsageError): tiered, streaming eviction (h2o, streamingllm),
//              kvzip, joint and token budgets (--budget-tokens, budgets files). A prompt of at most N tokens is one chunk: exact attention, the method
//              compressing after it;
//   chunked:N:replan  the same, but one-shot eviction keeps every row of each chunk and then
//              cuts the whole cache, earlier chunks' kept rows included, back to round(budget x
//              tokens so far) per head (ChunkPlan::whole: decode_cut over the chunk's last W
//              queries, sinks by position); scores and allocators as decode-time compression
//              takes them (check_cut: snapkv, knorm, keydiff, lagkv, qfilter; uniform, adakv);
//   batch      every prompt token goes through the method's cache before attention, as llama.cpp
//              runs a batch (llama-perplexity): each token's K/V is appended (quantized as the
//              method stores it), then its query attends over the cache, causally, layer by layer
//              (the lane engine with the prompt as known tokens). Only for caches that need no
//              end-of-prompt decision: the quantizers (calibrated bits included), ggml and full;
//              UsageError for eviction and tiered methods. evaluate_perplexity runs it (and the
//              steps after it) with AttentionMode::llama, llama.cpp's query rounding.
// A PrefillMode compares equal to its kind alone (PrefillMode::batch) when that kind has no chunk.
struct PrefillMode {
  enum Kind { exact, batch, chunked };
  Kind kind = exact;
  std::size_t chunk = 0;  // chunked: tokens per chunk (>= 1)
  bool replan = false;    // chunked: one-shot eviction cuts the whole cache after each chunk
  PrefillMode(Kind k = exact, std::size_t n = 0, bool whole = false) : kind(k), chunk(n), replan(whole) {}
  friend bool operator==(const PrefillMode& a, const PrefillMode& b) {
    return a.kind == b.kind && a.chunk == b.chunk && a.replan == b.replan;
  }
  friend bool operator!=(const PrefillMode& a, const PrefillMode& b) { return !(a == b); }
};
// "exact", "batch", "chunked:N" or "chunked:N:replan".
std::string prefill_mode_name(PrefillMode m);
// The same names (N an integer >= 1); InvalidInput naming --prefill-mode otherwise.
PrefillMode parse_prefill_mode(const std::string& s);

// The cache geometry of a run of a model reaching max_positions positions: the model's windows
// when the run needs the windowed cache (ModelConfig::windowed_run). A model whose every layer is
// local (Mistral) runs only none and f32 past its window (UsageError naming the method otherwise:
// the windowed cache keeps the window's rows whatever the method).
KvGeometry run_geometry(const ModelConfig& c, std::size_t max_positions,
                        const std::vector<std::optional<CompressParams>>& methods);

// The attention path of a run under a prompt protocol: batch runs llama.cpp's arithmetic
// (AttentionMode::llama) and takes only `exact` (UsageError otherwise); exact and chunked keep
// `attention`.
AttentionMode protocol_attention(PrefillMode mode, AttentionMode attention);

struct PrefillOptions {
  PrefillMode mode = PrefillMode::exact;
  AttentionMode attention = AttentionMode::exact;  // batch, chunked: the decode attention path
  std::size_t block = 0;                           // batch, chunked: tokens per model call (0: auto)
  // The repeat prompts of kvzip methods (eval/kvzip.h): their scores are computed once per
  // prompt, before its caches ingest it. Without them a kvzip method is refused (UsageError).
  const KvzipPrompts* kvzip = nullptr;
};

// Prompts on the threads (each prefill on one), or, with fewer prompts than threads, one prompt
// at a time on all of them, its caches filled on the threads (batch: every lane through the lane
// engine). Caches and logits do not depend on the thread count. `max_positions`: the longest
// sequence (prompt and continuation) any lane will hold.
PromptLanes prefill_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::optional<CompressParams>>& methods, std::size_t max_positions,
                          int threads, const PrefillOptions& options = {});

// One lane of run_lanes: `steps` tokens at positions pos, pos + 1, ... through `cache`.
struct DecodeLane {
  KvPolicy* cache = nullptr;
  std::size_t pos = 0;
  std::size_t steps = 0;
  // The lane's tokens [steps] when known in advance (teacher forcing; several a call when the
  // cache's layers are independent); nullptr: run_lanes asks next_token before each step.
  const std::int32_t* known = nullptr;
  std::uint64_t* bytes_after = nullptr;  // [block]: cache bytes after each token of a call, or nullptr
};

// What one call decoded: lane `lane`'s steps [step, step + n), in logits rows [row, row + n).
struct LaneRows {
  std::size_t lane = 0, step = 0, n = 0, row = 0;
};

using NextToken = std::function<std::int32_t(std::size_t lane, std::size_t step)>;
using TakeRows = std::function<void(const std::vector<LaneRows>& rows, const RowMatrix& logits)>;

// Runs every lane to its last step: each call takes up to `block` steps of each lane with known
// tokens and a layer-local cache (one otherwise), then hands the rows to `take` (before the next
// call, so next_token sees them).
void run_lanes(const Model& model, const std::vector<DecodeLane>& lanes, std::size_t block,
               const NextToken& next_token, const TakeRows& take, int threads, AttentionMode attention);

// Continuations of prompts through methods: lane p * methods.size() + m continues prompt p
// through method m for n[p] tokens. Greedy: each step feeds the lane's last argmax. With
// `forced` (teacher forcing): step k feeds forced[p][k - 1] whatever the argmax was, and the
// lane sums log p(forced[p][k]) of every step k < n[p]; the argmax tokens are still recorded,
// so they equal the greedy ones up to the first argmax that differs from forced[p]. Every step
// decodes all unfinished lanes in one run_lanes call; each lane's tokens equal a lane decoded
// alone. With `question`, each cache ingests prompt p alone (a method compresses it without
// seeing the question: the query-agnostic protocol of kvpress), then question[p] is decoded
// through it (its tokens stay as the cache keeps decoded tokens) before the continuation.
// `prefill`: how the prompts enter the caches (batch: give attention = protocol_attention's).
struct Continuations {
  std::vector<std::vector<std::int32_t>> tokens;  // [lane]: the argmax of every step
  std::vector<double> logprob;                    // [lane]: with forced, the summed log-probabilities
  std::vector<std::uint64_t> bytes;               // [lane]: the cache's bytes after the last step
  // [lane]: the most KV bytes resident at once: the prompt's peak (PromptLanes::peak_bytes), or
  // the cache's while decoding (KvPolicy::peak_bytes, sampled after every step).
  std::vector<std::uint64_t> peak_bytes;
};

Continuations continue_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::size_t>& n, const std::vector<std::optional<CompressParams>>& methods,
                             int threads, AttentionMode attention, const std::vector<std::vector<std::int32_t>>* forced,
                             const std::vector<std::vector<std::int32_t>>* question = nullptr,
                             PrefillMode prefill = PrefillMode::exact, const KvzipPrompts* kvzip = nullptr);

// The same with a goal per lane (lane p * methods.size() + m): n steps, teacher-forced through
// *forced (at least n tokens) or greedy (nullptr). A prompt's lanes may mix both, e.g. a method
// listed twice: greedy in one lane and scored on a reference answer in the other, from one prefill.
struct LaneGoal {
  std::size_t n = 0;
  const std::vector<std::int32_t>* forced = nullptr;
};
Continuations continue_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::optional<CompressParams>>& methods, const std::vector<LaneGoal>& goals,
                             int threads, AttentionMode attention, const std::vector<std::vector<std::int32_t>>* question = nullptr,
                             PrefillMode prefill = PrefillMode::exact, const KvzipPrompts* kvzip = nullptr);

}  // namespace akv
