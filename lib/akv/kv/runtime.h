#pragma once
// KV-cache methods inside the model's decode loop (implementations of KvPolicy).
//
//   full:    f32 rows, exactly what the model computed (the reference of KL and perplexity).
//   none / uniform / kivi (+ presets): the rows of akv-cache v1, kept as the decode goes: new
//            tokens enter the f16 residual window and are quantized as soon as they leave it
//            (per-channel keys in whole groups of G tokens, per-token rows one by one). After
//            the prompt, the cache equals what `akv compress` stores for the same tokens.
//   eviction methods: one-shot at the end of the prompt with the last W prompt queries
//            (snapkv, adakv, waterfill, pyramid, adakv-pyramid, adakv-global: the cache then
//            grows by the decoded tokens), or streaming (h2o, streamingllm: each head keeps its
//            budget during decode, evicting its lowest accumulated-attention / oldest
//            non-forced token after every step; the last row takes the evicted row's slot, so
//            rows are unordered and KvView::position says which token each one is). Streaming
//            eviction stores rows in f16 and does not combine with quantization.
//   threshold eviction (threshold=T): one-shot, each head keeps what scores >= T; with
//            decoding=on (kvpress's DMSPress decoding=True) each decoded token is scored when
//            appended (knorm, qfilter: its key; kvzap: its attention input, take_input) and, once
//            `window` newer tokens follow it (the prompt's last window tokens likewise, with their
//            prompt scores), evicted at the end of that step if it scores below T and is no sink.
// Attention (attention/decode_attention.h) reads the stored packed codes and f16 rows directly;
// only pre-RoPE keys keep a post-RoPE f32 copy for attention. The f32 rows of the residual
// window wait there as the quantization source (so that the cache equals `akv compress`).
// bytes() counts only what the cache format stores.
#include <algorithm>
#include <memory>
#include <optional>

#include "akv/kv/policy.h"
#include "akv/kv/stored_head.h"
#include "akv/method/params.h"
#include "akv/tensor/rope.h"

namespace akv {

// The KV shape of a runtime cache and the longest sequence it serves (positions 0 ..
// max_positions - 1): the size of the RoPE table of pre-RoPE keys. Callers pass the length of
// the sequences they run, never a model's declared context (which a file may put at 2^32).
struct KvGeometry : KvShape {
  std::size_t max_positions = 0;
  // The model's attention input width (its hidden size; 0 without a model): kvzap's surrogate
  // scores decoded tokens from inputs of this width (threshold eviction while decoding).
  std::size_t input_dim = 0;
  // With local layers (KvShape::layer_window; windowed()) make_kv_policy builds the method's cache
  // over the global layers inside a WindowedCache (kv/windowed.h).

  // A prompt of n_tokens with queries at its last n_query positions (what the scorers and
  // allocators read).
  KvWindow prompt_window(std::size_t n_tokens = 0, std::size_t n_query = 0) const {
    KvWindow m;
    m.kv_shape() = kv_shape();
    m.n_tokens = n_tokens;
    m.n_query = n_query;
    return m;
  }
};

// How many of a prompt's last query rows (of n_tokens) the method's cache reads when it ingests
// the prompt, so that a caller keeps only those (Model::prefill's query_rows): 0 without
// eviction or tiers; every row for H2O (attention accumulated over every query), Expected
// Attention (its Gaussian fits every query after the sinks) and the tiered cache's importance;
// min(n_tokens, max(window, 1)) for the other eviction scores (their observation window; the
// reported retained mass reads the last query when the window is 0). A cache given more rows
// reads the last ones it needs: the same plan.
std::size_t prompt_query_rows(const std::optional<CompressParams>& params, std::size_t n_tokens);

// nullopt = full (f32). Throws UsageError for combinations the runtime cannot run. A geometry with
// sliding-window layers gets a WindowedCache around the method's cache of the global layers.
std::unique_ptr<KvPolicy> make_kv_policy(const std::optional<CompressParams>& params,
                                         const KvGeometry& g, int threads = 1);

// The cache akv compress feeds a dump through (KvPolicy::ingest_layer / take_head), for the
// parameters of a plan (kv/prompt_plan.h): the runtime cache of the method, storing only (no
// post-RoPE copies of pre-RoPE keys, no streaming eviction: the plan is one-shot, and its
// budgets files and quantized H2O are allowed); llama.cpp's cache types as in the model.
std::unique_ptr<KvPolicy> make_stored_cache(const CompressParams& planned, const KvShape& shape, int threads);

}  // namespace akv
