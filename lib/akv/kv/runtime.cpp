#include "akv/kv/runtime.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>

#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/kv/decode_compression.h"
#include "akv/kv/ggml_cache.h"
#include "akv/kv/prompt_plan.h"
#include "akv/kv/tensor_builder.h"
#include "akv/kv/tiered.h"
#include "akv/kv/windowed.h"
#include "akv/score/kv_scores.h"
#include "akv/score/kvzap.h"
#include "akv/score/qfilter.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

// Streaming eviction keeps rows in no particular order (evicted rows are replaced by the last
// row): position[i] is row i's token position, and `recent` the positions of the last `window`
// rows appended (prompt rows kept, then decoded ones), which are exactly the window's newest
// rows: those are never evicted.
struct HeadState {
  TensorBuilder key, value;
  std::vector<std::int32_t> position;
  std::vector<double> score;          // streaming eviction: accumulated attention (h2o)
  std::size_t budget = 0;             // streaming eviction: rows to keep
  std::deque<std::int32_t> recent;    // streaming eviction: last `window` positions appended
  // Threshold eviction while decoding: the positions and scores of the rows not decided yet (the
  // newest `window`, and the step's own), oldest first.
  std::deque<std::pair<std::int32_t, double>> pending;
};

class RuntimePolicy : public KvPolicy {
 public:
  // stored_only: akv compress's cache (make_stored_cache).
  RuntimePolicy(std::optional<CompressParams> params, const KvGeometry& g, int threads, bool stored_only = false)
      : params_(std::move(params)), g_(g), threads_(threads), stored_only_(stored_only),
        // Only pre-RoPE keys rotate here, up to the longest sequence the caller will feed.
        table_(g.head_dim, g.rope_theta, 0,
               params_ && params_->pre_rope && !stored_only ? std::max<std::size_t>(g.max_positions, 1) : 1),
        rope_{g.rope_layout, &table_} {
    if (params_) read_calibration_inputs(*params_, g.prompt_window());
    const CompressParams* p = params_ ? &*params_ : nullptr;
    if (p && p->pre_rope && !g.rope_variant.empty()) {
      throw InvalidInput("pre-rope re-applies plain RoPE after dequantization; this model's RoPE differs",
                         {"", "rope_variant", g.rope_variant});
    }
    if (p && p->eviction() && !stored_only) {
      const ScoreMethod s = p->eviction()->score.method;
      streaming_ = s == ScoreMethod::h2o || s == ScoreMethod::streamingllm;
      if (streaming_ && p->quantized()) {
        throw UsageError("streaming eviction (h2o, streamingllm) does not combine with --quant in the "
                         "model; use a one-shot method (snapkv, adakv...)", {"", "--quant", quantizer_name(p->method)});
      }
      if (p->eviction()->alloc == AllocMethod::file) {
        throw UsageError("--budgets files describe a dump, not a model run; use --budget", {"", "--budgets"});
      }
      if (p->eviction()->every > 0) {
        check_decode_compression(*p->eviction());
        if (streaming_) {
          throw UsageError("h2o and streamingllm evict while decoding already; every= is for one-shot methods",
                           {"", "--every", std::to_string(p->eviction()->every)});
        }
        every_ = p->eviction()->every;
        recent_query_.resize(g.n_layers);
      }
      if (p->eviction()->score.method == ScoreMethod::qfilter) {
        qfilters_ = read_calibration_qfilters(p->eviction()->score.qfilters, g.prompt_window());
      }
      if (p->eviction()->decoding) {
        check_threshold_decoding(*p->eviction(), p->quantized() || p->rotate != RotationKind::none);
        decoding_ = true;
        if (p->eviction()->score.method == ScoreMethod::kvzap) {
          if (g.input_dim == 0) {
            throw UsageError("kvzap with decoding=on scores each decoded token's attention input: akv evaluate --model",
                             {"", "--decoding", "on"});
          }
          zap_ = read_calibration_kvzap(p->eviction()->score.surrogate, g, g.input_dim);
        }
      }
    }
    // Per-head parameters (calibrated bits).
    per_head_.reserve(g.n_layers * g.n_kv_heads);
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) {
      if (p) per_head_.push_back(p->for_head(i / g.n_kv_heads, i % g.n_kv_heads, g.n_kv_heads));
      heads_.push_back(HeadState{builder(i, true), builder(i, false), {}, {}, 0, {}, {}});
    }
  }

  void ingest_prompt(const PromptKv& prompt) override {
    const std::size_t n = prompt.n_tokens;
    std::optional<PromptPlan> plan;
    if (params_ && params_->eviction()) {
      // The last rows the plan reads (prompt_query_rows) of those given.
      const std::size_t given = prompt.query[0].dim1(), nq = std::min(given, prompt_query_rows(params_, n));
      const KvWindow m = g_.prompt_window(n, nq);
      plan = plan_prompt(
          m,
          [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3* v) {
            const Tensor3& all = prompt.query[l];
            q = nq == given ? all : all.rows(given - nq, nq);
            k = prompt.key[l];
            if (v) *v = prompt.value[l];
          },
          *params_, threads_, {}, prompt.scores, prompt.out_proj);
    }
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      store_layer(l, {&prompt.key[l], &prompt.key_pre_rope[l], &prompt.value[l]}, plan ? &*plan : nullptr);
    }
  }

  bool wants_queries() const override { return params_ && params_->eviction(); }

  // Decode-time compression keeps each layer's last max(window, 1) queries (a ring).
  void take_query(std::size_t layer, std::size_t, const float* query) override {
    if (every_ == 0) return;
    QueryRing& r = recent_query_[layer];
    const std::size_t nq = g_.n_heads * g_.head_dim, cap = std::max<std::size_t>(params_->eviction()->score.window, 1);
    r.rows.resize(cap * nq);
    std::copy_n(query, nq, r.rows.begin() + static_cast<std::ptrdiff_t>(r.next * nq));
    r.next = (r.next + 1) % cap;
    r.count = std::min(r.count + 1, cap);
  }

  // Quantizers store the chunk's rows as decoded rows. One-shot eviction, ChunkPlan::alone: plans
  // the chunk alone (its last W queries, round(budget x chunk tokens) per head or what passes a
  // threshold, sinks in the first chunk only) and appends what each head keeps; ChunkPlan::whole
  // (a budget fraction only): appends every row of the chunk, then cuts each layer's heads back to
  // round(budget x tokens so far) per head (decode_cut over the chunk's last W queries: forced the
  // sink positions and the newest W rows).
  void ingest_chunk(const PromptKv& chunk, std::size_t start, ChunkPlan how) override {
    if (!params_ || !params_->eviction()) {
      KvPolicy::ingest_chunk(chunk, start, how);
      return;
    }
    if (streaming_ || params_->eviction()->alloc == AllocMethod::joint) {
      throw std::logic_error("ingest_chunk: streaming and joint eviction do not plan chunks");
    }
    CompressParams p = *params_;
    EvictionParams& e = std::get<EvictionParams>(p.mode);
    if (!e.budget_fraction && !e.threshold) throw std::logic_error("ingest_chunk: chunks take a budget fraction or a threshold");
    if (e.decoding) throw std::logic_error("ingest_chunk: threshold eviction while decoding takes the prompt whole");
    const std::size_t n = chunk.n_tokens;
    if (how == ChunkPlan::whole) {
      if (!e.budget_fraction) throw std::logic_error("ingest_chunk: re-planning cuts to a budget fraction");
      for (std::size_t l = 0; l < g_.n_layers; ++l) {
        store_layer(l, {&chunk.key[l], &chunk.key_pre_rope[l], &chunk.value[l]}, nullptr, start);
      }
      e.target = static_cast<std::size_t>(std::llround(*e.budget_fraction * static_cast<double>(start + n)));
      const std::size_t nq = std::min(n, std::max<std::size_t>(e.score.window, 1)), d = g_.head_dim;
      std::vector<float> q(nq * g_.n_heads * d);  // [nq][n_heads * hd], oldest first
      for (std::size_t l = 0; l < g_.n_layers; ++l) {
        const Tensor3& cq = chunk.query[l];
        for (std::size_t i = 0; i < nq; ++i) {
          for (std::size_t h = 0; h < g_.n_heads; ++h) std::copy_n(cq.row(h, n - nq + i), d, q.data() + (i * g_.n_heads + h) * d);
        }
        cut_layer(l, q.data(), nq, e);
      }
      return;
    }
    if (start > 0) e.sinks = 0;  // the sinks are in the first chunk
    const std::size_t forced = forced_tokens(n, e.sinks, e.score.window);
    PromptPlan plan;
    if (e.budget_fraction && static_cast<std::size_t>(std::llround(*e.budget_fraction * static_cast<double>(n))) <= forced) {
      // A chunk too short for its budget to pass the always-kept tokens keeps those.
      plan.params = p;
      plan.eviction.emplace();
      plan.eviction->heads.assign(g_.n_layers, std::vector<HeadPlan>(g_.n_kv_heads));
      for (auto& layer : plan.eviction->heads) {
        for (HeadPlan& hp : layer) {
          for (std::size_t t = 0; t < n; ++t) {
            if (t < e.sinks || t + e.score.window >= n) hp.kept.push_back(static_cast<std::int32_t>(t));
          }
          hp.tokens = hp.kept.size();
        }
      }
    } else {
      plan = plan_prompt(
          g_.prompt_window(n, n),
          [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3* v) {
            q = chunk.query[l];
            k = chunk.key[l];
            if (v) *v = chunk.value[l];
          },
          p, threads_, {}, chunk.scores);
    }
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      store_layer(l, {&chunk.key[l], &chunk.key_pre_rope[l], &chunk.value[l]}, &plan, start);
    }
  }

  void ingest_layer(std::size_t layer, const LayerKv& kv, const PromptPlan& plan) override {
    store_layer(layer, kv, &plan);
  }

  // Quantizers; one-shot and streaming eviction whose allocator splits each layer's budget on its
  // own (or a threshold), when its scores come with the layer: its own tensors, or kvzap's from the
  // layer's attention inputs (LayerKv::scores); not kvzip's (a second prefill) or CriticalKV's W_o.
  // Allocators over every layer (adakv-global, duo: kvzap's default) too when the kept rows stay
  // f16 (no quant=, rotate=, pre-rope) and nothing streams (h2o's and streamingllm's rows carry
  // the plan's state): each layer's rows are stored whole as they come and cut to the plan after
  // the last layer (TensorBuilder::retain keeps the same f16 rows).
  bool takes_prompt_layers() const override {
    if (!params_ || !params_->eviction()) return true;
    const EvictionParams& e = *params_->eviction();
    if (e.critical || e.score.method == ScoreMethod::kvzip || e.alloc == AllocMethod::joint) return false;
    if (plans_each_layer(e)) return true;
    return !streaming_ && !params_->quantized() && params_->rotate == RotationKind::none && !params_->pre_rope;
  }

  // An evicting cache plans each layer as it comes (EvictionPlanner: the plan ingest_prompt makes)
  // from the layer's last prompt_query_rows queries, then stores what it keeps.
  void ingest_prompt_layer(std::size_t layer, const LayerKv& kv) override {
    if (!takes_prompt_layers()) throw std::logic_error("this cache plans the whole prompt");
    if (!params_ || !params_->eviction()) {
      store_layer(layer, kv, nullptr);
      return;
    }
    const std::size_t n = kv.key->dim1(), nq = prompt_query_rows(params_, n);
    if (!kv.query || kv.query->dim1() < nq) throw std::logic_error("ingest_prompt_layer: the plan's queries");
    Tensor3 last;  // the rows the plan reads, when more are given
    const Tensor3* q = kv.query;
    if (q->dim1() > nq) {
      last = q->rows(q->dim1() - nq, nq);
      q = &last;
    }
    // A given score's layer goes where the planner reads it (its given scores' layer `layer`).
    if (kv.scores) {
      layer_scores_.resize(g_.n_layers);
      layer_scores_[layer] = *kv.scores;
    }
    if (layer == 0) {
      planner_.emplace(g_.prompt_window(n, nq), *params_->eviction(), kv.scores ? &layer_scores_ : nullptr);
      layer_plan_.params = *params_;
      layer_plan_.eviction.emplace();
      layer_plan_.eviction->heads.assign(g_.n_layers, {});
    }
    planner_->add_layer(layer, *q, *kv.key, planner_->reads_values() ? kv.value : nullptr, nullptr, threads_);
    if (kv.scores) layer_scores_[layer] = {};
    if (!planner_->layer_local()) {  // every row now; the plan after the last layer
      store_layer(layer, kv, nullptr);
      if (layer + 1 == g_.n_layers) cut_to_plan(planner_->finish(threads_));
    } else {
      layer_plan_.eviction->heads[layer] = planner_->take_layer(layer);
      store_layer(layer, kv, &layer_plan_);
      layer_plan_.eviction->heads[layer] = {};
    }
    if (layer + 1 == g_.n_layers) planner_.reset();
  }

  HeadCache take_head(std::size_t layer, std::size_t head) override {
    HeadState& s = heads_[layer * g_.n_kv_heads + head];
    HeadCache h;
    h.n_tokens = n_tokens_;
    h.head_dim = g_.head_dim;
    if (s.position.size() != n_tokens_) h.kept = std::move(s.position);
    h.key = s.key.take();
    h.value = s.value.take();
    s = HeadState{TensorBuilder(g_.head_dim, DenseType::f32), TensorBuilder(g_.head_dim, DenseType::f32), {}, {}, 0, {}, {}};
    return h;
  }

  bool wants_inputs() const override { return decoding_ && !zap_.empty(); }

  // kvzap while decoding: the token's score in each KV head from its attention input.
  void take_input(std::size_t layer, std::size_t pos, const float* input, std::size_t dim) override {
    if (!wants_inputs()) return;
    RowMatrix x(1, static_cast<Eigen::Index>(dim));
    std::copy_n(input, dim, x.data());
    std::vector<std::vector<double>> scores;
    kvzap_layer_scores(zap_[layer], x, scores);
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      heads_[layer * g_.n_kv_heads + h].pending.emplace_back(static_cast<std::int32_t>(pos), scores[h][0]);
    }
  }

  void append(std::size_t layer, const float* key, const float* key_pre, const float* value,
              std::size_t pos) override {
    const std::size_t d = g_.head_dim;
    const auto p = static_cast<std::int32_t>(pos);
    const bool pre = params_ && params_->pre_rope;
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      HeadState& s = heads_[layer * g_.n_kv_heads + h];
      s.key.append(pre ? key_pre + h * d : key + h * d, key + h * d, &p, 1);
      s.value.append(value + h * d, value + h * d, &p, 1);
      s.position.push_back(p);
      if (decoding_ && zap_.empty()) s.pending.emplace_back(p, key_score(layer, h, key + h * d));
      if (streaming_) {
        s.score.push_back(0.0);
        s.recent.push_back(p);
        if (s.recent.size() > params_->eviction()->score.window) s.recent.pop_front();
      }
    }
  }

  KvView view(std::size_t layer, std::size_t kv_head) const override {
    const HeadState& s = heads_[layer * g_.n_kv_heads + kv_head];
    KvView v;
    v.segments[0] = {s.key.view(), s.value.view()};
    v.position = s.position.data();
    v.n = s.position.size();
    return v;
  }

  bool wants_probs() const override { return streaming_; }

  void observe(std::size_t layer, std::size_t kv_head, const float* probs) override {
    if (!streaming_) return;
    HeadState& s = heads_[layer * g_.n_kv_heads + kv_head];
    // Mean over the KV group's query heads, like the prompt's scores (gqa_reduce mean).
    const double w = static_cast<double>(g_.n_kv_heads) / static_cast<double>(g_.n_heads);
    for (std::size_t i = 0; i < s.score.size(); ++i) s.score[i] += w * probs[i];
  }

  void end_step() override {
    if (every_ > 0 || streaming_ || decoding_) peak_ = std::max(peak_, bytes());  // before this step evicts
    if (every_ > 0 && ++decoded_ % every_ == 0) cut();
    if (decoding_) evict_below_threshold();
    if (!streaming_) return;
    const EvictionParams& e = *params_->eviction();
    const bool oldest = e.score.method == ScoreMethod::streamingllm;
    for (HeadState& s : heads_) {
      while (s.position.size() > s.budget) {
        // Forced: the first `sinks` positions and the newest `window` rows (positions from the
        // oldest of `recent` on; all rows while fewer than `window` were ever appended).
        const std::size_t n = s.position.size();
        const std::int64_t newest = e.score.window == 0 ? std::numeric_limits<std::int64_t>::max()
                                    : s.recent.size() < e.score.window ? std::numeric_limits<std::int64_t>::min()
                                                                       : s.recent.front();
        const std::size_t victim = streaming_victim(s.position.data(), s.score.data(), n, e.sinks, newest, oldest);
        if (victim == n) break;
        s.key.swap_remove(victim);
        s.value.swap_remove(victim);
        s.position[victim] = s.position.back();
        s.position.pop_back();
        s.score[victim] = s.score.back();
        s.score.pop_back();
      }
    }
  }

  std::uint64_t bytes() const override {
    std::uint64_t b = 0;
    for (std::size_t l = 0; l < g_.n_layers; ++l) b += layer_bytes(l);
    return b;
  }

  bool layer_local() const override { return !streaming_ && every_ == 0 && !decoding_; }

  std::uint64_t peak_bytes() const override { return std::max(peak_, bytes()); }

  std::uint64_t layer_bytes(std::size_t layer) const override {
    std::uint64_t b = 0;
    const bool evicting = params_ && params_->eviction();
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      const HeadState& s = heads_[layer * g_.n_kv_heads + h];
      b += s.key.bytes() + s.value.bytes() + (evicting ? 4ull * s.position.size() : 0);
    }
    return b;
  }

 private:
  // Stores one layer of a prompt (or of a chunk of it at positions start..): with a plan, each
  // head's kept positions under its per-head parameters (and its streaming-eviction state);
  // without one, every row. The first chunk (start 0) starts each head afresh; a later one
  // appends to it.
  void store_layer(std::size_t l, const LayerKv& kv, const PromptPlan* plan, std::size_t start = 0) {
    const std::size_t n = kv.key->dim1(), d = g_.head_dim;
    const bool pre = params_ && params_->pre_rope;
    n_tokens_ = start + n;
    parallel_for(g_.n_kv_heads, threads_, [&](std::size_t h) {
      const std::size_t i = l * g_.n_kv_heads + h;
      HeadState& s = heads_[i];
      if (start == 0) {
        if (plan && params_) per_head_[i] = plan->head(l, h, g_.n_kv_heads);
        s.key = builder(i, true);
        s.value = builder(i, false);
        s.position.clear();
      }
      std::vector<std::int32_t> keep = plan ? plan->kept(l, h) : std::vector<std::int32_t>{};
      if (plan && plan->eviction) {
        const HeadPlan& hp = plan->eviction->heads[l][h];
        s.budget = hp.tokens;
        if (streaming_ && params_->eviction()->score.method == ScoreMethod::h2o) {
          s.score = hp.kept_score;  // accumulated attention of every prompt query (the plan's H2O scores)
        } else if (streaming_) {
          s.score.assign(hp.kept.size(), 0.0);  // StreamingLLM: unused
        }
      }
      if (keep.empty()) {
        keep.resize(n);
        std::iota(keep.begin(), keep.end(), 0);
      }
      const std::size_t m = keep.size();
      const float* k = kv.key->row(h, 0);
      const float* kp = pre ? kv.key_pre_rope->row(h, 0) : nullptr;
      const float* v = kv.value->row(h, 0);
      std::vector<float> rows;  // the kept rows gathered, when some are evicted
      if (m < n) {
        rows.resize((pre ? 3 : 2) * m * d);
        float* out = rows.data();
        for (const Tensor3* t : {kv.key, kv.value, pre ? kv.key_pre_rope : nullptr}) {
          for (std::size_t r = 0; t && r < m; ++r, out += d) std::copy_n(t->row(h, static_cast<std::size_t>(keep[r])), d, out);
        }
        k = rows.data();
        v = k + m * d;
        kp = pre ? v + m * d : nullptr;
      }
      if (decoding_ && plan && plan->eviction) {  // the window's rows wait, with their prompt scores
        const HeadPlan& hp = plan->eviction->heads[l][h];
        s.pending.clear();
        for (std::size_t r = 0; r < hp.kept.size(); ++r) {
          if (static_cast<std::size_t>(hp.kept[r]) + params_->eviction()->score.window >= n) {
            s.pending.emplace_back(hp.kept[r], hp.kept_score[r]);
          }
        }
      }
      for (std::int32_t& t : keep) t += static_cast<std::int32_t>(start);
      s.key.append(pre ? kp : k, k, keep.data(), m);
      s.value.append(v, v, keep.data(), m);
      s.position.insert(s.position.end(), keep.begin(), keep.end());
      if (streaming_) {
        const std::size_t w = std::min(params_->eviction()->score.window, m);
        s.recent.assign(s.position.end() - static_cast<std::ptrdiff_t>(w), s.position.end());
      }
    });
  }

  // The prompt's every row, stored in order (f16), cut to each head's kept positions.
  void cut_to_plan(const EvictionPlan& plan) {
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
        HeadState& s = heads_[l * g_.n_kv_heads + h];
        const HeadPlan& hp = plan.heads[l][h];
        s.budget = hp.tokens;
        if (hp.kept.size() == s.position.size()) continue;
        const std::vector<std::size_t> rows(hp.kept.begin(), hp.kept.end());  // row r holds position r
        s.key.retain(rows);
        s.value.retain(rows);
        s.position = hp.kept;
      }
    }
  }

  // A decoded token's score from its key after RoPE (knorm, qfilter), as the prompt's were scored.
  double key_score(std::size_t layer, std::size_t h, const float* key) const {
    Tensor3 k(1, 1, g_.head_dim);
    std::copy_n(key, g_.head_dim, k.data());
    return params_->eviction()->score.method == ScoreMethod::qfilter ? qfilter_scores(k, 0, qfilters_[layer][h])[0]
                                                                     : knorm_scores(k, 0, 1, g_.head_dim)[0];
  }

  // Threshold eviction while decoding: each head decides the rows that left its window (the
  // oldest pending beyond `window`): one below the threshold and past the sinks is evicted.
  void evict_below_threshold() {
    const EvictionParams& e = *params_->eviction();
    for (HeadState& s : heads_) {
      std::vector<std::int32_t> evicted;
      while (s.pending.size() > e.score.window) {
        const auto [pos, score] = s.pending.front();
        s.pending.pop_front();
        if (static_cast<std::size_t>(pos) >= e.sinks && score < *e.threshold) evicted.push_back(pos);
      }
      if (evicted.empty()) continue;
      std::vector<std::size_t> keep;
      std::vector<std::int32_t> position;
      keep.reserve(s.position.size());
      for (std::size_t r = 0; r < s.position.size(); ++r) {
        if (std::binary_search(evicted.begin(), evicted.end(), s.position[r])) continue;
        keep.push_back(r);
        position.push_back(s.position[r]);
      }
      s.key.retain(keep);
      s.value.retain(keep);
      s.position = std::move(position);
    }
  }

  // Decode-time compression: each layer's heads cut back to the target over its last decode queries.
  void cut() {
    const std::size_t nq = g_.n_heads * g_.head_dim;
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      const QueryRing& r = recent_query_[l];
      if (r.count == 0) continue;
      const std::size_t cap = r.rows.size() / nq;
      std::vector<float> q(r.count * nq);  // oldest first
      for (std::size_t i = 0; i < r.count; ++i) {
        const std::size_t slot = (r.next + cap - r.count + i) % cap;
        std::copy_n(r.rows.begin() + static_cast<std::ptrdiff_t>(slot * nq), nq, q.begin() + static_cast<std::ptrdiff_t>(i * nq));
      }
      cut_layer(l, q.data(), r.count, *params_->eviction());
    }
  }

  // Layer l's heads cut back to e.target rows (kv/decode_compression.h), scored over `query`
  // [n_query][n_heads * hd] (oldest first).
  void cut_layer(std::size_t l, const float* query, std::size_t n_query, const EvictionParams& e) {
    const std::size_t d = g_.head_dim;
    const bool values_read = score_reads_values(e.score);  // lagkv only
    std::vector<std::vector<float>> keys(g_.n_kv_heads), values(g_.n_kv_heads);
    std::vector<HeadRows> rows(g_.n_kv_heads);
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      const HeadState& s = heads_[l * g_.n_kv_heads + h];
      const std::size_t n = s.position.size();
      keys[h].resize(n * d);
      dequantize_rows(s.key.view(), d, 0, n, keys[h].data());
      if (values_read) {
        values[h].resize(n * d);
        dequantize_rows(s.value.view(), d, 0, n, values[h].data());
      }
      rows[h] = {keys[h].data(), values_read ? values[h].data() : nullptr, s.position.data(), n};
    }
    const auto keep = decode_cut(rows, query, n_query, g_.kv_shape(), e, qfilters_.empty() ? nullptr : &qfilters_[l]);
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      HeadState& s = heads_[l * g_.n_kv_heads + h];
      if (keep[h].size() == s.position.size()) continue;
      s.key.retain(keep[h]);
      s.value.retain(keep[h]);
      std::vector<std::int32_t> position;
      for (std::size_t r : keep[h]) position.push_back(s.position[r]);
      s.position = std::move(position);
    }
  }

  // Head i's key or value builder under its parameters (f32 rows for the exact cache).
  TensorBuilder builder(std::size_t i, bool key) const {
    if (!params_) return TensorBuilder(g_.head_dim, DenseType::f32);
    return head_tensor_builder(g_.head_dim, per_head_[i], key, stored_only_ ? nullptr : &rope_);
  }

  std::optional<CompressParams> params_;
  KvGeometry g_;
  int threads_;
  bool stored_only_ = false;
  std::size_t n_tokens_ = 0;  // of the prompt
  RopeTable table_;
  RopeContext rope_;
  bool streaming_ = false;
  bool decoding_ = false;  // threshold eviction while decoding
  KvzapModel zap_;         // ... with kvzap scores: the surrogate
  std::size_t every_ = 0, decoded_ = 0;             // decode-time compression: interval, tokens decoded
  std::uint64_t peak_ = 0;                          // the most bytes before an eviction (peak_bytes)
  struct QueryRing {
    std::vector<float> rows;  // [max(W, 1)][n_heads * hd]
    std::size_t next = 0, count = 0;
  };
  std::vector<QueryRing> recent_query_;             // [layer]: its last decode queries
  QFilters qfilters_;  // qfilter's cuts (decode-time, chunked:N:replan): [layer][kv head][head_dim]
  std::optional<EvictionPlanner> planner_;  // ingest_prompt_layer: the prompt's plan, layer by layer
  TokenScores layer_scores_;               // ... a given score's: the layer being planned (others empty)
  PromptPlan layer_plan_;                  // ... and the layer's part of it that store_layer reads
  std::vector<CompressParams> per_head_;  // [layer * n_kv_heads + head]
  std::vector<HeadState> heads_;         // [layer * n_kv_heads + head]
};

}  // namespace

