#include "akv/kv/runtime.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>

#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/kv/ggml_cache.h"
#include "akv/kv/joint.h"
#include "akv/kv/stored_tensor.h"
#include "akv/kv/tiered.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

float f16_round(float x) { return f16_to_f32_ref(f32_to_f16_ref(x)); }

// One tensor (keys or values) of one head, growing row by row: packed rows, then dense rows
// (f16, or f32 for the exact cache). Pre-RoPE keys also keep the post-RoPE f32 rows attention
// reads (RoPE cannot be applied inside the fused kernel); they are not counted as stored.
class StreamTensor {
 public:
  StreamTensor(std::size_t d, bool exact, const CompressParams* p, const TensorQuant* t,
               std::size_t n_outlier, bool pre_rope, const RopeContext* rope)
      : d_(d), p_(p), t_(t), n_out_(n_outlier), pre_rope_(pre_rope), rope_(rope),
        store_(d, exact ? DenseType::f32 : DenseType::f16) {}

  // Appends rows: `src` is what gets quantized (pre-RoPE keys with pre_rope), `post` what
  // attention reads before quantization; positions for RoPE after dequantization.
  void append(const float* src, const float* post, const std::int32_t* pos, std::size_t n) {
    store_.append_dense(post, n);
    if (pre_rope_) {
      for (std::size_t i = 0; i < n * d_; ++i) mirror_.push_back(f16_round(post[i]));
    }
    if (p_ && p_->quantized()) {
      pending_.insert(pending_.end(), src, src + n * d_);
      positions_.insert(positions_.end(), pos, pos + n);
      quantize_ready();
    }
  }
  // Removes row i, moving the last row into its place (streaming eviction; only without
  // quantization): O(head_dim) per eviction instead of moving every later row.
  void swap_remove(std::size_t i) {
    store_.swap_remove_dense(i);
    if (pre_rope_) {
      std::copy(mirror_.end() - static_cast<std::ptrdiff_t>(d_), mirror_.end(),
                mirror_.begin() + static_cast<std::ptrdiff_t>(i * d_));
      mirror_.resize(mirror_.size() - d_);
    }
  }
  std::size_t rows() const { return store_.rows(); }
  TensorView view() const {
    if (!pre_rope_) return store_.view();
    TensorView v;
    v.dense = {DenseType::f32, mirror_.data(), rows()};
    return v;
  }
  std::uint64_t bytes() const { return store_.bytes(); }

 private:
  void quantize_ready() {
    const std::size_t n = rows(), n_quant = store_.packed_rows();
    const std::size_t target = quantized_rows(n, *t_, *p_);
    if (target <= n_quant) return;
    const std::size_t m = target - n_quant, cols = d_ - n_out_;
    if (n_out_ > 0 && outliers_.empty()) {
      // Channels with the largest variance over the first rows quantized, kept from then on.
      outliers_ = select_outlier_channels(pending_.data() + pending_front_ * d_, m, d_, n_out_);
    }
    const float* pending = pending_.data() + pending_front_ * d_;
    std::vector<float> in(m * cols), out_f32(m * n_out_);
    split_outliers(pending, m, d_, outliers_, in.data(), out_f32.data());
    std::vector<std::uint16_t> out(m * n_out_);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = f32_to_f16_ref(out_f32[i]);
    store_.append_packed(quantize_block(in.data(), m, cols, t_->axis, t_->bits, t_->group, p_->rule), outliers_,
                         out.data());
    store_.drop_dense_front(m);
    if (pre_rope_) {
      std::vector<float> deq(m * d_);
      dequantize_rows(store_.view(), d_, n_quant, target, deq.data());
      for (std::size_t r = 0; r < m; ++r) {
        float* row = mirror_.data() + (n_quant + r) * d_;
        std::copy_n(deq.data() + r * d_, d_, row);
        apply_rope(row, 1, static_cast<std::size_t>(positions_[pending_front_ + r]), rope_->layout, *rope_->table);
      }
    }
    // Quantized rows leave the front; they are moved out once they are as many as the rows
    // left (O(1) amortized per row, as PackedTensor's dense rows).
    pending_front_ += m;
    if (pending_front_ * 2 >= positions_.size()) {
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_front_ * d_));
      positions_.erase(positions_.begin(), positions_.begin() + static_cast<std::ptrdiff_t>(pending_front_));
      pending_front_ = 0;
    }
  }

  std::size_t d_;
  const CompressParams* p_;
  const TensorQuant* t_;
  std::size_t n_out_;
  bool pre_rope_;
  const RopeContext* rope_;
  PackedTensor store_;
  std::vector<float> mirror_;   // pre-RoPE keys: [rows, d] post-RoPE rows attention reads
  std::vector<float> pending_;  // [pending_front_ + rows - packed, d] quantization source of unquantized rows
  std::vector<std::int32_t> positions_;  // positions of the pending rows (from pending_front_ on)
  std::size_t pending_front_ = 0;        // rows at the front of pending_ already quantized
  std::vector<std::uint16_t> outliers_;
};

