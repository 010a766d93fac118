#include "akv/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "akv/attention/block_attention.h"
#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/kv/attend.h"

namespace akv {
namespace {

static_assert(kPrefillBlock % kFlashQueries == 0, "prefill blocks must hold whole flash query tiles");

using Vec = Eigen::VectorXf;

// fn(r) for rows r of [0, rows) on the threads, 16 rows per item (each row computed alone: any
// thread count gives the same bits).
template <class Fn>
void each_row(std::size_t rows, int threads, Fn&& fn) {
  constexpr std::size_t kRows = 16;
  parallel_for((rows + kRows - 1) / kRows, threads, [&](std::size_t i) {
    for (std::size_t r = i * kRows; r < std::min(rows, (i + 1) * kRows); ++r) fn(static_cast<Eigen::Index>(r));
  });
}

// llama2.c rmsnorm: out = w * x / sqrt(mean(x^2) + eps), in f32.
void rmsnorm(const float* x, const std::vector<float>& w, float eps, std::size_t n, float* out) {
  float ss = 0.0f;
  for (std::size_t j = 0; j < n; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (std::size_t j = 0; j < n; ++j) out[j] = w[j] * (ss * x[j]);
}

RowMatrix rmsnorm_rows(const RowMatrix& x, const std::vector<float>& w, float eps) {
  RowMatrix out(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    rmsnorm(x.row(r).data(), w, eps, static_cast<std::size_t>(x.cols()), out.row(r).data());
  }
  return out;
}

// Qwen3's q_norm / k_norm: rmsnorm of each head's head_dim values of every row, in place (no-op
// without weights).
void head_norm(RowMatrix& m, const std::vector<float>& w, float eps, std::size_t head_dim) {
  if (w.empty()) return;
  std::vector<float> tmp(head_dim);
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    for (std::size_t h = 0; h < static_cast<std::size_t>(m.cols()) / head_dim; ++h) {
      float* x = m.row(r).data() + h * head_dim;
      rmsnorm(x, w, eps, head_dim, tmp.data());
      std::copy(tmp.begin(), tmp.end(), x);
    }
  }
}

void add_bias(RowMatrix& m, const std::vector<float>& b) {
  if (b.empty()) return;
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    for (Eigen::Index c = 0; c < m.cols(); ++c) m(r, c) += b[static_cast<std::size_t>(c)];
  }
}

// The projections' rows finished: biases added (Qwen2), then each query and key head normalized
// (Qwen3, Gemma 3), before RoPE.
void finish_qkv(const LayerWeights& lw, float eps, std::size_t head_dim, RowMatrix& q, RowMatrix& k, RowMatrix& v) {
  add_bias(q, lw.bq);
  add_bias(k, lw.bk);
  add_bias(v, lw.bv);
  head_norm(q, lw.q_norm, eps, head_dim);
  head_norm(k, lw.k_norm, eps, head_dim);
}

// [n, heads*hd] row-major -> [heads, n, hd].
Tensor3 split_heads(const RowMatrix& m, std::size_t heads, std::size_t hd) {
  const auto n = static_cast<std::size_t>(m.rows());
  Tensor3 t(heads, n, hd);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t h = 0; h < heads; ++h) std::copy_n(m.row(static_cast<Eigen::Index>(i)).data() + h * hd, hd, t.row(h, i));
  }
  return t;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// transformers' gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in f32.
float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// The MLP's gated product, in place in gate: act(gate) * up.
void gate_rows(RowMatrix& gate, const RowMatrix& up, ModelConfig::Activation act, Eigen::Index r) {
  float* g = gate.row(r).data();
  const float* u = up.row(r).data();
  if (act == ModelConfig::Activation::silu) {
    for (Eigen::Index j = 0; j < gate.cols(); ++j) g[j] = silu(g[j]) * u[j];
  } else {
    for (Eigen::Index j = 0; j < gate.cols(); ++j) g[j] = gelu_tanh(g[j]) * u[j];
  }
}

// Gemma's query_pre_attn_scalar as a factor on the queries (1 when the scale is the default).
float query_factor(const ModelConfig& c) {
  return c.attn_scale == 0.0f ? 1.0f : c.attn_scale * std::sqrt(static_cast<float>(c.head_dim));
}