std::size_t prompt_query_rows(const std::optional<CompressParams>& params, std::size_t n_tokens) {
  if (!params) return 0;
  if (params->tiered()) return std::min(n_tokens, kTieredPromptWindow);
  const EvictionParams* e = params->eviction();
  if (!e) return 0;
  if (e->score.method == ScoreMethod::h2o || e->score.method == ScoreMethod::expected_attention) return n_tokens;
  return std::min(n_tokens, std::max<std::size_t>(e->score.window, 1));
}

std::unique_ptr<KvPolicy> make_kv_policy(const std::optional<CompressParams>& params,
                                         const KvGeometry& g, int threads) {
  if (g.windowed()) {
    KvGeometry globals = g;
    globals.kv_shape() = g.global_shape();  // per-layer files are read at the model's global layers
    return std::make_unique<WindowedCache>(make_kv_policy(params, globals, threads), g.kv_shape(),
                                           params ? DenseType::f16 : DenseType::f32);
  }
  if (params && params->tiered()) return make_tiered_policy(*params, g);
  if (params && params->ggml()) return make_ggml_policy(*params, g, threads);
  return std::make_unique<RuntimePolicy>(params, g, threads);
}

std::unique_ptr<KvPolicy> make_stored_cache(const CompressParams& planned, const KvShape& shape, int threads) {
  KvGeometry g;
  g.kv_shape() = shape;
  if (planned.ggml()) return make_ggml_policy(planned, g, threads);
  return std::make_unique<RuntimePolicy>(planned, g, threads, true);
}

