#include "akv/alloc/knapsack.h"
#include "akv/eval/calibrate.h"
#include "akv/eval/calibrate_steps.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>

#include "akv/alloc/bits.h"
#include "akv/alloc/calibration_file.h"
#include "akv/alloc/eviction.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/eval/attention.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"
#include "akv/attention/kv_view.h"
#include "akv/kv/ggml_cache.h"
#include "akv/kv/stored_head.h"
#include "akv/kv/tensor_builder.h"
#include "akv/method/ggml_params.h"
#include "akv/tensor/turboquant.h"
#include "akv/quant/nuq.h"
#include "akv/quant/pack.h"
#include "akv/score/kvzap.h"
#include "akv/score/qfilter.h"

namespace akv::calib {
namespace {

// Bits per element a type stores (its blocks; fp8's one f32 scale per tensor not counted).
double type_bits(const GgmlTypeInfo& t) { return 8.0 * static_cast<double>(t.bytes) / static_cast<double>(t.block); }

// The rows of one tensor of a head stored as `type` (rotated as a cache of that type rotates
// them, kv/ggml_cache.h) and read back into out.
void type_roundtrip(const GgmlTypeInfo& type, RotationKind rotate, bool key, const float* x, std::size_t n,
                    std::size_t d, float* out) {
  TensorBuilder b(d, type, ggml_rotation(rotate, 0, type, d, key));
  std::vector<std::int32_t> pos(n);
  for (std::size_t t = 0; t < n; ++t) pos[t] = static_cast<std::int32_t>(t);
  b.append(x, x, pos.data(), n);
  dequantize_rows(b.view(), d, 0, n, out);
}

// max |x| over n rows of head_dim values, rotated first when `kind` rotates (the rotation a
// cache of that kind applies to keys, resp. values, seed 0).
double stored_amax(const float* rows, std::size_t n, std::size_t d, RotationKind kind, bool key) {
  std::vector<float> x(rows, rows + n * d);
  rotate_rows(tensor_rotation(kind, 0, d, key), x.data(), n, d);
  float a = 0.0f;
  for (const float v : x) a = std::max(a, std::fabs(v));
  return a;
}

// KV head h's query group attending to its keys and values: what each candidate's attention
// is compared with, computed once per head.
class HeadAttention {
 public:
  HeadAttention(const Tensor3& q, const float* k, const float* v, std::size_t h, const DumpMeta& m)
      : q_(q), h_(h), m_(m), kpos_(m.n_tokens), qpos_(m.n_query) {
    std::iota(kpos_.begin(), kpos_.end(), std::size_t{0});
    std::iota(qpos_.begin(), qpos_.end(), m.first_query_pos());
    for (std::size_t qh = h * m.group_size(); qh < (h + 1) * m.group_size(); ++qh) {
      original_.push_back(attention_outputs(input(qh, k, v, kpos_), true));
    }
  }

  // The attention entropy of the window queries, mean over the queries and the group's heads.
  double entropy() const {
    double sum = 0;
    std::size_t n = 0;
    for (const AttentionOutputs& o : original_) {
      for (const double e : o.entropy) sum += e;
      n += o.entropy.size();
    }
    return n ? sum / static_cast<double>(n) : 0.0;
  }

  // Attention-output relative error when the keys and values are replaced by the rows `k2` /
  // `v2` at positions `pos2` (every position when empty).
  double error(const float* k2, const float* v2, const std::vector<std::size_t>& pos2 = {}) const {
    double e = 0, n = 0;
    for (std::size_t i = 0; i < original_.size(); ++i) {
      const AttentionFidelity f =
          output_error(original_[i], attention_outputs(input(h_ * m_.group_size() + i, k2, v2, pos2.empty() ? kpos_ : pos2)),
                       m_.head_dim);
      e += f.out_err2;
      n += f.out_norm2;
    }
    return n > 0 ? std::sqrt(e / n) : 0.0;
  }

 private:
  AttentionInput input(std::size_t qh, const float* k, const float* v, const std::vector<std::size_t>& kpos) const {
    return {q_.row(qh, 0), k, v, m_.n_query, kpos.size(), m_.head_dim, qpos_.data(), kpos.data()};
  }

