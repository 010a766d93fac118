#include "akv/alloc/knapsack.h"
#include "akv/eval/calibrate.h"

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
#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/isa.h"
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

namespace akv {
namespace {

struct HeadMeasure {
  std::vector<double> key_err, value_err;  // [candidates]
  double norm_variance = 0, entropy = 0, outlier_ratio = 0;
  // max |x| of the head's keys and values as a cache stores them (rotated with --rotate): the
  // fp8 scales' source (max over dumps).
  double key_amax = 0, value_amax = 0;
  std::vector<double> norms;  // ||k_t|| in token order (for the streaming proxy)
  std::vector<double> qfilter;  // [head_dim]: the Q-Filter of every dump's queries (score/qfilter.h)
  std::optional<double> duo_error;  // a DuoAttention streaming head's attention error (unset: not measured)
  std::vector<double> type_key_err, type_value_err;  // [key types], [value types] (--types)
  std::vector<double> kvzap_weight;  // [input dim]: its KVzap surrogate (empty: not fitted)
  double kvzap_bias = 0, kvzap_r2 = 0;
};

// The --types lists: which types keys and values may take (names), and their layouts.
struct TypeLists {
  std::vector<std::string> key, value;  // as given ("q4_0", "q4_0+hadamard")
  std::vector<const GgmlTypeInfo*> key_info, value_info;
  std::vector<RotationKind> key_rotate, value_rotate;  // each type's rotation (its own or --rotate)
};

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

// Attention-output relative error of KV head h's query group when its keys and values are
// replaced by the rows `k2` / `v2` at positions `pos2` (every position when empty).
double attn_error(const Tensor3& q, const float* k, const float* v, const float* k2, const float* v2,
                  std::size_t h, const DumpMeta& m, const std::vector<std::size_t>& pos2 = {}) {
  std::vector<std::size_t> kpos(m.n_tokens), qpos(m.n_query);
  std::iota(kpos.begin(), kpos.end(), std::size_t{0});
  std::iota(qpos.begin(), qpos.end(), m.first_query_pos());
  const std::vector<std::size_t>& kpos2 = pos2.empty() ? kpos : pos2;
  double e = 0, n = 0;
  for (std::size_t qh = h * m.group_size(); qh < (h + 1) * m.group_size(); ++qh) {
    const AttentionInput a{q.row(qh, 0), k, v, m.n_query, m.n_tokens, m.head_dim, qpos.data(), kpos.data()};
    const AttentionInput b{q.row(qh, 0), k2, v2, m.n_query, kpos2.size(), m.head_dim, qpos.data(), kpos2.data()};
    const AttentionFidelity f = attention_fidelity(a, b);
    e += f.out_err2;
    n += f.out_norm2;
  }
  return n > 0 ? std::sqrt(e / n) : 0.0;
}

// The attention-output error of KV head h's query group as a DuoAttention streaming head: only
// the first `sinks` and the last `window` of its T > sinks + window tokens kept.
double streaming_error(const Tensor3& query, const float* k, const float* v, std::size_t h, const DumpMeta& m,
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
  return attn_error(query, k, v, ks.data(), vs.data(), h, m, pos);
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
  for (int b : o.candidates) {
    QuantParams p;
    p.method = Quantizer::kivi;
    p.key = {b, QuantAxis::channel, o.group};
    p.value = {b, QuantAxis::token, o.group};
    p.residual = o.residual;
    p.rule = o.rule;
    p.rotate = o.rotate;
    reconstruct_head(compress_head(in, p), {}, kq.data(), vq.data());
    r.key_err.push_back(attn_error(query, k, v, kq.data(), v, h, m));
    r.value_err.push_back(attn_error(query, k, v, k, vq.data(), h, m));
  }
  for (std::size_t i = 0; i < types.key_info.size(); ++i) {
    type_roundtrip(*types.key_info[i], types.key_rotate[i], true, k, T, d, kq.data());
    r.type_key_err.push_back(attn_error(query, k, v, kq.data(), v, h, m));
  }
  for (std::size_t i = 0; i < types.value_info.size(); ++i) {
    type_roundtrip(*types.value_info[i], types.value_rotate[i], false, v, T, d, vq.data());
    r.type_value_err.push_back(attn_error(query, k, v, k, vq.data(), h, m));
  }
  if (duo) r.duo_error = streaming_error(query, k, v, h, m, o.duo_sinks, o.duo_window);
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
  // Attention entropy of the window queries, mean over queries and the group's heads (f64).
  double ent = 0;
  std::size_t cnt = 0;
  std::vector<std::size_t> visible(m.n_query);
  for (std::size_t i = 0; i < m.n_query; ++i) visible[i] = m.first_query_pos() + i + 1;
  std::vector<double> p;
  for (std::size_t qh = h * m.group_size(); qh < (h + 1) * m.group_size(); ++qh) {
    const CausalBlock b{query.row(qh, 0), k, visible.data(), m.n_query, T, d};
    causal_logits_ref(b, [&](std::size_t, const double* s, std::size_t n) {
      p.resize(n);
      softmax(s, n, p.data());
      double e = 0;
      for (double x : p) {
        if (x > 0) e -= x * std::log(x);
      }
      ent += e;
      ++cnt;
    });
  }
  r.entropy = cnt ? ent / static_cast<double>(cnt) : 0.0;
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

}  // namespace

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const auto ra = ranks(a), rb = ranks(b);
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

namespace {

// Checked options (candidates sorted and unique) and the dumps' shapes.
struct Setup {
  CalibrateOptions opt;
  std::vector<DumpMeta> metas;
  bool duo = false;  // every dump longer than duo_sinks + duo_window: DuoAttention head scores measured
  bool nuq = false;  // nuq bits asked for and every dump has key_pre_rope: codebooks fitted
  bool fisher = false;  // every dump has key_fisher and value_fisher: the nuq fit's weights
  bool kvzap = false;   // every dump has attn_input and kvzip_plus: KVzap's surrogate fitted
  std::size_t kvzap_rows = 0;  // the rows of its fit (each dump's tokens after kvzap_sinks)
  TypeLists types;      // --types, split into key and value candidates
};

// KVQuant's codebooks of one layer: [bits index], keys per channel, values per token and KV head;
// or why they could not be fitted (every value an outlier: data too sparse or constant).
struct LayerNuq {
  std::vector<NuqCalibration> key, value;
  std::string failed;
};

Setup setup(const std::vector<std::string>& dumps, const CalibrateOptions& o) {
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
  Setup st;
  st.opt = o;
  st.opt.candidates = cand;
  std::sort(st.opt.nuq_bits.begin(), st.opt.nuq_bits.end());
  st.opt.nuq_bits.erase(std::unique(st.opt.nuq_bits.begin(), st.opt.nuq_bits.end()), st.opt.nuq_bits.end());
  st.nuq = !st.opt.nuq_bits.empty();
  st.fisher = true;
  st.kvzap = true;
  if (!(o.kvzap_alpha > 0 && std::isfinite(o.kvzap_alpha))) {
    throw InvalidInput("the KVzap ridge penalty must be > 0", {"", "--kvzap-alpha", format_number(o.kvzap_alpha)});
  }
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
  st.kvzap = st.kvzap && st.kvzap_rows > 0;
  st.duo = std::all_of(st.metas.begin(), st.metas.end(),
                       [&](const DumpMeta& m) { return m.n_tokens > o.duo_sinks + o.duo_window; });
  std::vector<std::string> names = o.types;
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) != names.end()) {
    throw InvalidInput("a cache type given twice", {"", "--types", *std::adjacent_find(names.begin(), names.end())});
  }
  for (const std::string& name : o.types) {
    const HeadType ht = parse_head_type(name, "", "--types");
    const GgmlTypeInfo& t = ggml_cache_type(ht.name, st.metas[0].head_dim, "", "--types");
    check_ggml_head_dim(t, st.metas[0].head_dim, "", "--types " + name + ": head_dim");
    const std::optional<TqType> tq = tq_type_of(t);
    if (!tq || tq->kind != TqKind::value) {
      st.types.key.push_back(name);
      st.types.key_info.push_back(&t);
      st.types.key_rotate.push_back(ht.rotate.value_or(o.rotate));
    }
    if (!tq || tq->kind == TqKind::value) {
      st.types.value.push_back(name);
      st.types.value_info.push_back(&t);
      st.types.value_rotate.push_back(ht.rotate.value_or(o.rotate));
    }
  }
  if (!o.types.empty() && (st.types.key.empty() || st.types.value.empty())) {
    throw InvalidInput("--types needs a type for keys and one for values (tqv* store values only, tq* keys only)",
                       {"", "--types", o.types.front()});
  }
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
            a.key_err[c] = std::max(a.key_err[c], hm[h].key_err[c]);
            a.value_err[c] = std::max(a.value_err[c], hm[h].value_err[c]);
          } else {
            a.key_err[c] += hm[h].key_err[c];
            a.value_err[c] += hm[h].value_err[c];
          }
        }
        if (a.duo_error) {
          a.duo_error = opt.aggregate == "max" ? std::max(*a.duo_error, *hm[h].duo_error) : *a.duo_error + *hm[h].duo_error;
        }
        for (const bool k : {true, false}) {
          std::vector<double>& to = k ? a.type_key_err : a.type_value_err;
          const std::vector<double>& from = k ? hm[h].type_key_err : hm[h].type_value_err;
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
        for (double& e : a.key_err) e /= nd;
        for (double& e : a.value_err) e /= nd;
        for (double& e : a.type_key_err) e /= nd;
        for (double& e : a.type_value_err) e /= nd;
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
    std::vector<std::string> failed(2 * B);
    parallel_for(2 * B, o.threads, [&](std::size_t i) {
      const int bits = o.nuq_bits[i % B];
      try {
        if (i < B) {
          ln.key[i] = calibrate_nuq(key.data(), rows, C, bits, true, o.nuq_sparsity, sinks, kwp);
        } else {
          ln.value[i - B] = calibrate_nuq(value.data(), rows, C, bits, false, o.nuq_sparsity, sinks, vwp, d);
        }
      } catch (const InvalidInput& e) {
        failed[i] = "layer " + std::to_string(l) + (i < B ? " keys: " : " values: ") + e.what();
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

std::size_t query_rows(const Setup& st) {
  std::size_t rows = 0;
  for (const DumpMeta& m : st.metas) rows += m.n_query;
  return rows;
}

// The allocation over every head and calib.json.
nlohmann::json assemble(const std::vector<std::string>& dumps, const Setup& st,
                        const std::vector<std::vector<HeadMeasure>>& agg, const std::vector<LayerNuq>& nuq) {
  const CalibrateOptions& opt = st.opt;
  const std::vector<int>& cand = opt.candidates;
  const DumpMeta& m0 = st.metas[0];
  const std::size_t L = m0.n_layers, H = m0.n_kv_heads, C = cand.size();
  // Assignment.
  std::vector<int> bk(L * H), bv(L * H);
  nlohmann::json history = nlohmann::json::array();
  if (opt.allocator == "measured") {
    std::vector<std::vector<double>> err;
    for (std::size_t i = 0; i < L * H; ++i) err.push_back(agg[i / H][i % H].key_err);
    for (std::size_t i = 0; i < L * H; ++i) err.push_back(agg[i / H][i % H].value_err);
    const long long budget = static_cast<long long>(std::floor(opt.target_bits * static_cast<double>(2 * L * H) + 1e-9));
    const auto pick = knapsack_min_error(err, cand, budget);
    for (std::size_t i = 0; i < L * H; ++i) {
      bk[i] = cand[pick[i]];
      bv[i] = cand[pick[L * H + i]];
    }
  } else {
    auto importance = [&](std::size_t upto) {
      std::vector<double> imp(L * H);
      for (std::size_t i = 0; i < L * H; ++i) {
        const HeadMeasure& a = agg[i / H][i % H];
        if (opt.allocator == "entropy") {
          imp[i] = a.entropy;
        } else {
          RunningMoments mom;  // first dump's norms, as a stream
          for (std::size_t t = 0; t < std::min(upto, a.norms.size()); ++t) mom.add(a.norms[t]);
          imp[i] = upto >= a.norms.size() ? a.norm_variance : mom.variance();
        }
      }
      return imp;
    };
    std::vector<int> bits;
    if (opt.allocator == "adakv-proxy" && opt.update_interval > 0) {
      for (std::size_t t = opt.update_interval; t <= m0.n_tokens; t += opt.update_interval) {
        bits = adakv_proxy_bits(importance(t), opt.target_bits, opt.lo, opt.mid, opt.hi);
        history.push_back({{"tokens", t}, {"bits", bits}});
      }
    }
    if (bits.empty()) bits = adakv_proxy_bits(importance(m0.n_tokens), opt.target_bits, opt.lo, opt.mid, opt.hi);
    bk = bits;
    bv = bits;
  }
  auto index_of = [&](int b) {
    const auto it = std::find(cand.begin(), cand.end(), b);
    return it == cand.end() ? std::size_t{0} : static_cast<std::size_t>(it - cand.begin());
  };
  // --types: each head's key type and value type, the least summed measured error within the
  // stored bits per element (multiple-choice knapsack, alloc/knapsack.h, on the bits above each
  // item's cheapest type: the all-cheapest choice always fits).
  const TypeLists& tl = st.types;
  const double types_target = opt.types_target_bits > 0 ? opt.types_target_bits : opt.target_bits;
  std::vector<std::size_t> tpick;
  std::vector<double> key_bits, value_bits;
  for (const GgmlTypeInfo* t : tl.key_info) key_bits.push_back(type_bits(*t));
  for (const GgmlTypeInfo* t : tl.value_info) value_bits.push_back(type_bits(*t));
  if (!tl.key.empty()) {
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
      err.push_back(agg[i / H][i % H].type_key_err);
      cost.push_back(kx);
    }
    for (std::size_t i = 0; i < L * H; ++i) {
      err.push_back(agg[i / H][i % H].type_value_err);
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
  }
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
      const double pe = in_set ? a.key_err[index_of(bk[i])] + a.value_err[index_of(bv[i])] : NAN;
      for (std::size_t c = 0; c < C; ++c) uniform[c] += a.key_err[c] + a.value_err[c];
      CalibrationHead ch;
      ch.key_error = a.key_err;
      ch.value_error = a.value_err;
      ch.norm_variance = a.norm_variance;
      ch.entropy = a.entropy;
      ch.outlier_ratio = a.outlier_ratio;
      ch.key_amax = a.key_amax;
      ch.value_amax = a.value_amax;
      ch.qfilter = a.qfilter;
      ch.duo_error = a.duo_error;
      ch.kvzap_weight = a.kvzap_weight;
      ch.kvzap_bias = a.kvzap_bias;
      ch.kvzap_r2 = a.kvzap_r2;
      ch.bits_key = bk[i];
      ch.bits_value = bv[i];
      if (std::isfinite(pe)) ch.predicted_error = pe;
      if (!tpick.empty()) {
        ch.type_key_error = a.type_key_err;
        ch.type_value_error = a.type_value_err;
        ch.type_key = tl.key[tpick[i]];
        ch.type_value = tl.value[tpick[L * H + i]];
        types_error += a.type_key_err[tpick[i]] + a.type_value_err[tpick[L * H + i]];
        types_bits += key_bits[tpick[i]] + value_bits[tpick[L * H + i]];
      }
      layer.push_back(ch);
      if (std::isfinite(pe)) predicted += pe;
      bits_sum += bk[i] + bv[i];
      nv.push_back(a.norm_variance);
      en.push_back(a.entropy);
      orat.push_back(a.outlier_ratio);
      ke.push_back(a.key_err[0]);
      ve.push_back(a.value_err[0]);
    }
  }
  for (const auto& d : dumps) f.dumps.emplace_back(d, file_hash(d));
  nlohmann::json uni = nlohmann::json::object();
  for (std::size_t c = 0; c < C; ++c) uni[std::to_string(cand[c])] = uniform[c];
  auto corr = [&](const std::vector<double>& p) {
    return nlohmann::json{{"key", spearman(p, ke)}, {"value", spearman(p, ve)}};
  };
  f.params = {{"candidates", cand}, {"group", opt.group}, {"residual", opt.residual},
              {"quant_rule", quant_rule_name(opt.rule)}, {"target_bits", opt.target_bits}, {"aggregate", opt.aggregate}, {"allocator", opt.allocator},
              {"lo_bit", opt.lo}, {"mid_bit", opt.mid}, {"hi_bit", opt.hi}, {"update_interval", opt.update_interval},
              {"duo_sinks", opt.duo_sinks}, {"duo_window", opt.duo_window}, {"nuq_bits", opt.nuq_bits},
              {"nuq_sparsity", opt.nuq_sparsity}, {"nuq_sink", opt.nuq_sink},
              {"error", "attention-output relative error of the head's query group, keys (or values) quantized "
                        "with the kivi layout, everything else exact"}};
  if (opt.rotate != RotationKind::none) f.params["rotate"] = rotation_name(opt.rotate);  // absent: none
  if (st.kvzap) {  // absent: no surrogate fitted
    f.params["kvzap_alpha"] = opt.kvzap_alpha;
    f.params["kvzap_sinks"] = opt.kvzap_sinks;
  }
  if (!tl.key.empty()) {
    f.params["types"] = opt.types;
    f.params["types_target_bits"] = types_target;
  }
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

constexpr const char* kCalibrationPart = "akv-calibration-part";

nlohmann::json options_json(const CalibrateOptions& o, bool kvzap) {
  nlohmann::json j = {{"candidates", o.candidates}, {"group", o.group}, {"residual", o.residual},
                      {"quant_rule", quant_rule_name(o.rule)}, {"target_bits", o.target_bits},
                      {"aggregate", o.aggregate}, {"allocator", o.allocator}, {"lo_bit", o.lo}, {"mid_bit", o.mid},
                      {"hi_bit", o.hi}, {"update_interval", o.update_interval}, {"duo_sinks", o.duo_sinks},
                      {"duo_window", o.duo_window}, {"nuq_bits", o.nuq_bits}, {"nuq_sparsity", o.nuq_sparsity},
                      {"nuq_sink", o.nuq_sink}};
  if (kvzap) {  // absent: no surrogate fitted
    j["kvzap_alpha"] = o.kvzap_alpha;
    j["kvzap_sinks"] = o.kvzap_sinks;
  }
  if (o.rotate != RotationKind::none) j["rotate"] = rotation_name(o.rotate);  // absent: none
  if (!o.types.empty()) {  // absent: none
    j["types"] = o.types;
    j["types_target_bits"] = o.types_target_bits;
  }
  return j;
}

}  // namespace

nlohmann::json calibrate_part(const std::vector<std::string>& dumps, const CalibrateOptions& o, const Shard& shard,
                              const ProgressFn& progress) {
  const Setup st = setup(dumps, o);
  const auto [lo, hi] = shard.range(st.metas[0].n_layers);
  auto agg = measure_layers(dumps, st, lo, hi, progress);
  fit_layer_qfilters(dumps, st, lo, hi, agg);
  fit_layer_kvzap(dumps, st, lo, hi, agg);
  const std::vector<LayerNuq> nuq = fit_layer_nuq(dumps, st, lo, hi);
  // Token norms only feed the streaming proxy (adakv-proxy with an update interval).
  const bool norms = st.opt.allocator == "adakv-proxy" && st.opt.update_interval > 0;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : agg) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadMeasure& a : layer) {
      heads.push_back({{"key_err", a.key_err}, {"value_err", a.value_err}, {"norm_variance", a.norm_variance},
                       {"entropy", a.entropy}, {"outlier_ratio", a.outlier_ratio},
                       {"key_amax", a.key_amax}, {"value_amax", a.value_amax}, {"qfilter", a.qfilter},
                       {"duo_error", a.duo_error ? nlohmann::json(*a.duo_error) : nlohmann::json(nullptr)},
                       {"norms", norms ? nlohmann::json(a.norms) : nlohmann::json::array()}});
      if (!st.types.key.empty()) {
        heads.back()["type_key_err"] = a.type_key_err;
        heads.back()["type_value_err"] = a.type_value_err;
      }
      if (st.kvzap) heads.back()["kvzap"] = {{"weight", a.kvzap_weight}, {"bias", a.kvzap_bias}, {"r2", a.kvzap_r2}};
    }
    layers.push_back(heads);
  }
  nlohmann::json nuq_layers = nlohmann::json::array();
  for (const LayerNuq& ln : nuq) {
    if (!ln.failed.empty()) {
      nuq_layers.push_back({{"failed", ln.failed}});
      continue;
    }
    nlohmann::json kl = nlohmann::json::array(), vl = nlohmann::json::array();
    for (std::size_t b = 0; b < ln.key.size(); ++b) {
      kl.push_back(ln.key[b].levels);
      vl.push_back(ln.value[b].levels);
    }
    nuq_layers.push_back({{"key_upper", ln.key.front().upper}, {"key_lower", ln.key.front().lower},
                          {"key_levels", kl}, {"value_levels", vl}});
  }
  nlohmann::json ds = nlohmann::json::array();
  for (const auto& d : dumps) ds.push_back({{"path", d}, {"hash", file_hash(d)}});
  return {{"format", kCalibrationPart}, {"version", 1}, {"shard", shard.k}, {"shards", shard.n},
          {"first_layer", lo}, {"n_layers", st.metas[0].n_layers}, {"dumps", ds}, {"options", options_json(st.opt, st.kvzap)},
          {"kernels", kernel_arithmetic()}, {"layers", layers}, {"nuq", nuq_layers}};
}

