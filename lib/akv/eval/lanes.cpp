#include "akv/eval/lanes.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "akv/alloc/calibration_file.h"
#include "akv/alloc/eviction.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/eval/batch.h"
#include "akv/eval/kvzap_prefill.h"
#include "akv/eval/token_metrics.h"
#include "akv/kv/chunk_cache.h"
#include "akv/kv/runtime.h"

namespace akv {
namespace {

std::int32_t argmax_token(const float* logits, std::size_t n) {
  return static_cast<std::int32_t>(std::max_element(logits, logits + n) - logits);
}

}  // namespace

std::string prefill_mode_name(PrefillMode m) {
  switch (m.kind) {
    case PrefillMode::batch: return "batch";
    case PrefillMode::chunked: return "chunked:" + std::to_string(m.chunk) + (m.replan ? ":replan" : "");
    case PrefillMode::exact: break;
  }
  return "exact";
}

PrefillMode parse_prefill_mode(const std::string& s) {
  if (s == "exact") return PrefillMode::exact;
  if (s == "batch") return PrefillMode::batch;
  const std::string head = "chunked:";
  if (s.rfind(head, 0) == 0) {
    const std::string tail = ":replan";
    const bool replan = s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    const std::string n = s.substr(head.size(), s.size() - head.size() - (replan ? tail.size() : 0));
    if (!n.empty() && n.size() <= 9 && std::all_of(n.begin(), n.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
        std::stoul(n) >= 1) {
      return {PrefillMode::chunked, std::stoul(n), replan};
    }
    throw InvalidInput("chunked:N[:replan] takes a chunk of N >= 1 tokens", {"", "--prefill-mode", s});
  }
  throw InvalidInput("unknown prefill mode (exact, chunked:N, chunked:N:replan, batch)", {"", "--prefill-mode", s});
}

AttentionMode protocol_attention(PrefillMode mode, AttentionMode attention) {
  if (mode.kind != PrefillMode::batch) return attention;
  if (attention != AttentionMode::exact) {
    throw UsageError("--prefill-mode batch uses llama.cpp's attention arithmetic; it takes --attention exact",
                     {"", "--attention", attention_mode_name(attention)});
  }
  return AttentionMode::llama;
}

namespace {

// Runs lanes of known tokens to their end; last[lane] <- the logits after the lane's last token
// (untouched for a lane without steps).
void run_known(const Model& model, const std::vector<DecodeLane>& lanes, std::size_t block,
               std::vector<std::vector<float>>& last, int threads, AttentionMode attention) {
  run_lanes(
      model, lanes, block, [](std::size_t, std::size_t) { return std::int32_t{0}; },
      [&](const std::vector<LaneRows>& rows, const RowMatrix& logits) {
        for (const LaneRows& r : rows) {
          if (r.step + r.n < lanes[r.lane].steps) continue;
          const auto row = logits.row(static_cast<Eigen::Index>(r.row + r.n - 1));
          last[r.lane].assign(row.data(), row.data() + row.size());
        }
      },
      threads, attention);
}

// Batch mode: every prompt token through each lane's (empty) cache, several a call.
PromptLanes prefill_batch(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::optional<CompressParams>>& methods, const KvGeometry& g,
                          int threads, const PrefillOptions& o) {
  const std::size_t n_methods = methods.size();
  for (const auto& m : methods) {
    if (m && (m->eviction() || m->tiered())) {
      throw UsageError("--prefill-mode batch runs the prompt through caches without an end-of-prompt decision "
                       "(quantizers, ggml, full); this method evicts or tiers",
                       {"", "--methods", describe(*m)});
    }
    if (m && m->ggml() && m->ggml()->fp8() && m->ggml()->scale != "one") {
      throw UsageError("--prefill-mode batch has no prompt to set fp8 scales from (its first token would); use scale=one",
                       {"", "--methods", describe(*m)});
    }
  }
  PromptLanes out;
  out.caches.resize(prompts.size() * n_methods);
  out.last_logits.resize(out.caches.size());
  std::vector<DecodeLane> lanes(out.caches.size());
  for (std::size_t lane = 0; lane < lanes.size(); ++lane) {
    const std::vector<std::int32_t>& p = prompts[lane / n_methods];
    out.caches[lane] = make_kv_policy(methods[lane % n_methods], g, 1);
    lanes[lane] = {out.caches[lane].get(), 0, p.size(), p.data(), nullptr};
  }
  const std::size_t block = resolve_token_block(o.block, lanes.size(), model.config().vocab_size);
  run_known(model, lanes, block, out.last_logits, threads, o.attention);
  for (const auto& cache : out.caches) out.peak_bytes.push_back(cache->bytes());
  return out;
}

// Why chunked:N cannot run method m, or "" when it can (chunked:N:replan: UsageError from
// check_cut when the whole cache cannot be cut back with the method's score and allocator).
std::string chunked_refusal(const CompressParams& m, PrefillMode mode) {
  const std::size_t chunk = mode.chunk;
  if (m.tiered()) return "tiered caches simulate their tiers over a whole prompt";
  const EvictionParams* e = m.eviction();
  if (!e) return "";
  switch (e->score.method) {
    case ScoreMethod::h2o:
    case ScoreMethod::streamingllm: return "streaming eviction (h2o, streamingllm) keeps one budget from the end of the prompt on";
    case ScoreMethod::kvzip: return "kvzip reconstructs the whole context";
    case ScoreMethod::kvzap: return "kvzap scores with the exact prefill's attention inputs";
    default: break;
  }
  if (e->critical) return "CriticalKV (critical=on) selects from a whole prompt";
  if (e->alloc == AllocMethod::joint || e->alloc == AllocMethod::file || e->alloc == AllocMethod::duo) {
    return "joint plans, budgets files and duo's head split describe one whole prompt";
  }
  if (e->threshold) {  // each chunk keeps what passes, its last window and (the first) the sinks
    if (mode.replan) return "re-planning cuts to budget x the tokens so far: not with threshold=";
    if (e->decoding) return "decoding=on decides each window row as tokens follow it, across chunks: not with chunks";
    return "";
  }
  if (!e->budget_fraction) return "a token budget describes one whole prompt: give --budget as a fraction";
  if (mode.replan) {
    check_cut(*e, "--prefill-mode " + prefill_mode_name(mode));
    if (m.quantized() || m.rotate != RotationKind::none) return "re-planning cuts f16 rows: it takes no quant= or rotate=";
  }
  const auto b = static_cast<std::size_t>(std::llround(*e->budget_fraction * static_cast<double>(chunk)));
  const std::size_t forced = forced_tokens(chunk, e->sinks, e->score.window);
  if (b <= forced && b < chunk) {
    return "a chunk keeps round(budget x " + std::to_string(chunk) + ") = " + std::to_string(b) +
           " tokens per head, not above its always-kept window " + std::to_string(e->score.window) + " + sinks " +
           std::to_string(e->sinks) + ": use longer chunks or a larger budget";
  }
  return "";
}

// Chunked mode: each lane's prompt through the lane engine N tokens at a time, the method's cache
// wrapped in a ChunkCache that holds the chunk's rows beside it until the chunk has run.
PromptLanes prefill_chunked(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                            const std::vector<std::optional<CompressParams>>& methods, const KvGeometry& g,
                            int threads, const PrefillOptions& o) {
  const std::size_t n_methods = methods.size(), N = o.mode.chunk;
  for (const auto& m : methods) {
    const std::string why = m ? chunked_refusal(*m, o.mode) : "";
    if (!why.empty()) {
      throw UsageError("--prefill-mode " + prefill_mode_name(o.mode) + " cannot run this method: " + why,
                       {"", "--methods", describe(*m)});
    }
  }
  PromptLanes out;
  const std::size_t n_lanes = prompts.size() * n_methods;
  out.caches.resize(n_lanes);
  out.last_logits.resize(n_lanes);
  out.peak_bytes.assign(n_lanes, 0);
  std::vector<std::unique_ptr<ChunkCache>> chunks(n_lanes);
  std::size_t longest = 0;
  for (std::size_t lane = 0; lane < n_lanes; ++lane) {
    chunks[lane] = std::make_unique<ChunkCache>(make_kv_policy(methods[lane % n_methods], g, 1), g.kv_shape(),
                                                o.mode.replan ? ChunkPlan::whole : ChunkPlan::alone);
    longest = std::max(longest, prompts[lane / n_methods].size());
  }
  const std::size_t block = resolve_token_block(o.block, n_lanes, model.config().vocab_size);
  for (std::size_t c0 = 0; c0 < longest; c0 += N) {
    std::vector<DecodeLane> lanes(n_lanes);
    for (std::size_t lane = 0; lane < n_lanes; ++lane) {
      const std::vector<std::int32_t>& p = prompts[lane / n_methods];
      const std::size_t steps = c0 < p.size() ? std::min(N, p.size() - c0) : 0;
      lanes[lane] = {chunks[lane].get(), c0, steps, p.data() + std::min(c0, p.size()), nullptr};
    }
    run_known(model, lanes, block, out.last_logits, threads, o.attention);
    parallel_for(n_lanes, threads, [&](std::size_t lane) {
      ChunkCache& c = *chunks[lane];
      out.peak_bytes[lane] = std::max(out.peak_bytes[lane], c.bytes());
      c.end_chunk();
    });
  }
  for (std::size_t lane = 0; lane < n_lanes; ++lane) {
    out.caches[lane] = chunks[lane]->release();
    out.peak_bytes[lane] = std::max(out.peak_bytes[lane], out.caches[lane]->bytes());
  }
  return out;
}

}  // namespace

KvGeometry run_geometry(const ModelConfig& c, std::size_t max_positions,
                        const std::vector<std::optional<CompressParams>>& methods) {
  KvGeometry g{c.kv_shape(), max_positions, c.dim};
  if (!c.windowed_run(max_positions)) {
    g.layer_window.clear();  // within every window: full attention, methods over every layer
    return g;
  }
  if (!c.all_local()) return g;
  for (const auto& m : methods) {
    if (m && (m->quantized() || m->rotate != RotationKind::none || !std::holds_alternative<QuantizeOnly>(m->mode) ||
              !m->head_bits.empty())) {
      throw UsageError("past the sliding window of every layer (" + std::to_string(c.smallest_window()) +
                           " tokens) only none and f32 run: the cache is the window's rows (run at most that many positions "
                           "to compare methods)",
                       {"", "--methods", describe(*m)});
    }
  }
  return g;
}

PromptLanes prefill_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::optional<CompressParams>>& methods, std::size_t max_positions,
                          int threads, const PrefillOptions& options) {
  const ModelConfig& c = model.config();
  const KvGeometry g = run_geometry(c, max_positions, methods);
  if (options.mode == PrefillMode::batch) return prefill_batch(model, prompts, methods, g, threads, options);
  if (options.mode.kind == PrefillMode::chunked) return prefill_chunked(model, prompts, methods, g, threads, options);
  const std::size_t n = prompts.size(), n_methods = methods.size();
  PromptLanes out;
  out.caches.resize(n * n_methods);
  out.last_logits.resize(n * n_methods);
  out.peak_bytes.resize(n * n_methods);
  // Prefill of prompt i on `inner` threads, then its caches on `ingest` threads.
  // kvzip methods: the reconstruction pass scores each prompt once per distinct (sinks, KVzip+)
  // (the sinks are part of its softmax).
  using ZipKey = std::pair<std::size_t, bool>;
  std::vector<std::optional<ZipKey>> kvzip_key(n_methods);  // per method
  std::vector<ZipKey> keys_used;
  for (std::size_t m = 0; m < n_methods; ++m) {
    const auto& p = methods[m];
    if (!p || !p->eviction() || p->eviction()->score.method != ScoreMethod::kvzip) continue;
    kvzip_key[m] = ZipKey{p->eviction()->sinks, p->eviction()->score.plus};
    if (std::find(keys_used.begin(), keys_used.end(), *kvzip_key[m]) == keys_used.end()) keys_used.push_back(*kvzip_key[m]);
  }
  if (!keys_used.empty() && !options.kvzip) {
    throw UsageError("kvzip writes its repeat prompt with the model's tokenizer: use text (--text, or a passkey "
                     "or ruler task in text mode)", {"", "--methods", "kvzip"});
  }
  // kvzap methods: each distinct surrogate, applied to the prefill's attention inputs.
  const KvzapPrefill zaps(methods, c);
  auto one = [&](std::size_t i, int inner, int ingest) {
    // The prompt's last queries are kept as far as some method's cache reads them.
    std::size_t query_rows = 0;
    for (const auto& p : methods) query_rows = std::max(query_rows, prompt_query_rows(p, prompts[i].size()));
    std::vector<TokenScores> zap = zaps.fresh();
    // The caches that take the prompt a layer at a time are fed as the prefill finishes each
    // layer; the prefill keeps its layers only for the others.
    parallel_for(n_methods, ingest, [&](std::size_t m) { out.caches[i * n_methods + m] = make_kv_policy(methods[m], g, 1); });
    bool keep = false;
    for (std::size_t m = 0; m < n_methods; ++m) keep = keep || !out.caches[i * n_methods + m]->takes_prompt_layers();
    // kvzap's scores of layer l are complete once its attention inputs were seen (on_input comes first).
    const LayerKvFn on_layer = [&](std::size_t l, const Tensor3& q, const Tensor3& k, const Tensor3& kp, const Tensor3& v) {
      parallel_for(n_methods, ingest, [&](std::size_t m) {
        KvPolicy& cache = *out.caches[i * n_methods + m];
        if (cache.takes_prompt_layers()) cache.ingest_prompt_layer(l, {&k, &kp, &v, &q, zaps.layer_of(m, zap, l)});
      });
      return keep;
    };
    const PrefillResult pre = model.prefill(prompts[i], false, inner, query_rows, zaps.input_fn(zap), on_layer);
    std::vector<TokenScores> zip;  // [index in keys_used]
    for (const auto& [sinks, plus] : keys_used) {
      zip.push_back(kvzip_scores(model, prompts[i], *options.kvzip, sinks, inner, kKvzipChunk, plus));
    }
    parallel_for(n_methods, ingest, [&](std::size_t m) {
      auto& cache = out.caches[i * n_methods + m];
      if (cache->takes_prompt_layers()) return;
      const TokenScores* scores = nullptr;
      if (kvzip_key[m]) {
        scores = &zip[static_cast<std::size_t>(std::find(keys_used.begin(), keys_used.end(), *kvzip_key[m]) -
                                               keys_used.begin())];
      }
      if (const TokenScores* z = zaps.of(m, zap)) scores = z;
      cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompts[i].size(), scores,
                            [&model](std::size_t l, RowMatrix& wo) { wo = model.weights().layers[l].wo.to_f32(); }});
    });
    const auto last = pre.logits.row(pre.logits.rows() - 1);
    const std::uint64_t f32 = 4ull * 2 * prompts[i].size() * c.n_layers * c.n_kv_heads * c.head_dim;
    for (std::size_t m = 0; m < n_methods; ++m) {
      out.last_logits[i * n_methods + m].assign(last.data(), last.data() + last.size());
      out.peak_bytes[i * n_methods + m] = std::max(f32, out.caches[i * n_methods + m]->bytes());
    }
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

Continuations continue_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::size_t>& n, const std::vector<std::optional<CompressParams>>& methods,
                             int threads, AttentionMode attention, const std::vector<std::vector<std::int32_t>>* forced,
                             const std::vector<std::vector<std::int32_t>>* question, PrefillMode prefill,
                             const KvzipPrompts* kvzip) {
  std::vector<LaneGoal> goals(prompts.size() * methods.size());
  for (std::size_t lane = 0; lane < goals.size(); ++lane) {
    const std::size_t p = lane / methods.size();
    goals[lane] = {n[p], forced ? &(*forced)[p] : nullptr};
  }
  return continue_lanes(model, prompts, methods, goals, threads, attention, question, prefill, kvzip);
}