  const Tensor3& q_;
  std::size_t h_;
  const DumpMeta& m_;
  std::vector<std::size_t> kpos_, qpos_;
  std::vector<AttentionOutputs> original_;  // per query head of the group
};

// The attention-output error of KV head h's query group as a DuoAttention streaming head: only
// the first `sinks` and the last `window` of its T > sinks + window tokens kept.
double streaming_error(const HeadAttention& att, const float* k, const float* v, const DumpMeta& m,
                       std::size_t sinks, std::size_t window) {
  const std::size_t T = m.n_tokens, d = m.head_dim;
  std::vector<std::size_t> pos;
  std::vector<float> ks, vs;
  for (std::size_t t = 0; t < T; ++t) {
    if (!is_forced(t, T, sinks, window)) continue;
    pos.push_back(t);
    ks.insert(ks.end(), k + t * d, k + (t + 1) * d);
    vs.insert(vs.end(), v + t * d, v + (t + 1) * d);
  }
  return att.error(ks.data(), vs.data(), pos);
}

HeadMeasure measure_head(const Tensor3& key, const Tensor3& value, const Tensor3& query, std::size_t h,
                         const DumpMeta& m, const CalibrateOptions& o, bool duo, const TypeLists& types) {
  const std::size_t T = m.n_tokens, d = m.head_dim;
  HeadMeasure r;
  const float* k = key.row(h, 0);
  const float* v = value.row(h, 0);
  HeadInput in;
  in.key = k;
  in.value = v;
  in.n = in.n_tokens = T;
  in.head_dim = d;
  std::vector<float> kq(T * d), vq(T * d);
  const HeadAttention att(query, k, v, h, m);
  for (int b : o.candidates) {
    QuantParams p;
    p.method = Quantizer::kivi;
    p.key = {b, QuantAxis::channel, o.group};
    p.value = {b, QuantAxis::token, o.group};
    p.residual = o.residual;
    p.rule = o.rule;
    p.rotate = o.rotate;
    reconstruct_head(compress_head(in, p), {}, kq.data(), vq.data());
    r.key_error.push_back(att.error(kq.data(), v));
    r.value_error.push_back(att.error(k, vq.data()));
  }
  for (std::size_t i = 0; i < types.key_info.size(); ++i) {
    type_roundtrip(*types.key_info[i], types.key_rotate[i], true, k, T, d, kq.data());
    r.type_key_error.push_back(att.error(kq.data(), v));
  }
  for (std::size_t i = 0; i < types.value_info.size(); ++i) {
    type_roundtrip(*types.value_info[i], types.value_rotate[i], false, v, T, d, vq.data());
    r.type_value_error.push_back(att.error(k, vq.data()));
  }
  if (duo) r.duo_error = streaming_error(att, k, v, m, o.duo_sinks, o.duo_window);
  r.key_amax = stored_amax(k, T, d, o.rotate, true);
  r.value_amax = stored_amax(v, T, d, o.rotate, false);
  RunningMoments mom;
  std::vector<double> absmax(d, 0.0);
  for (std::size_t t = 0; t < T; ++t) {
    double s = 0;
    for (std::size_t c = 0; c < d; ++c) {
      const double x = k[t * d + c];
      s += x * x;
      absmax[c] = std::max(absmax[c], std::fabs(x));
    }
    r.norms.push_back(std::sqrt(s));
    mom.add(std::sqrt(s));
  }
  r.norm_variance = mom.variance();
  std::vector<double> sorted = absmax;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(d / 2), sorted.end());
  r.outlier_ratio = sorted[d / 2] > 0 ? *std::max_element(absmax.begin(), absmax.end()) / sorted[d / 2] : 0.0;
  r.entropy = att.entropy();
  return r;
}

std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
    for (std::size_t k = i; k <= j; ++k) r[order[k]] = avg;
    i = j + 1;
  }
  return r;
}

// The options' checks that need no dump; the candidate bits, sorted, each once.
std::vector<int> checked_candidates(const std::vector<std::string>& dumps, const CalibrateOptions& o) {
  if (dumps.empty()) throw UsageError("calibrate needs at least one dump", {"", "DUMP"});
  if (o.candidates.empty()) throw InvalidInput("empty candidate set", {"", "--bits", ""});
  for (int b : o.candidates) check_bits(b, "--bits");
  std::vector<int> cand = o.candidates;
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  if (!(o.target_bits >= cand.front() && o.target_bits <= cand.back())) {
    throw InvalidInput("target bits outside the candidate range [" + std::to_string(cand.front()) + ", " +
                           std::to_string(cand.back()) + "]",
                       {"", "--target-bits", format_number(o.target_bits)});
  }
  if (o.group == 0) throw InvalidInput("group size must be >= 1", {"", "--group-size", "0"});
  if (o.residual % o.group != 0) {
    throw InvalidInput("residual window must be a multiple of the group size", {"", "--residual", std::to_string(o.residual)});
  }
  for (int b : o.nuq_bits) check_bits(b, "--nuq-bits");
  if (!(o.nuq_sparsity > 0.0 && o.nuq_sparsity <= 1.0)) {
    throw InvalidInput("nuq sparsity threshold must be in (0, 1]", {"", "--nuq-sparsity", format_number(o.nuq_sparsity)});
  }
  if (o.aggregate != "mean" && o.aggregate != "max") throw InvalidInput("aggregate must be mean or max", {"", "--aggregate", o.aggregate});
  if (o.allocator != "measured" && o.allocator != "adakv-proxy" && o.allocator != "entropy") {
    throw InvalidInput("allocator must be measured, adakv-proxy or entropy", {"", "--allocator", o.allocator});
  }
  return cand;
}

// Each dump's shape into st.metas (one model's), and what every dump holds: pre-RoPE keys (nuq),
// Fisher information, attention inputs with KVzip+ scores (kvzap, one input width).
void read_dump_shapes(const std::vector<std::string>& dumps, const CalibrateOptions& o, Setup& st) {
  std::size_t input_dim = 0;
  for (const auto& path : dumps) {
    DumpReader r(path);
    const DumpMeta& m = r.meta();
    require_windows_hold_tokens(m, path, "calibration");
    const bool zap = r.has_matrix(DumpMatrix::attn_input) && r.has_matrix(DumpMatrix::kvzip_plus);
    if (zap && st.kvzap && input_dim && r.input_dim() != input_dim) {
      throw InvalidInput("dumps with attention inputs of different widths", {path, "attn_input.shape[1]", std::to_string(r.input_dim())});
    }
    if (zap) input_dim = r.input_dim();
    st.kvzap = st.kvzap && zap;
    st.kvzap_rows += m.n_tokens - std::min(m.n_tokens, o.kvzap_sinks);
    st.nuq = st.nuq && r.has_key_pre_rope();
    st.fisher = st.fisher && r.has_fisher();
    if (!st.metas.empty() && (m.n_layers != st.metas[0].n_layers || m.n_kv_heads != st.metas[0].n_kv_heads ||
                              m.n_heads != st.metas[0].n_heads || m.head_dim != st.metas[0].head_dim)) {
      throw InvalidInput("dumps of different model shapes", {path, "n_layers/n_heads/n_kv_heads/head_dim"});
    }
    st.metas.push_back(m);
  }
}

