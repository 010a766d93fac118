#include "akv/attention/partition.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "akv/tensor/fp8.h"

namespace akv::attn {
namespace {

// The largest |a[i]| and |b[i]| for i < n into ma and mb (both >= 0 on entry); false when some
// value is not finite. Eight at a time where AVX is there: for value rows it runs once per decode
// step over every row.
bool finite_maxima(const float* a, const float* b, std::size_t n, float& ma, float& mb) {
  std::size_t i = 0;
  unsigned bad = 0;
#ifdef __AVX__
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  __m256 va = _mm256_setzero_ps(), vb = _mm256_setzero_ps(), vbad = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_andnot_ps(sign, _mm256_loadu_ps(a + i)), y = _mm256_andnot_ps(sign, _mm256_loadu_ps(b + i));
    va = _mm256_max_ps(va, x);  // a NaN lane keeps va; vbad flags it
    vb = _mm256_max_ps(vb, y);
    vbad = _mm256_or_ps(vbad, _mm256_or_ps(_mm256_cmp_ps(x, big, _CMP_NLE_UQ), _mm256_cmp_ps(y, big, _CMP_NLE_UQ)));
  }
  alignas(32) float la[8], lb[8];
  _mm256_store_ps(la, va);
  _mm256_store_ps(lb, vb);
  for (int k = 0; k < 8; ++k) {
    ma = std::max(ma, la[k]);
    mb = std::max(mb, lb[k]);
  }
  bad = static_cast<unsigned>(_mm256_movemask_ps(vbad));
#endif
  for (; i < n; ++i) {
    ma = std::max(ma, std::fabs(a[i]));
    mb = std::max(mb, std::fabs(b[i]));
    bad |= static_cast<unsigned>(!std::isfinite(a[i])) | static_cast<unsigned>(!std::isfinite(b[i]));
  }
  return bad == 0;
}

NuqPrep prepare_nuq(const NuqView& v, std::size_t d) {
  NuqPrep np;
  const NuqTable& t = *v.table;
  if (t.bits < 2 || t.bits > 4 || t.levels.size() != (std::size_t{1} << t.bits) || d % 8 != 0) return np;
  attn::level_table(t.levels.data(), t.bits, np.levels);
  if (t.per_channel) {
    nuq_channel_params(t, d, np.offset, np.range);
    np.zero.resize(d);
    for (std::size_t c = 0; c < d; ++c) np.zero[c] = np.levels[0] * np.range[c] + np.offset[c];
  }
  const std::size_t coded = v.rows - v.sink_rows;
  const float* rg = t.per_channel ? np.range.data() : v.range;
  const float* off = t.per_channel ? np.offset.data() : v.offset;
  const std::size_t n = t.per_channel ? d : coded;
  float level = 0, r = 0, o = 0;
  for (const float x : t.levels) level = std::max(level, std::fabs(x));
  const bool finite = finite_maxima(rg, off, n, r, o);
  np.fused = finite && std::isfinite(level) && static_cast<double>(level) * r + o < 1e38;
  return np;
}

// q, qsum: the query heads (scaled) and their sums, for 1-bit levels' weights.
TqPrep prepare_tq(const GgmlRowsView& g, std::size_t d, bool key, const std::vector<float>& q,
                  const std::vector<float>& qsum) {
  TqPrep tp;
  const auto t = g.type && g.rows > 0 ? tq_type_of(*g.type) : std::nullopt;
  if (!t || t->head_dim != d || d % 8 != 0 || (!key && t->kind == TqKind::key_qjl)) return tp;
  const int b = tq_code_bits(*t);
  if (b == 1) {  // key_qjl's 1-bit levels
    const TqCodebook& cb = tq_codebook(d, 1);
    const float c0 = cb.centroids[0], step = cb.centroids[1] - c0;
    std::vector<float> w1(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) w1[i] = q[i] * step;
    for (const float s : qsum) tp.bias1.push_back(c0 * s);
    tp.w1_tables.emplace(w1.data(), d, qsum.size(), d);
  } else if (t->kind == TqKind::value) {
    tp.format = attn::code_format(b);
  } else {
    const TqCodebook& cb = tq_codebook(d, b);
    tp.format = attn::level_format(b);
    attn::level_table(cb.centroids.data(), b, tp.levels);
    if (!key && t->kind == TqKind::key_nc) tp.ones.assign(d, 1.0f);
  }
  tp.type = t;
  return tp;
}

Fp8Prep prepare_fp8(const GgmlRowsView& g, std::size_t d) {
  Fp8Prep fp;
  const auto f = g.type && g.rows > 0 && d % 8 == 0 ? fp8_format_of(*g.type) : std::nullopt;
  if (!f) return fp;
  fp.format = *f == Fp8Format::e4m3 ? RowFormat::e4m3 : RowFormat::e5m2;
  fp.scale = g.scale;
  return fp;
}

}  // namespace