// The RoPE frequencies of layer l's kind at a call of `len` positions: local layers of a model with
// rope_theta_local rotate with that base and no scaling.
std::vector<float> layer_inv_freq(const ModelConfig& c, bool local, std::size_t len) {
  const std::size_t dims = c.rotary_dim ? c.rotary_dim : c.head_dim;
  if (local && c.rope_theta_local > 0) return rope_inv_freq(dims, c.rope_theta_local, RopeScaling{}, len);
  return rope_inv_freq(dims, c.rope_theta, c.rope_scaling, len);
}

// Gemma 2/3's final logit soft-capping, in place.
void softcap(float* x, std::size_t n, float cap) {
  if (cap == 0.0f) return;
  for (std::size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

struct DecodeScratch {
  RowMatrix x, xb, out, q, k, k_pre, v, att, h1, h3;
};

}  // namespace

std::uint64_t ModelWeights::bytes() const {
  std::uint64_t b = embedding.bytes() + classifier.bytes() + 4 * final_norm.size();
  for (const LayerWeights& l : layers) {
    for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) b += w->bytes();
    b += 4 * (l.attn_norm.size() + l.ffn_norm.size() + l.bq.size() + l.bk.size() + l.bv.size() + l.q_norm.size() +
              l.k_norm.size() + l.post_attn_norm.size() + l.post_ffn_norm.size());
  }
  return b;
}

Model::Model(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), w_(std::move(weights)), limit_(config_.seq_len) {
  const RopeScaling& s = config_.rope_scaling;
  std::string v;
  if (s.kind != RopeScaling::Kind::none) v = rope_scaling_name(s.kind) + " x" + format_number(s.factor);
  if (!s.freq_factors.empty()) v += (v.empty() ? "" : ", ") + std::string("frequency factors");
  if (config_.rotary_dim != 0 && config_.rotary_dim != config_.head_dim) {
    v += (v.empty() ? "" : ", ") + std::string("partial ") + std::to_string(config_.rotary_dim) + " of " +
         std::to_string(config_.head_dim) + " dims";
  }
  if (config_.rope_theta_local > 0) {
    v += (v.empty() ? "" : ", ") + std::string(KvShape::kLocalThetaClause) + format_number(config_.rope_theta_local);
  }
  config_.rope_variant = v;
}

const Weight& Model::classifier() const {
  return w_.classifier.empty() ? w_.embedding : w_.classifier;
}

void Model::check_token(std::int32_t t) const {
  if (t < 0 || static_cast<std::size_t>(t) >= config_.vocab_size) {
    throw InvalidInput("token id outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")",
                       {"", "token", std::to_string(t)});
  }
}

void Model::check_tokens(const std::vector<std::vector<std::int32_t>>& sequences, const std::string& file) const {
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    for (std::size_t i = 0; i < sequences[s].size(); ++i) {
      const std::int32_t t = sequences[s][i];
      if (t < 0 || static_cast<std::size_t>(t) >= config_.vocab_size) {
        throw InvalidInput("token id outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")",
                           {file, "sequence " + std::to_string(s + 1) + " position " + std::to_string(i + 1) + " token",
                            std::to_string(t)});
      }
    }
  }
}

void Model::check_finite(const float* x, std::size_t n, const std::string& where) const {
  if (const std::size_t i = first_nonfinite(x, n); i < n) {
    throw InvalidInput("non-finite activation (the weights overflow f32)", {config_.name, where, format_number(x[i])});
  }
}

void Model::set_position_limit(std::size_t n) {
  limit_ = n;
}

std::string Model::limit_text() const {
  if (limit_ == config_.seq_len) return "the model's context (seq_len " + std::to_string(config_.seq_len) + ")";
  if (limit_ == std::numeric_limits<std::size_t>::max()) return "the positions akv can count (2^64 - 1)";
  return "the run's position limit (" + std::to_string(limit_) + ", --max-context)";
}