// --types as key and value type lists at head_dim d (TurboQuant's tq* types store keys only,
// tqv* values only), each once.
TypeLists cache_type_lists(const CalibrateOptions& o, std::size_t d) {
  TypeLists types;
  std::vector<std::string> names = o.types;
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) != names.end()) {
    throw InvalidInput("a cache type given twice", {"", "--types", *std::adjacent_find(names.begin(), names.end())});
  }
  for (const std::string& name : o.types) {
    const HeadType ht = parse_head_type(name, "", "--types");
    const GgmlTypeInfo& t = ggml_cache_type(ht.name, d, "", "--types");
    check_ggml_head_dim(t, d, "", "--types " + name + ": head_dim");
    const std::optional<TqType> tq = tq_type_of(t);
    if (!tq || tq->kind != TqKind::value) {
      types.key.push_back(name);
      types.key_info.push_back(&t);
      types.key_rotate.push_back(ht.rotate.value_or(o.rotate));
    }
    if (!tq || tq->kind == TqKind::value) {
      types.value.push_back(name);
      types.value_info.push_back(&t);
      types.value_rotate.push_back(ht.rotate.value_or(o.rotate));
    }
  }
  if (!o.types.empty() && (types.key.empty() || types.value.empty())) {
    throw InvalidInput("--types needs a type for keys and one for values (tqv* store values only, tq* keys only)",
                       {"", "--types", o.types.front()});
  }
  return types;
}

}  // namespace

Setup setup(const std::vector<std::string>& dumps, const CalibrateOptions& o) {
  Setup st;
  st.opt = o;
  st.opt.candidates = checked_candidates(dumps, o);
  std::sort(st.opt.nuq_bits.begin(), st.opt.nuq_bits.end());
  st.opt.nuq_bits.erase(std::unique(st.opt.nuq_bits.begin(), st.opt.nuq_bits.end()), st.opt.nuq_bits.end());
  st.nuq = !st.opt.nuq_bits.empty();
  st.fisher = true;
  st.kvzap = true;
  if (!(o.kvzap_alpha > 0 && std::isfinite(o.kvzap_alpha))) {
    throw InvalidInput("the KVzap ridge penalty must be > 0", {"", "--kvzap-alpha", format_number(o.kvzap_alpha)});
  }
  read_dump_shapes(dumps, o, st);
  st.kvzap = st.kvzap && st.kvzap_rows > 0;
  st.duo = std::all_of(st.metas.begin(), st.metas.end(),
                       [&](const DumpMeta& m) { return m.n_tokens > o.duo_sinks + o.duo_window; });
  st.types = cache_type_lists(o, st.metas[0].head_dim);
  if (!(o.types_target_bits >= 0 && std::isfinite(o.types_target_bits))) {
    throw InvalidInput("types target bits must be >= 0", {"", "--types-target-bits", format_number(o.types_target_bits)});
  }
  return st;
}

// Layers [lo, hi) measured over every dump and aggregated (mean or max): [hi - lo][head].
std::vector<std::vector<HeadMeasure>> measure_layers(const std::vector<std::string>& dumps, const Setup& st,
                                                     std::size_t lo, std::size_t hi, const ProgressFn& progress) {
  const CalibrateOptions& opt = st.opt;
  const std::size_t H = st.metas[0].n_kv_heads, C = opt.candidates.size();
  std::vector<std::vector<HeadMeasure>> agg(hi - lo, std::vector<HeadMeasure>(H));
  std::size_t step = 0;
  for (std::size_t di = 0; di < dumps.size(); ++di) {
    DumpReader r(dumps[di]);
    const DumpMeta& m = r.meta();
    Tensor3 key, value, query;  // each layer in the previous one's storage
    for (std::size_t l = lo; l < hi; ++l) {
      r.read_into(key, l, DumpField::key);
      r.read_into(value, l, DumpField::value);
      r.read_into(query, l, DumpField::query);
      std::vector<HeadMeasure> hm(H);
      parallel_for(H, opt.threads, [&](std::size_t h) { hm[h] = measure_head(key, value, query, h, m, opt, st.duo, st.types); });
      for (std::size_t h = 0; h < H; ++h) {
        HeadMeasure& a = agg[l - lo][h];
        if (di == 0) {
          a = hm[h];
          continue;
        }
        for (std::size_t c = 0; c < C; ++c) {
          if (opt.aggregate == "max") {
            a.key_error[c] = std::max(a.key_error[c], hm[h].key_error[c]);
            a.value_error[c] = std::max(a.value_error[c], hm[h].value_error[c]);
          } else {
            a.key_error[c] += hm[h].key_error[c];
            a.value_error[c] += hm[h].value_error[c];
          }
        }
        if (a.duo_error) {
          a.duo_error = opt.aggregate == "max" ? std::max(*a.duo_error, *hm[h].duo_error) : *a.duo_error + *hm[h].duo_error;
        }
        for (const bool k : {true, false}) {
          std::vector<double>& to = k ? a.type_key_error : a.type_value_error;
          const std::vector<double>& from = k ? hm[h].type_key_error : hm[h].type_value_error;
          for (std::size_t t = 0; t < to.size(); ++t) to[t] = opt.aggregate == "max" ? std::max(to[t], from[t]) : to[t] + from[t];
        }
        a.key_amax = std::max(a.key_amax, hm[h].key_amax);
        a.value_amax = std::max(a.value_amax, hm[h].value_amax);
        a.norm_variance += hm[h].norm_variance;
        a.entropy += hm[h].entropy;
        a.outlier_ratio += hm[h].outlier_ratio;
      }
      if (progress) progress(++step, dumps.size() * (hi - lo));
    }
  }
  const double nd = static_cast<double>(dumps.size());
  for (auto& l : agg) {
    for (auto& a : l) {
      if (opt.aggregate == "mean") {
        for (double& e : a.key_error) e /= nd;
        for (double& e : a.value_error) e /= nd;
        for (double& e : a.type_key_error) e /= nd;
        for (double& e : a.type_value_error) e /= nd;
        if (a.duo_error) *a.duo_error /= nd;
      }
      a.norm_variance /= nd;
      a.entropy /= nd;
      a.outlier_ratio /= nd;
    }
  }
  return agg;
}