void KvPolicy::ingest_chunk(const PromptKv& chunk, std::size_t start, ChunkPlan) {
  if (start == 0) {
    ingest_prompt(chunk);
    return;
  }
  if (!layer_local()) throw std::logic_error("ingest_chunk after the first chunk needs a layer-local cache");
  const Tensor3& k0 = chunk.key[0];
  const std::size_t n_kv = k0.dim0(), d = k0.dim2();
  std::vector<float> k(n_kv * d), kp(n_kv * d), v(n_kv * d);
  for (std::size_t l = 0; l < chunk.key.size(); ++l) {
    for (std::size_t t = 0; t < chunk.n_tokens; ++t) {
      for (std::size_t h = 0; h < n_kv; ++h) {
        std::copy_n(chunk.key[l].row(h, t), d, k.data() + h * d);
        std::copy_n(chunk.key_pre_rope[l].row(h, t), d, kp.data() + h * d);
        std::copy_n(chunk.value[l].row(h, t), d, v.data() + h * d);
      }
      append(l, k.data(), kp.data(), v.data(), start + t);
    }
  }
}

void KvPolicy::ingest_prompt_layer(std::size_t, const LayerKv&) {
  throw std::logic_error("this cache takes the prompt whole");
}

void KvPolicy::ingest_layer(std::size_t, const LayerKv&, const PromptPlan&) {
  throw std::logic_error("this cache is not fed a layer at a time");
}

HeadCache KvPolicy::take_head(std::size_t, std::size_t) {
  throw std::logic_error("this cache is not fed a layer at a time");
}

}  // namespace akv