PrefillResult Model::prefill(const std::vector<std::int32_t>& tokens, bool all_logits, int threads,
                             std::size_t query_rows, const LayerInputFn& on_input, const LayerKvFn& on_layer) const {
  const ModelConfig& c = config_;
  const std::size_t n = tokens.size(), hd = c.head_dim, g = c.group_size();
  if (n == 0) throw InvalidInput("empty token sequence", {"", "tokens", "0"});
  if (n > limit_) {
    throw InvalidInput("sequence longer than " + limit_text(), {"", "tokens", std::to_string(n)});
  }
  RowMatrix x(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(c.dim));
  for (std::size_t i = 0; i < n; ++i) {
    check_token(tokens[i]);
    w_.embedding.row(static_cast<std::size_t>(tokens[i]), x.row(static_cast<Eigen::Index>(i)).data());
  }
  if (c.embed_scale != 1.0f) x *= c.embed_scale;
  // RoPE angles of the positions this call uses (never of the whole declared context); dynamic
  // scaling sees the call's length, as transformers does. Local layers with their own base
  // rotate with the second table.
  const RopeTable rope(hd, layer_inv_freq(c, false, n), 0, n, static_cast<float>(c.rope_scaling.attention_factor));
  const RopeTable rope_local = c.rope_theta_local > 0 ? RopeTable(hd, layer_inv_freq(c, true, n), 0, n, 1.0f) : rope;
  const float qf = query_factor(c);
  // The prompt's products are exact f32 ones in every weight mode (weight.h, Products): its
  // tokens share each tile of rows.
  const auto mul = [threads](const Weight& w, const RowMatrix& in) { return w.times_transpose(in, threads, Products::f32); };
  PrefillResult res;
  // Each layer runs its rows kPrefillBlock at a time (a multiple of the flash kernel's query tile,
  // so every tile and product sees the rows it sees in one pass: the same bits): block j's keys
  // and values join the layer's before its queries attend, so only the keys, values and the
  // residual stream span the whole prompt; the projections', attention's and MLP's temporaries
  // are one block's.
  const std::size_t kept_queries = std::min(query_rows, n), first_kept = n - kept_queries;
  std::vector<std::size_t> visible(n), first(n);
  for (std::size_t i = 0; i < n; ++i) visible[i] = i + 1;
  for (std::size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& lw = w_.layers[l];
    const std::size_t window = c.window_of(l);
    for (std::size_t i = 0; i < n; ++i) first[i] = window && i + 1 > window ? i + 1 - window : 0;
    const RopeTable& lrope = window ? rope_local : rope;
    std::vector<double>& norms = res.input_norm.emplace_back(n);
    Tensor3 qt(c.n_heads, kept_queries, hd), kh(c.n_kv_heads, n, hd), kp(c.n_kv_heads, n, hd), vh(c.n_kv_heads, n, hd);
    for (std::size_t r0 = 0; r0 < n; r0 += kPrefillBlock) {
      const std::size_t rows = std::min(kPrefillBlock, n - r0);
      const auto block = [&](RowMatrix& m) { return m.middleRows(static_cast<Eigen::Index>(r0), static_cast<Eigen::Index>(rows)); };
      const RowMatrix xb = rmsnorm_rows(RowMatrix(block(x)), lw.attn_norm, c.norm_eps);
      if (on_input) on_input(l, r0, xb);
      for (std::size_t i = 0; i < rows; ++i) {
        double ss = 0;
        const float* r = xb.row(static_cast<Eigen::Index>(i)).data();
        for (std::size_t j = 0; j < c.dim; ++j) ss += static_cast<double>(r[j]) * r[j];
        norms[r0 + i] = std::sqrt(ss);
      }
      RowMatrix q = mul(lw.wq, xb), k = mul(lw.wk, xb), v = mul(lw.wv, xb);
      finish_qkv(lw, c.norm_eps, hd, q, k, v);
      Tensor3 qh = split_heads(q, c.n_heads, hd);
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t h = 0; h < c.n_kv_heads; ++h) {
          const float* kr = k.row(static_cast<Eigen::Index>(i)).data() + h * hd;
          std::copy_n(kr, hd, kh.row(h, r0 + i));
          std::copy_n(kr, hd, kp.row(h, r0 + i));
          std::copy_n(v.row(static_cast<Eigen::Index>(i)).data() + h * hd, hd, vh.row(h, r0 + i));
        }
      }
      for (std::size_t h = 0; h < c.n_heads; ++h) apply_rope(qh.row(h, 0), rows, r0, c.rope_layout, lrope);
      for (std::size_t h = 0; h < c.n_kv_heads; ++h) apply_rope(kh.row(h, r0), rows, r0, c.rope_layout, lrope);
      if (qf != 1.0f) {
        for (std::size_t h = 0; h < c.n_heads; ++h) {
          float* qr = qh.row(h, 0);
          for (std::size_t j = 0; j < rows * hd; ++j) qr[j] *= qf;
        }
      }
      RowMatrix att(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(c.n_heads * hd));
      parallel_for(c.n_heads, threads, [&](std::size_t h) {  // heads write disjoint columns
        CausalBlock b{qh.row(h, 0), kh.row(h / g, 0), visible.data() + r0, rows, r0 + rows, hd};
        if (window) b.first = first.data() + r0;
        b.softcap = c.attn_softcap;
        RowMatrix o(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(hd));
        causal_attention_flash(b, vh.row(h / g, 0), o.data());
        att.middleCols(static_cast<Eigen::Index>(h * hd), static_cast<Eigen::Index>(hd)) = o;
      });
      for (std::size_t i = std::max(r0, first_kept); i < r0 + rows; ++i) {  // the queries asked for
        for (std::size_t h = 0; h < c.n_heads; ++h) std::copy_n(qh.row(h, i - r0), hd, qt.row(h, i - first_kept));
      }
      auto xr = block(x);
      RowMatrix ao = mul(lw.wo, att);
      if (!lw.post_attn_norm.empty()) ao = rmsnorm_rows(ao, lw.post_attn_norm, c.norm_eps);
      xr += ao;
      const RowMatrix xf = rmsnorm_rows(RowMatrix(xr), lw.ffn_norm, c.norm_eps);
      RowMatrix h1 = mul(lw.w1, xf);
      const RowMatrix h3 = mul(lw.w3, xf);
      for (Eigen::Index r = 0; r < h1.rows(); ++r) gate_rows(h1, h3, c.activation, r);
      RowMatrix mo = mul(lw.w2, h1);
      if (!lw.post_ffn_norm.empty()) mo = rmsnorm_rows(mo, lw.post_ffn_norm, c.norm_eps);
      xr += mo;
    }
    check_finite(x.data(), static_cast<std::size_t>(x.size()), "hidden state after layer " + std::to_string(l));
    if (on_layer && !on_layer(l, qt, kh, kp, vh)) {
      res.query.emplace_back();
      res.key.emplace_back();
      res.key_pre_rope.emplace_back();
      res.value.emplace_back();
      continue;
    }
    res.query.push_back(std::move(qt));
    res.key.push_back(std::move(kh));
    res.key_pre_rope.push_back(std::move(kp));
    res.value.push_back(std::move(vh));
  }
  const RowMatrix xn = rmsnorm_rows(all_logits ? x : RowMatrix(x.bottomRows(1)), w_.final_norm, c.norm_eps);
  res.logits = mul(classifier(), xn);
  softcap(res.logits.data(), static_cast<std::size_t>(res.logits.size()), c.final_softcap);
  check_finite(res.logits.data(), static_cast<std::size_t>(res.logits.size()), "prefill logits");
  return res;
}