// The Q-Filters of layers [lo, hi) into agg: each layer's queries of every dump stacked (a layer
// at a time, every dump open), then fitted.
void fit_layer_qfilters(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo, std::size_t hi,
                        std::vector<std::vector<HeadMeasure>>& agg) {
  std::deque<DumpReader> readers;  // open files: not moved
  std::size_t rows = 0;
  for (const auto& d : dumps) {
    readers.emplace_back(d);
    rows += readers.back().meta().n_query;
  }
  const DumpMeta& m0 = st.metas[0];
  Tensor3 stacked(m0.n_heads, rows, m0.head_dim), query;
  for (std::size_t l = lo; l < hi; ++l) {
    std::size_t at = 0;
    for (const DumpReader& r : readers) {
      r.read_into(query, l, DumpField::query);
      for (std::size_t h = 0; h < m0.n_heads; ++h) {
        std::copy(query.row(h, 0), query.row(h, 0) + query.dim1() * m0.head_dim, stacked.row(h, at));
      }
      at += query.dim1();
    }
    const auto filters = fit_qfilters(stacked, m0.n_kv_heads, st.opt.threads);
    for (std::size_t h = 0; h < m0.n_kv_heads; ++h) agg[l - lo][h].qfilter = filters[h];
  }
}

// KVzap's surrogates of layers [lo, hi) into agg (nothing unless st.kvzap): each layer's ridge
// regression over every dump (in the order given) of log kvzip_plus on attn_input, each dump's
// first kvzap_sinks tokens left out.
void fit_layer_kvzap(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo, std::size_t hi,
                     std::vector<std::vector<HeadMeasure>>& agg) {
  if (!st.kvzap) return;
  std::deque<DumpReader> readers;
  for (const auto& d : dumps) readers.emplace_back(d);
  const std::size_t H = st.metas[0].n_kv_heads;
  for (std::size_t i = 0; i < hi - lo; ++i) {  // HDF5 reads one at a time
    const std::size_t l = lo + i;
    RidgeAccumulator acc(readers.front().input_dim(), H);
    for (const DumpReader& r : readers) {
      const RowMatrix x = r.read_matrix(l, DumpMatrix::attn_input), s = r.read_matrix(l, DumpMatrix::kvzip_plus);
      const std::size_t n = static_cast<std::size_t>(x.rows());
      std::vector<std::vector<double>> y(H, std::vector<double>(n));
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t t = 0; t < n; ++t) {
          const float v = s(static_cast<Eigen::Index>(h), static_cast<Eigen::Index>(t));
          if (!(v > 0)) {
            throw InvalidInput("a KVzip+ score that is not > 0 (KVzap fits its logarithm)",
                               {r.path(), dump_matrix_path(l, DumpMatrix::kvzip_plus) + "[" + std::to_string(h) + ", " +
                                              std::to_string(t) + "]", format_number(v)});
          }
          y[h][t] = std::log(static_cast<double>(v));
        }
      }
      acc.add(x, y, std::min(n, st.opt.kvzap_sinks));
    }
    const KvzapLayer fit = acc.solve(st.opt.kvzap_alpha);
    const std::vector<double> r2 = acc.r2(fit);
    for (std::size_t h = 0; h < H; ++h) {
      agg[i][h].kvzap_weight = fit.weight[h];
      agg[i][h].kvzap_bias = fit.bias[h];
      agg[i][h].kvzap_r2 = r2[h];
    }
  }
}