// Streaming eviction keeps rows in no particular order (evicted rows are replaced by the last
// row): position[i] is row i's token position, and `recent` the positions of the last `window`
// rows appended (prompt rows kept, then decoded ones), which are exactly the window's newest
// rows: those are never evicted.
struct HeadState {
  StreamTensor key, value;
  std::vector<std::int32_t> position;
  std::vector<double> score;          // streaming eviction: accumulated attention (h2o)
  std::size_t budget = 0;             // streaming eviction: rows to keep
  std::deque<std::int32_t> recent;    // streaming eviction: last `window` positions appended
};

class RuntimePolicy : public KvPolicy {
 public:
  RuntimePolicy(std::optional<CompressParams> params, const KvGeometry& g, int threads)
      : params_(std::move(params)), g_(g), threads_(threads),
        // Only pre-RoPE keys rotate here, up to the longest sequence the caller will feed.
        table_(g.head_dim, g.rope_theta, 0, params_ && params_->pre_rope ? std::max<std::size_t>(g.max_positions, 1) : 1),
        rope_{g.rope_layout, &table_} {
    const bool exact = !params_;
    if (params_ && !params_->calibration_file.empty() && params_->head_bits.empty()) {
      params_->head_bits = read_calibration(params_->calibration_file, g.prompt_window());
    }
    const CompressParams* p = params_ ? &*params_ : nullptr;
    if (p && p->pre_rope && !g.rope_variant.empty()) {
      throw InvalidInput("pre-rope re-applies plain RoPE after dequantization; this model's RoPE differs",
                         {"", "rope_variant", g.rope_variant});
    }
    const std::size_t n_out = p && p->quantized() ? outlier_count(p->outlier_fraction, g.head_dim) : 0;
    if (p && p->eviction()) {
      const ScoreMethod s = p->eviction()->score.method;
      streaming_ = s == ScoreMethod::h2o || s == ScoreMethod::streamingllm;
      if (streaming_ && p->quantized()) {
        throw UsageError("streaming eviction (h2o, streamingllm) does not combine with --quant in the "
                         "model; use a one-shot method (snapkv, adakv...)", {"", "--quant", quantizer_name(p->method)});
      }
      if (p->eviction()->alloc == AllocMethod::file) {
        throw UsageError("--budgets files describe a dump, not a model run; use --budget", {"", "--budgets"});
      }
    }
    // Per-head parameters (calibrated bits); reserved so the pointers below stay valid.
    per_head_.reserve(g.n_layers * g.n_kv_heads);
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) {
      if (p) per_head_.push_back(p->for_head(i / g.n_kv_heads, i % g.n_kv_heads, g.n_kv_heads));
      const CompressParams* hp = p ? &per_head_.back() : nullptr;
      heads_.push_back(HeadState{
          StreamTensor(g.head_dim, exact, hp, hp ? &hp->key : nullptr, n_out, hp && hp->pre_rope, &rope_),
          StreamTensor(g.head_dim, exact, hp, hp ? &hp->value : nullptr, 0, false, &rope_), {}, {}, 0, {}});
    }
  }

  void ingest_prompt(const PromptKv& prompt) override {
    const std::size_t n = prompt.n_tokens, d = g_.head_dim;
    std::vector<std::vector<std::int32_t>> kept(heads_.size());
    if (params_ && params_->eviction() && params_->eviction()->alloc == AllocMethod::joint) {
      const KvWindow m = g_.prompt_window(n, std::min(n, params_->eviction()->score.window));
      std::vector<std::pair<int, int>> bits;
      const EvictionPlan plan = joint_plan(
          m,
          [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3& v) {
            const Tensor3& all = (*prompt.query)[l];
            q = Tensor3(all.dim0(), m.n_query, all.dim2());
            for (std::size_t h = 0; h < all.dim0(); ++h) {
              std::copy_n(all.row(h, n - m.n_query), m.n_query * all.dim2(), q.row(h, 0));
            }
            k = (*prompt.key)[l];
            v = (*prompt.value)[l];
          },
          *params_, threads_, {}, bits);
      for (std::size_t i = 0; i < heads_.size(); ++i) {
        kept[i] = plan.heads[i / g_.n_kv_heads][i % g_.n_kv_heads].kept;
        CompressParams& hp = per_head_[i];
        if (bits[i].first == 16) {
          hp.method = Quantizer::none;
          hp.residual = 0;
        } else {
          hp.key.bits = bits[i].first;
          hp.value.bits = bits[i].second;
        }
      }
    } else if (params_ && params_->eviction()) {
      const KvWindow m = g_.prompt_window(n, n);
      const EvictionPlan plan = plan_eviction(
          m, [&](std::size_t l, Tensor3& q, Tensor3& k) {
            q = (*prompt.query)[l];
            k = (*prompt.key)[l];
          },
          *params_->eviction(), threads_, {});
      for (std::size_t l = 0; l < g_.n_layers; ++l) {
        for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
          HeadState& s = heads_[l * g_.n_kv_heads + h];
          kept[l * g_.n_kv_heads + h] = plan.heads[l][h].kept;
          s.budget = plan.heads[l][h].tokens;
          if (streaming_ && params_->eviction()->score.method == ScoreMethod::h2o) {
            // Accumulated attention of every prompt query (the plan's H2O scores).
            s.score = plan.heads[l][h].kept_score;
          } else if (streaming_) {
            s.score.assign(plan.heads[l][h].kept.size(), 0.0);  // StreamingLLM: unused
          }
        }
      }
    }
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      const bool pre = params_ && params_->pre_rope;
      for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
        HeadState& s = heads_[l * g_.n_kv_heads + h];
        std::vector<std::int32_t>& keep = kept[l * g_.n_kv_heads + h];
        if (keep.empty()) {
          keep.resize(n);
          std::iota(keep.begin(), keep.end(), 0);
        }
        const std::size_t m = keep.size();
        std::vector<float> k(m * d), kp(m * d), v(m * d);
        for (std::size_t i = 0; i < m; ++i) {
          const auto t = static_cast<std::size_t>(keep[i]);
          std::copy_n((*prompt.key)[l].row(h, t), d, k.data() + i * d);
          std::copy_n((*prompt.key_pre_rope)[l].row(h, t), d, kp.data() + i * d);
          std::copy_n((*prompt.value)[l].row(h, t), d, v.data() + i * d);
        }
        s.key.append(pre ? kp.data() : k.data(), k.data(), keep.data(), m);
        s.value.append(v.data(), v.data(), keep.data(), m);
        s.position = keep;
        if (streaming_) {
          const std::size_t w = std::min(params_->eviction()->score.window, m);
          s.recent.assign(keep.end() - static_cast<std::ptrdiff_t>(w), keep.end());
        }
      }
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

  bool layer_local() const override { return !streaming_; }

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
  std::optional<CompressParams> params_;
  KvGeometry g_;
  int threads_;
  RopeTable table_;
  RopeContext rope_;
  bool streaming_ = false;
  std::vector<CompressParams> per_head_;  // [layer * n_kv_heads + head]
  std::vector<HeadState> heads_;         // [layer * n_kv_heads + head]
};

}  // namespace

std::unique_ptr<KvPolicy> make_kv_policy(const std::optional<CompressParams>& params,
                                         const KvGeometry& g, int threads) {
  if (params && params->tiered()) return make_tiered_policy(*params, g);
  if (params && params->ggml()) return make_ggml_policy(*params->ggml(), g, threads);
  return std::make_unique<RuntimePolicy>(params, g, threads);
}

}  // namespace akv