std::vector<float> Model::decode(std::int32_t token, std::size_t pos, KvPolicy& cache) const {
  const Lane lane{&cache, &token, pos, 1, nullptr};
  RowMatrix logits;
  decode_lanes(&lane, 1, logits, 1);
  return std::vector<float>(logits.data(), logits.data() + logits.size());
}

std::vector<std::size_t> Model::lane_rows(const Lane* lanes, std::size_t n_lanes) const {
  const ModelConfig& c = config_;
  std::vector<std::size_t> row0(n_lanes + 1, 0);
  for (std::size_t i = 0; i < n_lanes; ++i) {
    const Lane& lane = lanes[i];
    if (c.windowed_run(lane.pos + lane.n) && !lane.cache->holds_windows()) {
      throw std::logic_error("decode_lanes: a model with sliding-window layers needs a windowed cache (kv/windowed.h)");
    }
    if (lane.n == 0 || (lane.n > 1 && !lane.cache->layer_local())) {
      throw std::logic_error("decode_lanes: a lane of " + std::to_string(lane.n) +
                             " tokens needs a cache with independent layers");
    }
    for (std::size_t j = 0; j < lane.n; ++j) check_token(lane.tokens[j]);
    if (lane.pos + lane.n > limit_) {
      throw InvalidInput("position beyond " + limit_text(), {"", "pos", std::to_string(lane.pos + lane.n - 1)});
    }
    if (lane.bytes_after) std::fill_n(lane.bytes_after, lane.n, 0);
    row0[i + 1] = row0[i] + lane.n;
  }
  return row0;
}