// KVQuant's codebooks of layers [lo, hi) (empty unless st.nuq): each layer's pre-RoPE keys and
// values of every dump stacked as KVQuant's rows [tokens, n_kv_heads * head_dim] (a layer at a
// time, every dump open), each dump's first nuq_sink rows first (the sink rows calibrate_nuq
// leaves out of the fit; thresholds and per-row fits do not depend on the order), then fitted
// for every bit width.
std::vector<LayerNuq> fit_layer_nuq(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo,
                                    std::size_t hi) {
  if (!st.nuq) return {};
  const CalibrateOptions& o = st.opt;
  std::deque<DumpReader> readers;
  std::size_t rows = 0, sinks = 0;
  for (const auto& d : dumps) {
    readers.emplace_back(d);
    rows += readers.back().meta().n_tokens;
    sinks += std::min(o.nuq_sink, readers.back().meta().n_tokens);
  }
  const DumpMeta& m0 = st.metas[0];
  const std::size_t H = m0.n_kv_heads, d = m0.head_dim, C = H * d, B = o.nuq_bits.size();
  std::vector<float> key(rows * C), value(rows * C), key_w(st.fisher ? rows * C : 0), value_w(key_w.size());
  std::vector<LayerNuq> out;
  Tensor3 k, v, kw, vw;
  for (std::size_t l = lo; l < hi; ++l) {
    std::size_t sink_at = 0, rest_at = sinks;
    for (const DumpReader& r : readers) {
      r.read_into(k, l, DumpField::key_pre_rope);
      r.read_into(v, l, DumpField::value);
      if (st.fisher) {
        r.read_into(kw, l, DumpField::key_fisher);
        r.read_into(vw, l, DumpField::value_fisher);
        for (const auto& [w, field] : {std::pair{&kw, DumpField::key_fisher}, std::pair{&vw, DumpField::value_fisher}}) {
          const auto neg = std::find_if(w->data(), w->data() + w->size(), [](float x) { return x < 0.0f; });
          if (neg != w->data() + w->size()) {
            throw InvalidInput("sensitivity weights must be >= 0",
                               {r.path(), dump_dataset_path(l, field) + "[" + std::to_string(neg - w->data()) + "]",
                                format_number(*neg)});
          }
        }
      }
      const std::size_t n = k.dim1(), s = std::min(o.nuq_sink, n);
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t row = t < s ? sink_at++ : rest_at++;
        for (std::size_t h = 0; h < H; ++h) {
          std::copy_n(k.row(h, t), d, key.data() + row * C + h * d);
          std::copy_n(v.row(h, t), d, value.data() + row * C + h * d);
          if (st.fisher) {
            std::copy_n(kw.row(h, t), d, key_w.data() + row * C + h * d);
            std::copy_n(vw.row(h, t), d, value_w.data() + row * C + h * d);
          }
        }
      }
    }
    const float* kwp = st.fisher ? key_w.data() : nullptr;
    const float* vwp = st.fisher ? value_w.data() : nullptr;
    LayerNuq ln;
    ln.key.resize(B);
    ln.value.resize(B);
    // The keys' and the values' thresholds and sorted values once, then each bit width's levels.
    std::vector<std::string> failed(2 * B);
    std::optional<NuqFit> fits[2];
    const auto fail = [&](std::size_t i, const InvalidInput& e) {
      failed[i] = "layer " + std::to_string(l) + (i < B ? " keys: " : " values: ") + e.what();
    };
    parallel_for(2, o.threads, [&](std::size_t i) {
      try {
        if (i == 0) {
          fits[0].emplace(key.data(), rows, C, true, o.nuq_sparsity, sinks, kwp);
        } else {
          fits[1].emplace(value.data(), rows, C, false, o.nuq_sparsity, sinks, vwp, d);
        }
      } catch (const InvalidInput& e) {
        fail(i * B, e);
      }
    });
    parallel_for(2 * B, o.threads, [&](std::size_t i) {
      const std::optional<NuqFit>& fit = fits[i < B ? 0 : 1];
      if (!fit) return;
      try {
        (i < B ? ln.key[i] : ln.value[i - B]) = fit->levels(o.nuq_bits[i % B]);
      } catch (const InvalidInput& e) {
        fail(i, e);
      }
    });
    for (const std::string& f : failed) {
      if (ln.failed.empty()) ln.failed = f;
    }
    if (!ln.failed.empty()) {
      ln.key.clear();
      ln.value.clear();
    }
    out.push_back(std::move(ln));
  }
  return out;
}

namespace {

std::size_t query_rows(const Setup& st) {
  std::size_t rows = 0;
  for (const DumpMeta& m : st.metas) rows += m.n_query;
  return rows;
}

}  // namespace