Continuations continue_lanes(const Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::optional<CompressParams>>& methods, const std::vector<LaneGoal>& goals,
                             int threads, AttentionMode attention, const std::vector<std::vector<std::int32_t>>* question,
                             PrefillMode prefill, const KvzipPrompts* kvzip) {
  const ModelConfig& c = model.config();
  const std::size_t n_methods = methods.size();
  if (goals.size() != prompts.size() * n_methods) throw std::logic_error("continue_lanes: a goal per lane");
  const auto asked = [&](std::size_t p) { return question ? (*question)[p].size() : std::size_t{0}; };
  std::size_t longest = 0;
  for (std::size_t lane = 0; lane < goals.size(); ++lane) {
    const std::size_t p = lane / n_methods;
    longest = std::max(longest, prompts[p].size() + asked(p) + goals[lane].n);
  }
  PromptLanes start = prefill_lanes(model, prompts, methods, longest, threads, {prefill, attention, 0, kvzip});
  std::vector<std::unique_ptr<KvPolicy>>& caches = start.caches;
  // The logits before step 0 of each lane: after its prompt, or after its question decoded
  // through the lane's cache (known tokens, several a call).
  std::vector<const float*> first(caches.size());
  for (std::size_t lane = 0; lane < caches.size(); ++lane) first[lane] = start.last_logits[lane].data();
  std::vector<std::vector<float>> after_question(question ? caches.size() : 0);
  if (question) {
    std::vector<DecodeLane> lanes(caches.size());
    for (std::size_t lane = 0; lane < caches.size(); ++lane) {
      const std::size_t p = lane / n_methods;
      lanes[lane] = {caches[lane].get(), prompts[p].size(), asked(p), (*question)[p].data(), nullptr};
    }
    run_known(model, lanes, kTokenBlockMax, after_question, threads, attention);
    for (std::size_t lane = 0; lane < caches.size(); ++lane) {
      if (lanes[lane].steps > 0) first[lane] = after_question[lane].data();
    }
  }
  Continuations out;
  out.tokens.resize(caches.size());
  out.logprob.assign(caches.size(), 0.0);
  out.peak_bytes = start.peak_bytes;
  const auto sample_peak = [&](std::size_t lane) {
    out.peak_bytes[lane] = std::max(out.peak_bytes[lane], caches[lane]->peak_bytes());
  };
  for (std::size_t lane = 0; lane < caches.size(); ++lane) sample_peak(lane);  // after the question
  // Step k of a lane from its logits: the argmax, and when forced the log-probability of forced[k].
  const auto take = [&](std::size_t lane, const float* logits) {
    auto& t = out.tokens[lane];
    if (const auto* f = goals[lane].forced) {
      const std::int32_t want = (*f)[t.size()];
      out.logprob[lane] += static_cast<double>(logits[want]) - log_sum_exp(logits, c.vocab_size);
    }
    t.push_back(argmax_token(logits, c.vocab_size));
  };
  for (std::size_t lane = 0; lane < caches.size(); ++lane) take(lane, first[lane]);
  // Step k (k >= 1) of lane (p, m) feeds forced[k - 1], or its step k - 1 argmax, at position
  // |prompt p| + |question p| + k - 1.
  std::vector<DecodeLane> lanes(caches.size());
  for (std::size_t lane = 0; lane < caches.size(); ++lane) {
    const std::size_t p = lane / n_methods;
    const LaneGoal& g = goals[lane];
    if (g.forced && g.forced->size() < g.n) throw std::logic_error("continue_lanes: fewer forced tokens than steps");
    lanes[lane] = {caches[lane].get(), prompts[p].size() + asked(p), std::max<std::size_t>(g.n, 1) - 1,
                   g.forced ? g.forced->data() : nullptr, nullptr};
  }
  run_lanes(
      model, lanes, 1, [&](std::size_t lane, std::size_t) { return out.tokens[lane].back(); },
      [&](const std::vector<LaneRows>& rows, const RowMatrix& logits) {
        for (const LaneRows& r : rows) {
          take(r.lane, logits.row(static_cast<Eigen::Index>(r.row)).data());
          sample_peak(r.lane);
        }
      },
      threads, attention);
  for (std::size_t lane = 0; lane < caches.size(); ++lane) out.bytes.push_back(caches[lane]->bytes());
  return out;
}

}  // namespace akv