void Model::embed_lanes(const Lane* lanes, std::size_t n_lanes, RowMatrix& x, std::vector<RopeTable>& ropes,
                        std::vector<RopeTable>& ropes_local) const {
  const ModelConfig& c = config_;
  ropes.clear();
  ropes_local.clear();
  Eigen::Index row = 0;
  for (std::size_t i = 0; i < n_lanes; ++i) {
    for (std::size_t j = 0; j < lanes[i].n; ++j, ++row) {
      const std::size_t p = lanes[i].pos + j;
      w_.embedding.row(static_cast<std::size_t>(lanes[i].tokens[j]), x.row(row).data());
      ropes.emplace_back(c.head_dim, layer_inv_freq(c, false, p + 1), p, 1, static_cast<float>(c.rope_scaling.attention_factor));
      if (c.rope_theta_local > 0) ropes_local.emplace_back(c.head_dim, layer_inv_freq(c, true, p + 1), p, 1, 1.0f);
    }
  }
  if (c.embed_scale != 1.0f) x *= c.embed_scale;
}

void Model::check_lane_logits(const RowMatrix& logits, const Lane* lanes, std::size_t n_lanes, int threads) const {
  const std::size_t vocab = config_.vocab_size, batch = static_cast<std::size_t>(logits.rows());
  // Every row checked on the threads; the first bad row (in row order) is the one reported.
  std::vector<char> finite(batch);
  each_row(batch, threads, [&](Eigen::Index r) {
    const float* row = logits.row(r).data();
    finite[static_cast<std::size_t>(r)] = first_nonfinite(row, vocab) == vocab;
  });
  std::size_t r = 0;
  for (std::size_t i = 0; i < n_lanes; ++i) {
    for (std::size_t j = 0; j < lanes[i].n; ++j, ++r) {
      if (finite[r]) continue;
      check_finite(logits.row(static_cast<Eigen::Index>(r)).data(), vocab,
                   "logits at position " + std::to_string(lanes[i].pos + j));
    }
  }
}