namespace {

// Bits per head (key and value, [layer * H + head]): the knapsack over the measured errors, or
// the AdaKV-proxy rule on the head proxies (with an update interval: its assignments as the
// prompt grows, in history).
struct BitAssignment {
  std::vector<int> key, value;
  nlohmann::json history = nlohmann::json::array();
};

BitAssignment assign_bits(const Setup& st, const std::vector<std::vector<HeadMeasure>>& agg) {
  const CalibrateOptions& opt = st.opt;
  const std::vector<int>& cand = opt.candidates;
  const DumpMeta& m0 = st.metas[0];
  const std::size_t L = m0.n_layers, H = m0.n_kv_heads;
  BitAssignment a;
  a.key.resize(L * H);
  a.value.resize(L * H);
  if (opt.allocator == "measured") {
    std::vector<std::vector<double>> err;
    for (std::size_t i = 0; i < L * H; ++i) err.push_back(agg[i / H][i % H].key_error);
    for (std::size_t i = 0; i < L * H; ++i) err.push_back(agg[i / H][i % H].value_error);
    const long long budget = static_cast<long long>(std::floor(opt.target_bits * static_cast<double>(2 * L * H) + 1e-9));
    const auto pick = knapsack_min_error(err, cand, budget);
    for (std::size_t i = 0; i < L * H; ++i) {
      a.key[i] = cand[pick[i]];
      a.value[i] = cand[pick[L * H + i]];
    }
    return a;
  }
  auto importance = [&](std::size_t upto) {
    std::vector<double> imp(L * H);
    for (std::size_t i = 0; i < L * H; ++i) {
      const HeadMeasure& h = agg[i / H][i % H];
      if (opt.allocator == "entropy") {
        imp[i] = h.entropy;
      } else {
        RunningMoments mom;  // first dump's norms, as a stream
        for (std::size_t t = 0; t < std::min(upto, h.norms.size()); ++t) mom.add(h.norms[t]);
        imp[i] = upto >= h.norms.size() ? h.norm_variance : mom.variance();
      }
    }
    return imp;
  };
  std::vector<int> bits;
  if (opt.allocator == "adakv-proxy" && opt.update_interval > 0) {
    for (std::size_t t = opt.update_interval; t <= m0.n_tokens; t += opt.update_interval) {
      bits = adakv_proxy_bits(importance(t), opt.target_bits, opt.lo, opt.mid, opt.hi);
      a.history.push_back({{"tokens", t}, {"bits", bits}});
    }
  }
  if (bits.empty()) bits = adakv_proxy_bits(importance(m0.n_tokens), opt.target_bits, opt.lo, opt.mid, opt.hi);
  a.key = bits;
  a.value = bits;
  return a;
}

// --types: each head's key type and value type, the least summed measured error within the
// stored bits per element (multiple-choice knapsack, alloc/knapsack.h, on the bits above each
// item's cheapest type: the all-cheapest choice always fits). pick: [L H key types, L H value
// types] as indices into the lists (empty without --types).
struct TypeAssignment {
  double target = 0;
  std::vector<double> key_bits, value_bits;  // per listed type
  std::vector<std::size_t> pick;
};

TypeAssignment assign_types(const Setup& st, const std::vector<std::vector<HeadMeasure>>& agg) {
  const CalibrateOptions& opt = st.opt;
  const TypeLists& tl = st.types;
  const std::size_t L = st.metas[0].n_layers, H = st.metas[0].n_kv_heads;
  TypeAssignment ta;
  ta.target = opt.types_target_bits > 0 ? opt.types_target_bits : opt.target_bits;
  const double types_target = ta.target;
  std::vector<std::size_t>& tpick = ta.pick;
  std::vector<double>& key_bits = ta.key_bits;
  std::vector<double>& value_bits = ta.value_bits;
  for (const GgmlTypeInfo* t : tl.key_info) key_bits.push_back(type_bits(*t));
  for (const GgmlTypeInfo* t : tl.value_info) value_bits.push_back(type_bits(*t));
  if (tl.key.empty()) return ta;
  const double least = (*std::min_element(key_bits.begin(), key_bits.end()) +
                        *std::min_element(value_bits.begin(), value_bits.end())) / 2.0;
  if (types_target < least) {
    throw InvalidInput("types target below the cheapest key and value types' mean (" + format_number(least) + " bits)",
                       {"", "--types-target-bits", format_number(types_target)});
  }
  auto above_least = [](std::vector<double> b) {
    const double m = *std::min_element(b.begin(), b.end());
    for (double& x : b) x -= m;
    return b;
  };
  const std::vector<double> kx = above_least(key_bits), vx = above_least(value_bits);
  std::vector<std::vector<double>> err, cost;
  for (std::size_t i = 0; i < L * H; ++i) {
    err.push_back(agg[i / H][i % H].type_key_error);
    cost.push_back(kx);
  }
  for (std::size_t i = 0; i < L * H; ++i) {
    err.push_back(agg[i / H][i % H].type_value_error);
    cost.push_back(vx);
  }
  const double spare = (types_target - least) * static_cast<double>(2 * L * H);
  // Every type's bits are whole 1/64ths (8 bytes / block, blocks of at most 512 values): in
  // those units the costs are exact integers, and the knapsack exact, while the budget is at
  // most 20000 of them; above that, costs round up to 1/20000 of the spare bits.
  const auto units = static_cast<long long>(std::floor(spare * 64.0 + 1e-9));
  if (spare > 0 && units <= 20000) {
    std::vector<std::vector<long long>> icost;
    for (const auto& c : cost) {
      std::vector<long long>& ic = icost.emplace_back();
      for (double b : c) ic.push_back(std::llround(b * 64.0));
    }
    tpick = *knapsack(err, icost, units);  // the all-cheapest choice (cost 0) always fits
  } else if (spare > 0) {
    tpick = knapsack_real(err, cost, spare);
  } else {  // exactly the cheapest: each item its cheapest type of least error (the first of equal error)
    for (std::size_t i = 0; i < cost.size(); ++i) {
      const double least_cost = *std::min_element(cost[i].begin(), cost[i].end());
      std::size_t best = cost[i].size();
      for (std::size_t t = 0; t < cost[i].size(); ++t) {
        if (cost[i][t] == least_cost && (best == cost[i].size() || err[i][t] < err[i][best])) best = t;
      }
      tpick.push_back(best);
    }
  }
  return ta;
}

// The options as calib.json records them (params).
nlohmann::json params_json(const Setup& st, double types_target) {
  const CalibrateOptions& opt = st.opt;
  nlohmann::json p = {{"candidates", opt.candidates}, {"group", opt.group}, {"residual", opt.residual},
              {"quant_rule", quant_rule_name(opt.rule)}, {"target_bits", opt.target_bits}, {"aggregate", opt.aggregate}, {"allocator", opt.allocator},
              {"lo_bit", opt.lo}, {"mid_bit", opt.mid}, {"hi_bit", opt.hi}, {"update_interval", opt.update_interval},
              {"duo_sinks", opt.duo_sinks}, {"duo_window", opt.duo_window}, {"nuq_bits", opt.nuq_bits},
              {"nuq_sparsity", opt.nuq_sparsity}, {"nuq_sink", opt.nuq_sink},
              {"error", "attention-output relative error of the head's query group, keys (or values) quantized "
                        "with the kivi layout, everything else exact"}};
  if (opt.rotate != RotationKind::none) p["rotate"] = rotation_name(opt.rotate);  // absent: none
  if (st.kvzap) {  // absent: no surrogate fitted
    p["kvzap_alpha"] = opt.kvzap_alpha;
    p["kvzap_sinks"] = opt.kvzap_sinks;
  }
  if (!st.types.key.empty()) {
    p["types"] = opt.types;
    p["types_target_bits"] = types_target;
  }
  return p;
}

}  // namespace