HeadPrep prepare_head(const DecodeAttentionArgs& a, std::size_t kv, std::size_t seg) {
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim;
  HeadPrep hp;
  hp.view = &a.heads[kv * a.segments + seg];
  hp.q.assign(a.query + kv * nq * d, a.query + (kv + 1) * nq * d);
  for (float& x : hp.q) x *= a.scale;
  if (const GgmlTypeInfo* kt = hp.view->key.ggml.type) {
    if (const auto t = tq_type_of(*kt); t && t->kind == TqKind::key_qjl && hp.view->key.ggml.rows > 0) {
      hp.qjl = t;
      for (std::size_t h = 0; h < nq; ++h) hp.qjl_query.push_back(tq_qjl_query(*t, hp.q.data() + h * d, false));
      std::vector<float> sq(nq * d);  // the heads' S q side by side
      for (std::size_t h = 0; h < nq; ++h) std::copy_n(hp.qjl_query[h].sq.data(), d, sq.data() + h * d);
      hp.qjl_signs.emplace(sq.data(), d, nq, d);
    }
  }
  if (const NuqView& k = hp.view->key.nuq; k.table && k.rows > k.sink_rows) {
    hp.nuq_key = prepare_nuq(k, d);
    if (hp.nuq_key.fused && k.table->per_channel) {  // w = q x range, bias = q . offset
      hp.nuq_w.resize(nq * d);
      hp.nuq_bias.assign(nq, 0.0f);
      for (std::size_t h = 0; h < nq; ++h) {
        for (std::size_t c = 0; c < d; ++c) {
          hp.nuq_w[h * d + c] = hp.q[h * d + c] * hp.nuq_key.range[c];
          hp.nuq_bias[h] += hp.q[h * d + c] * hp.nuq_key.offset[c];
        }
      }
    }
  }
  hp.qsum.assign(nq, 0.0f);
  for (std::size_t h = 0; h < nq; ++h) {
    for (std::size_t c = 0; c < d; ++c) hp.qsum[h] += hp.q[h * d + c];
  }
  hp.tq_key = prepare_tq(hp.view->key.ggml, d, true, hp.q, hp.qsum);
  hp.tq_value = prepare_tq(hp.view->value.ggml, d, false, hp.q, hp.qsum);
  hp.fp8_key = prepare_fp8(hp.view->key.ggml, d);
  hp.fp8_value = prepare_fp8(hp.view->value.ggml, d);
  if (hp.fp8_key.set()) {
    hp.fp8_w = hp.q;
    for (float& x : hp.fp8_w) x *= hp.fp8_key.scale;
  }
  if (const NuqView& v = hp.view->value.nuq; v.table && v.rows > v.sink_rows) hp.nuq_value = prepare_nuq(v, d);
  const PackedView& p = hp.view->key.packed;
  if (p.rows > 0 && fast_packed_keys(p)) {
    hp.q_in.resize(nq * p.cols);
    hp.q_out.resize(nq * p.n_outliers);
    for (std::size_t h = 0; h < nq; ++h) {
      for (std::size_t c = 0, i = 0, o = 0; c < d; ++c) {
        if (o < p.n_outliers && p.outlier_channel[o] == c) {
          hp.q_out[h * p.n_outliers + o++] = hp.q[h * d + c];
        } else {
          hp.q_in[h * p.cols + i++] = hp.q[h * d + c];
        }
      }
    }
  }
  return hp;
}

}  // namespace akv::attn