void Model::decode_lanes(const Lane* lanes, std::size_t n_lanes, RowMatrix& logits, int threads,
                         AttentionMode attention) const {
  const ModelConfig& c = config_;
  const std::size_t hd = c.head_dim, nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  const std::vector<std::size_t> row0 = lane_rows(lanes, n_lanes);  // lane i's rows: [row0[i], row0[i + 1])
  const std::size_t batch = row0[n_lanes];
  const auto rows = static_cast<Eigen::Index>(batch);
  // The step's activations, kept per calling thread from one call to the next (every entry is
  // written before it is read).
  thread_local DecodeScratch scratch;
  RowMatrix &x = scratch.x, &xb = scratch.xb, &out = scratch.out, &q = scratch.q, &k = scratch.k,
            &k_pre = scratch.k_pre, &v = scratch.v, &att = scratch.att, &h1 = scratch.h1, &h3 = scratch.h3;
  auto size = [rows](RowMatrix& m, std::size_t cols) { m.resize(rows, static_cast<Eigen::Index>(cols)); };
  for (RowMatrix* m : {&x, &xb, &out}) size(*m, c.dim);
  for (RowMatrix* m : {&q, &att}) size(*m, nq);
  for (RowMatrix* m : {&k, &k_pre, &v}) size(*m, nkv);
  for (RowMatrix* m : {&h1, &h3}) size(*m, c.hidden_dim);
  std::vector<RopeTable> ropes, ropes_local;
  embed_lanes(lanes, n_lanes, x, ropes, ropes_local);
  const float qf = query_factor(c);
  // A lone lane gives its attention the threads (decode attention is bit-identical for any count).
  const int attention_threads = n_lanes == 1 ? threads : 1;
  auto norm_rows = [&](const RowMatrix& in, const std::vector<float>& w, RowMatrix& o) {
    each_row(batch, threads, [&](Eigen::Index b) { rmsnorm(in.row(b).data(), w, c.norm_eps, c.dim, o.row(b).data()); });
  };
  auto product = [&](const Weight& w, const RowMatrix& in, RowMatrix& o) {
    w.times_rows(in.data(), batch, static_cast<std::size_t>(in.cols()), o.data(), static_cast<std::size_t>(o.cols()), threads);
  };
  for (std::size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& lw = w_.layers[l];
    const std::vector<RopeTable>& lropes = c.window_of(l) && !ropes_local.empty() ? ropes_local : ropes;
    norm_rows(x, lw.attn_norm, xb);
    product(lw.wq, xb, q);
    product(lw.wk, xb, k);
    product(lw.wv, xb, v);
    finish_qkv(lw, c.norm_eps, hd, q, k, v);
    k_pre = k;
    parallel_for(n_lanes, threads, [&](std::size_t i) {  // lanes write disjoint rows
      const Lane& lane = lanes[i];
      // A cache whose appended rows stay as they are takes the lane's tokens first, then their
      // queries attend together, each to the rows up to its own; otherwise each token attends
      // right after its own append.
      const bool together = lane.n > 1 && lane.cache->appends_in_place();
      for (std::size_t j = 0; j < lane.n; ++j) {  // in token order: each query sees the rows up to its own
        const std::size_t row = row0[i] + j, p = lane.pos + j;
        const auto r = static_cast<Eigen::Index>(row);
        for (std::size_t h = 0; h < c.n_heads; ++h) apply_rope(q.row(r).data() + h * hd, 1, p, c.rope_layout, lropes[row]);
        for (std::size_t h = 0; h < c.n_kv_heads; ++h) apply_rope(k.row(r).data() + h * hd, 1, p, c.rope_layout, lropes[row]);
        if (qf != 1.0f) {
          for (std::size_t e = 0; e < nq; ++e) q(r, static_cast<Eigen::Index>(e)) *= qf;
        }
        if (lane.cache->wants_inputs()) lane.cache->take_input(l, p, xb.row(r).data(), c.dim);
        lane.cache->append(l, k.row(r).data(), k_pre.row(r).data(), v.row(r).data(), p);
        if (lane.cache->wants_queries()) lane.cache->take_query(l, p, q.row(r).data());
        if (lane.bytes_after) lane.bytes_after[j] += lane.cache->layer_bytes(l);
        if (together) continue;
        attend_layer(*lane.cache, l, q.row(r).data(), c.n_heads, c.n_kv_heads, hd, att.row(r).data(), attention_threads,
                     false, attention, c.attn_softcap);
      }
      if (together) {
        const auto r = static_cast<Eigen::Index>(row0[i]);
        attend_layer_block(*lane.cache, l, q.row(r).data(), lane.n, c.n_heads, c.n_kv_heads, hd, att.row(r).data(),
                           attention_threads, attention, c.attn_softcap, c.window_of(l));
      }
    });
    product(lw.wo, att, out);
    // Gemma's post-norms normalize a branch's output before it joins the residual stream.
    auto add_branch = [&](const std::vector<float>& post, Eigen::Index r) {
      if (post.empty()) {
        x.row(r) += out.row(r);
        return;
      }
      rmsnorm(out.row(r).data(), post, c.norm_eps, c.dim, xb.row(r).data());
      x.row(r) += xb.row(r);
    };
    each_row(batch, threads, [&](Eigen::Index r) {
      add_branch(lw.post_attn_norm, r);
      rmsnorm(x.row(r).data(), lw.ffn_norm, c.norm_eps, c.dim, xb.row(r).data());
    });
    product(lw.w1, xb, h1);
    product(lw.w3, xb, h3);
    each_row(batch, threads, [&](Eigen::Index r) { gate_rows(h1, h3, c.activation, r); });
    product(lw.w2, h1, out);
    each_row(batch, threads, [&](Eigen::Index r) { add_branch(lw.post_ffn_norm, r); });
  }
  parallel_for(n_lanes, threads, [&](std::size_t i) {
    for (std::size_t j = 0; j < lanes[i].n; ++j) lanes[i].cache->end_step();
  });
  norm_rows(x, w_.final_norm, xb);
  size(logits, c.vocab_size);
  product(classifier(), xb, logits);
  if (c.final_softcap != 0.0f) each_row(batch, threads, [&](Eigen::Index r) { softcap(logits.row(r).data(), c.vocab_size, c.final_softcap); });
  check_lane_logits(logits, lanes, n_lanes, threads);
}

}  // namespace akv