// The allocation over every head and calib.json.
nlohmann::json assemble(const std::vector<std::string>& dumps, const Setup& st,
                        const std::vector<std::vector<HeadMeasure>>& agg, const std::vector<LayerNuq>& nuq) {
  const CalibrateOptions& opt = st.opt;
  const std::vector<int>& cand = opt.candidates;
  const DumpMeta& m0 = st.metas[0];
  const std::size_t L = m0.n_layers, H = m0.n_kv_heads, C = cand.size();
  const BitAssignment ba = assign_bits(st, agg);
  const std::vector<int>& bk = ba.key;
  const std::vector<int>& bv = ba.value;
  const nlohmann::json& history = ba.history;
  auto index_of = [&](int b) {
    const auto it = std::find(cand.begin(), cand.end(), b);
    return it == cand.end() ? std::size_t{0} : static_cast<std::size_t>(it - cand.begin());
  };
  const TypeLists& tl = st.types;
  const TypeAssignment ta = assign_types(st, agg);
  const std::vector<std::size_t>& tpick = ta.pick;
  const std::vector<double>& key_bits = ta.key_bits;
  const std::vector<double>& value_bits = ta.value_bits;
  const double types_target = ta.target;
  double types_error = 0, types_bits = 0;
  CalibrationFile f;
  f.shape = m0;
  f.candidates = cand;
  f.key_types = tl.key;
  f.value_types = tl.value;
  double predicted = 0, bits_sum = 0;
  std::vector<double> uniform(C, 0.0);
  std::vector<double> nv, en, orat, ke, ve;
  for (std::size_t l = 0; l < L; ++l) {
    auto& layer = f.heads.emplace_back();
    for (std::size_t h = 0; h < H; ++h) {
      const HeadMeasure& a = agg[l][h];
      const std::size_t i = l * H + h;
      const bool in_set = std::find(cand.begin(), cand.end(), bk[i]) != cand.end() &&
                          std::find(cand.begin(), cand.end(), bv[i]) != cand.end();
      const double pe = in_set ? a.key_error[index_of(bk[i])] + a.value_error[index_of(bv[i])] : NAN;
      for (std::size_t c = 0; c < C; ++c) uniform[c] += a.key_error[c] + a.value_error[c];
      CalibrationHead ch;
      static_cast<HeadStats&>(ch) = a;
      ch.bits_key = bk[i];
      ch.bits_value = bv[i];
      if (std::isfinite(pe)) ch.predicted_error = pe;
      if (!tpick.empty()) {
        ch.type_key = tl.key[tpick[i]];
        ch.type_value = tl.value[tpick[L * H + i]];
        types_error += a.type_key_error[tpick[i]] + a.type_value_error[tpick[L * H + i]];
        types_bits += key_bits[tpick[i]] + value_bits[tpick[L * H + i]];
      }
      layer.push_back(ch);
      if (std::isfinite(pe)) predicted += pe;
      bits_sum += bk[i] + bv[i];
      nv.push_back(a.norm_variance);
      en.push_back(a.entropy);
      orat.push_back(a.outlier_ratio);
      ke.push_back(a.key_error[0]);
      ve.push_back(a.value_error[0]);
    }
  }
  for (const auto& d : dumps) f.dumps.emplace_back(d, file_hash(d));
  nlohmann::json uni = nlohmann::json::object();
  for (std::size_t c = 0; c < C; ++c) uni[std::to_string(cand[c])] = uniform[c];
  auto corr = [&](const std::vector<double>& p) {
    return nlohmann::json{{"key", spearman(p, ke)}, {"value", spearman(p, ve)}};
  };
  f.params = params_json(st, types_target);
  f.summary = {{"achieved_bits", bits_sum / static_cast<double>(2 * L * H)},
               {"predicted_error", predicted},
               {"uniform_predicted_error", uni},
               {"spearman_vs_error_at_lowest_bits",
                {{"norm_variance", corr(nv)}, {"entropy", corr(en)}, {"outlier_ratio", corr(orat)}}}};
  f.summary["qfilter_rows"] = query_rows(st);
  if (st.duo) f.summary["duo"] = {{"sinks", opt.duo_sinks}, {"window", opt.duo_window}};
  if (st.kvzap) {
    nlohmann::json r2 = nlohmann::json::array();
    for (std::size_t l = 0; l < L; ++l) {
      double sum = 0;
      for (std::size_t h = 0; h < H; ++h) sum += agg[l][h].kvzap_r2;
      r2.push_back(sum / static_cast<double>(H));
    }
    f.summary["kvzap"] = {{"rows", st.kvzap_rows}, {"input_dim", agg[0][0].kvzap_weight.size()}, {"r2_per_layer", r2}};
  }
  if (!tl.key.empty()) {
    nlohmann::json kb = nlohmann::json::object(), vb = nlohmann::json::object();
    for (std::size_t t = 0; t < tl.key.size(); ++t) kb[tl.key[t]] = key_bits[t];
    for (std::size_t t = 0; t < tl.value.size(); ++t) vb[tl.value[t]] = value_bits[t];
    f.summary["types"] = {{"key_bits", kb}, {"value_bits", vb}, {"target_bits", types_target},
                          {"achieved_bits", types_bits / static_cast<double>(2 * L * H)}, {"predicted_error", types_error},
                          {"error", "attention-output relative error of the head's query group, keys (or values) stored "
                                    "as the type (rotated as params.rotate), everything else exact"}};
  }
  if (!history.empty()) f.summary["bits_history"] = history;
  const auto failed = std::find_if(nuq.begin(), nuq.end(), [](const LayerNuq& ln) { return !ln.failed.empty(); });
  if (failed != nuq.end()) f.summary["nuq_not_fitted"] = failed->failed;
  if (st.nuq && failed == nuq.end()) {
    CalibrationNuq q;
    q.sparsity = opt.nuq_sparsity;
    q.sink = opt.nuq_sink;
    q.bits = opt.nuq_bits;
    q.fisher = st.fisher;
    for (const LayerNuq& ln : nuq) {
      q.key.push_back(ln.key);
      q.value.push_back(ln.value);
    }
    f.nuq = std::move(q);
  }
  return calibration_to_json(f);
}

}  // namespace akv::calib