nlohmann::json merge_calibration_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order = shard_order(parts, kCalibrationPart, {"dumps", "options", "n_layers", "kernels"});
  const auto& [file0, first] = parts[0];
  std::vector<std::vector<HeadMeasure>> agg;
  std::vector<LayerNuq> nuq;
  std::vector<std::string> dumps;
  CalibrateOptions o;
  try {
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_layer", "layers", agg.size());
      for (const nlohmann::json& e : j.at("nuq")) {
        LayerNuq ln;
        if (e.contains("failed")) {
          ln.failed = e.at("failed").get<std::string>();
          nuq.push_back(std::move(ln));
          continue;
        }
        const std::vector<double> up = e.at("key_upper").get<std::vector<double>>(),
                                  lo = e.at("key_lower").get<std::vector<double>>();
        const nlohmann::json& kl = e.at("key_levels");
        const nlohmann::json& vl = e.at("value_levels");
        for (std::size_t b = 0; b < kl.size(); ++b) {
          NuqCalibration k, v;
          k.per_channel = true;
          k.upper = up;
          k.lower = lo;
          kl[b].get_to(k.levels);
          vl.at(b).get_to(v.levels);
          ln.key.push_back(std::move(k));
          ln.value.push_back(std::move(v));
        }
        nuq.push_back(std::move(ln));
      }
      for (const nlohmann::json& layer : j.at("layers")) {
        std::vector<HeadMeasure> heads;
        for (const nlohmann::json& h : layer) {
          HeadMeasure a;
          h.at("key_err").get_to(a.key_err);
          h.at("value_err").get_to(a.value_err);
          a.norm_variance = h.at("norm_variance").get<double>();
          a.entropy = h.at("entropy").get<double>();
          a.outlier_ratio = h.at("outlier_ratio").get<double>();
          a.key_amax = h.at("key_amax").get<double>();
          a.value_amax = h.at("value_amax").get<double>();
          h.at("qfilter").get_to(a.qfilter);
          if (!h.at("duo_error").is_null()) a.duo_error = h.at("duo_error").get<double>();
          h.at("norms").get_to(a.norms);
          if (h.contains("type_key_err")) {
            h.at("type_key_err").get_to(a.type_key_err);
            h.at("type_value_err").get_to(a.type_value_err);
          }
          if (h.contains("kvzap")) {
            h.at("kvzap").at("weight").get_to(a.kvzap_weight);
            a.kvzap_bias = h.at("kvzap").at("bias").get<double>();
            a.kvzap_r2 = h.at("kvzap").at("r2").get<double>();
          }
          heads.push_back(std::move(a));
        }
        agg.push_back(std::move(heads));
      }
    }
    for (const nlohmann::json& d : first.at("dumps")) dumps.push_back(d.at("path").get<std::string>());
    const nlohmann::json& op = first.at("options");
    o.candidates.clear();
    for (const std::int32_t b : json_i32s(op.at("candidates"))) o.candidates.push_back(b);
    o.group = json_uint(op.at("group"));
    o.residual = json_uint(op.at("residual"));
    o.rule = parse_quant_rule(op.at("quant_rule").get<std::string>());
    if (op.contains("rotate")) o.rotate = parse_rotation(op.at("rotate").get<std::string>(), file0, "options.rotate");
    o.target_bits = op.at("target_bits").get<double>();
    o.aggregate = op.at("aggregate").get<std::string>();
    o.allocator = op.at("allocator").get<std::string>();
    o.lo = json_i32(op.at("lo_bit"));
    o.mid = json_i32(op.at("mid_bit"));
    o.hi = json_i32(op.at("hi_bit"));
    o.update_interval = json_uint(op.at("update_interval"));
    o.duo_sinks = json_uint(op.at("duo_sinks"));
    o.duo_window = json_uint(op.at("duo_window"));
    o.nuq_bits.clear();
    for (const std::int32_t b : json_i32s(op.at("nuq_bits"))) o.nuq_bits.push_back(b);
    o.nuq_sparsity = op.at("nuq_sparsity").get<double>();
    o.nuq_sink = json_uint(op.at("nuq_sink"));
    if (op.contains("kvzap_alpha")) {
      o.kvzap_alpha = op.at("kvzap_alpha").get<double>();
      o.kvzap_sinks = json_uint(op.at("kvzap_sinks"));
    }
    if (op.contains("types")) {
      op.at("types").get_to(o.types);
      o.types_target_bits = op.at("types_target_bits").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(std::string("partial calibration field missing or of the wrong type: ") + e.what(), {file0});
  }
  const Setup st = setup(dumps, o);
  for (std::size_t i = 0; i < dumps.size(); ++i) {
    const std::string hash = file_hash(dumps[i]);
    if (hash != first["dumps"][i]["hash"].get<std::string>()) {
      throw InvalidInput("dump changed since the shards read it", {dumps[i], "hash", hash});
    }
  }
  if (agg.size() != st.metas[0].n_layers) {
    throw InvalidInput("parts hold " + std::to_string(agg.size()) + " layers, the dumps " + std::to_string(st.metas[0].n_layers),
                       {file0, "n_layers", std::to_string(st.metas[0].n_layers)});
  }
  const std::size_t C = st.metas[0].n_kv_heads * st.metas[0].head_dim;
  if (nuq.size() != (st.nuq ? agg.size() : 0)) {
    throw InvalidInput(st.nuq ? "parts without every layer's nuq codebooks" : "nuq codebooks the dumps cannot give",
                       {file0, "nuq", std::to_string(nuq.size())});
  }
  for (LayerNuq& ln : nuq) {
    if (!ln.failed.empty()) continue;
    if (ln.key.size() != st.opt.nuq_bits.size() || ln.key.front().upper.size() != C || ln.key.front().lower.size() != C) {
      throw InvalidInput("a layer's nuq codebooks do not match the options and shape", {file0, "nuq"});
    }
    for (std::size_t b = 0; b < ln.key.size(); ++b) {
      ln.key[b].bits = ln.value[b].bits = st.opt.nuq_bits[b];
      if (ln.key[b].levels.size() != (std::size_t{1} << ln.key[b].bits) ||
          ln.value[b].levels.size() != (std::size_t{1} << ln.value[b].bits)) {
        throw InvalidInput("nuq levels must be 2^bits values", {file0, "nuq.key_levels", std::to_string(ln.key[b].levels.size())});
      }
    }
  }
  for (const auto& layer : agg) {
    if (layer.size() != st.metas[0].n_kv_heads) throw InvalidInput("a layer without every KV head", {file0, "layers", std::to_string(layer.size())});
    for (const HeadMeasure& a : layer) {
      if (a.type_key_err.size() != st.types.key.size() || a.type_value_err.size() != st.types.value.size()) {
        throw InvalidInput("a head without every type's error", {file0, "type_key_err", std::to_string(a.type_key_err.size())});
      }
      if (a.key_err.size() != st.opt.candidates.size() || a.value_err.size() != st.opt.candidates.size()) {
        throw InvalidInput("a head without every candidate's error", {file0, "key_err", std::to_string(a.key_err.size())});
      }
      if (a.duo_error.has_value() != st.duo) {
        throw InvalidInput(st.duo ? "a head without its DuoAttention score" : "a DuoAttention score the dumps are too short for",
                           {file0, "duo_error"});
      }
      if (a.kvzap_weight.empty() == st.kvzap) {
        throw InvalidInput(st.kvzap ? "a head without its KVzap surrogate" : "a KVzap surrogate the dumps cannot give",
                           {file0, "kvzap"});
      }
      if (a.qfilter.size() != st.metas[0].head_dim) {
        throw InvalidInput("a head's Q-Filter is not head_dim long", {file0, "qfilter", std::to_string(a.qfilter.size())});
      }
    }
  }
  return assemble(dumps, st, agg, nuq);
}

nlohmann::json calibrate(const std::vector<std::string>& dumps, const CalibrateOptions& o,
                         const ProgressFn& progress) {
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