namespace akv {

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const auto ra = calib::ranks(a), rb = calib::ranks(b);
  const double n = static_cast<double>(a.size());
  if (n < 2) return 0.0;
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

nlohmann::json calibrate(const std::vector<std::string>& dumps, const CalibrateOptions& o,
                         const ProgressFn& progress) {
  using namespace calib;
  const Setup st = setup(dumps, o);
  auto agg = measure_layers(dumps, st, 0, st.metas[0].n_layers, progress);
  fit_layer_qfilters(dumps, st, 0, st.metas[0].n_layers, agg);
  fit_layer_kvzap(dumps, st, 0, st.metas[0].n_layers, agg);
  return assemble(dumps, st, agg, fit_layer_nuq(dumps, st, 0, st.metas[0].n_layers));
}

std::string render_calibration(const nlohmann::json& j) {
  const auto& s = j["summary"];
  const auto& p = j["params"];
  std::string out = fmt::format("{} allocation, target {} bits -> achieved {:.3f}; predicted summed error {:.4g}",
                                p["allocator"].get<std::string>(), p["target_bits"].get<double>(),
                                s["achieved_bits"].get<double>(), s["predicted_error"].get<double>());
  out += " (uniform:";
  for (const auto& [b, e] : s["uniform_predicted_error"].items()) out += fmt::format(" {} bits {:.4g}", b, e.get<double>());
  out += ")\n";
  const auto& sp = s["spearman_vs_error_at_lowest_bits"];
  out += fmt::format("Spearman rank correlation with the measured error at the lowest bits (key / value): "
                     "norm variance {:+.2f} / {:+.2f}, entropy {:+.2f} / {:+.2f}, outlier ratio {:+.2f} / {:+.2f}\n",
                     sp["norm_variance"]["key"].get<double>(), sp["norm_variance"]["value"].get<double>(),
                     sp["entropy"]["key"].get<double>(), sp["entropy"]["value"].get<double>(),
                     sp["outlier_ratio"]["key"].get<double>(), sp["outlier_ratio"]["value"].get<double>());
  const int lowest = json_i32(p["candidates"][0]);
  out += fmt::format("{:>5} {:>4} {:>6} {:>6} {:>11} {:>11} {:>10} {:>8} {:>8}\n", "layer", "head", "K bits",
                     "V bits", fmt::format("K err@{}", lowest), fmt::format("V err@{}", lowest), "norm var",
                     "entropy", "outliers");
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) {
      out += fmt::format("{:>5} {:>4} {:>6} {:>6} {:>11.4g} {:>11.4g} {:>10.4g} {:>8.3f} {:>8.2f}\n",
                         json_i32(l["layer"]), json_i32(h["head"]), json_i32(h["bits_key"]),
                         json_i32(h["bits_value"]), h["key_error"][std::to_string(lowest)].get<double>(),
                         h["value_error"][std::to_string(lowest)].get<double>(), h["norm_variance"].get<double>(),
                         h["entropy"].get<double>(), h["outlier_ratio"].get<double>());
    }
  }
  if (s.contains("types")) {
    const auto& t = s["types"];
    std::size_t w = 9;  // the longest type name (with a rotation: "q4_0+hadamard")
    for (const auto& l : j["layers"]) {
      for (const auto& h : l["heads"]) {
        for (const auto& name : h["ggml_types"]) w = std::max(w, name.get<std::string>().size());
      }
    }
    out += fmt::format("per-head cache types (method ggml --types), target {} -> achieved {:.3f} bits per element; "
                       "predicted summed error {:.4g}\n{:>5} {:>4} {:>{}} {:>{}}\n",
                       t["target_bits"].get<double>(), t["achieved_bits"].get<double>(), t["predicted_error"].get<double>(),
                       "layer", "head", "K type", w, "V type", w);
    for (const auto& l : j["layers"]) {
      for (const auto& h : l["heads"]) {
        out += fmt::format("{:>5} {:>4} {:>{}} {:>{}}\n", json_i32(l["layer"]), json_i32(h["head"]),
                           h["ggml_types"][0].get<std::string>(), w, h["ggml_types"][1].get<std::string>(), w);
      }
    }
  }
  if (j.contains("nuq")) {
    const auto& q = j["nuq"];
    std::string bits;
    for (const auto& b : q["bits"]) bits += (bits.empty() ? "" : ",") + std::to_string(json_i32(b));
    out += fmt::format("nuq codebooks (method nuq): bits {}, sparsity {}, sink {}, weights {}\n", bits,
                       q["sparsity"].get<double>(), json_uint(q["sink"]),
                       q["weights"].get<std::string>().substr(0, q["weights"].get<std::string>().find(':')));
  } else if (s.contains("nuq_not_fitted")) {
    out += "nuq codebooks not fitted: " + s["nuq_not_fitted"].get<std::string>() + "\n";
  }
  if (s.contains("kvzap")) {
    const auto& z = s["kvzap"];
    std::string r2;
    for (const auto& v : z["r2_per_layer"]) r2 += fmt::format(" {:.3f}", v.get<double>());
    out += fmt::format("KVzap surrogate (method kvzap): ridge alpha {} on {} rows of {} inputs; R^2 of log KVzip+ per "
                       "layer (mean over heads, on the fitted rows):{}\n",
                       p["kvzap_alpha"].get<double>(), json_uint(z["rows"]), json_uint(z["input_dim"]), r2);
  }
  return out;
}

}  // namespace akv
