#include "akv/attention/partition.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE__) || defined(__AVX__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "akv/attention/int8.h"
#include "akv/core/checked.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"

namespace akv::attn {
namespace {

std::size_t elem_bytes(DenseType t) { return t == DenseType::f32 ? 4 : 2; }
RowFormat dense_format(DenseType t) { return t == DenseType::f32 ? RowFormat::f32 : RowFormat::f16; }

bool fast_packed_values(const PackedView& p) {
  return p.axis == QuantAxis::token && p.cols % 8 == 0 && p.group % 8 == 0 && p.n_outliers == 0;
}
// Per-token keys the code loops read group by group (token_keys): the same layout.
bool fast_token_keys(const PackedView& p) { return fast_packed_values(p); }
// Per-channel values the code loops read token group by token group (channel_values).
bool fast_channel_values(const PackedView& p) {
  return p.axis == QuantAxis::channel && p.cols % 8 == 0 && p.n_outliers == 0;
}

bool int8_codes(const PackedView& p) {
  return attn::int8_format(attn::code_format(p.bits)) && p.cols % attn::kInt8Block == 0;
}
bool int8_keys(const PackedView& p, AttentionMode m) {
  return m == AttentionMode::int8 && fast_packed_keys(p) && int8_codes(p);
}
bool int8_values(const PackedView& p, AttentionMode m) {
  return m == AttentionMode::int8 && fast_packed_values(p) && int8_codes(p) && p.group % attn::kInt8Block == 0;
}

// range[r] *= 1 / sqrt(sq[r] + 1e-16) for r < n (sq >= 0): eight at a time where AVX is
// there (the same correctly rounded operations as the plain loop, which std::sqrt's errno keeps
// from being vectorized).
void inverse_norms(const float* sq, std::size_t n, float* range) {
  std::size_t r = 0;
#ifdef __AVX__
  const __m256 one = _mm256_set1_ps(1.0f), eps = _mm256_set1_ps(1e-16f);
  for (; r + 8 <= n; r += 8) {
    const __m256 inv = _mm256_div_ps(one, _mm256_sqrt_ps(_mm256_add_ps(_mm256_loadu_ps(sq + r), eps)));
    _mm256_storeu_ps(range + r, _mm256_mul_ps(_mm256_loadu_ps(range + r), inv));
  }
#endif
  for (; r < n; ++r) range[r] *= 1.0f / std::sqrt(sq[r] + 1e-16f);
}

// out[i * nq + h] = p[h * ps + i] for i < n, h < nq: n rows' probabilities of nq heads, row-major
// (the coefficient layout of accumulate_rows). Four heads by four rows at a time, then pairs of
// heads (SSE; plain copies otherwise): the strided scalar stores of the plain loop cost a nuq
// tile as much as its outlier corrections.
void transpose_heads(const float* p, std::size_t ps, std::size_t n, std::size_t nq, float* out) {
  std::size_t h = 0;
#ifdef __SSE__
  for (; h + 4 <= nq; h += 4) {
    const float *p0 = p + h * ps, *p1 = p0 + ps, *p2 = p1 + ps, *p3 = p2 + ps;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      __m128 r0 = _mm_loadu_ps(p0 + i), r1 = _mm_loadu_ps(p1 + i), r2 = _mm_loadu_ps(p2 + i),
             r3 = _mm_loadu_ps(p3 + i);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      float* o = out + i * nq + h;
      _mm_storeu_ps(o, r0);
      _mm_storeu_ps(o + nq, r1);
      _mm_storeu_ps(o + 2 * nq, r2);
      _mm_storeu_ps(o + 3 * nq, r3);
    }
    for (; i < n; ++i) {
      for (std::size_t k = 0; k < 4; ++k) out[i * nq + h + k] = p[(h + k) * ps + i];
    }
  }
  for (; h + 2 <= nq; h += 2) {
    const float *p0 = p + h * ps, *p1 = p0 + ps;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const __m128 r0 = _mm_loadu_ps(p0 + i), r1 = _mm_loadu_ps(p1 + i);
      const __m128 lo = _mm_unpacklo_ps(r0, r1), hi = _mm_unpackhi_ps(r0, r1);
      float* o = out + i * nq + h;
      _mm_storel_pi(reinterpret_cast<__m64*>(o), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(o + nq), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(o + 2 * nq), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(o + 3 * nq), hi);
    }
    for (; i < n; ++i) {
      out[i * nq + h] = p0[i];
      out[i * nq + h + 1] = p1[i];
    }
  }
#endif
  for (; h < nq; ++h) {
    for (std::size_t i = 0; i < n; ++i) out[i * nq + h] = p[h * ps + i];
  }
}

// Whether n e4m3 bytes hold a NaN code (S.1111.111), which the e4m3 loads do not read as NaN.
bool has_e4m3_nan(const std::uint8_t* x, std::size_t n) {
  std::uint8_t m = 0;  // the largest magnitude code (byte lanes: the loop vectorizes)
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, static_cast<std::uint8_t>(x[i] & 0x7F));
  return m == 0x7F;
}

class PartitionRunner {
 public:
  PartitionRunner(const HeadPrep& hp, std::size_t nq, std::size_t d, std::size_t tile, AttentionMode mode, float softcap)
      : hp_(hp), nq_(nq), d_(d), tile_(tile), mode_(mode), softcap_(softcap), s_(nq * tile), p_(nq * tile) {}

  // Rows [a, b) of the view; `visible` and `first` (or nullptr): per query head, the rows it sees
  // ([first, visible)), counted in the view from row -offset (the KV head's earlier segments).
  void run(std::size_t a, std::size_t b, Partial& out, float* const* raw, const std::size_t* visible = nullptr,
           std::size_t offset = 0, const std::size_t* first = nullptr) {
    out.m.assign(nq_, -std::numeric_limits<float>::infinity());
    out.l.assign(nq_, 0.0f);
    out.acc.assign(nq_ * d_, 0.0f);
    for (std::size_t t0 = a; t0 < b; t0 += tile_) {
      const std::size_t t1 = std::min(b, t0 + tile_), n = t1 - t0;
      keys(t0, t1);
      for (std::size_t h = 0; h < nq_; ++h) {
        float* s = s_.data() + h * tile_;
        if (softcap_ != 0.0f) {
          for (std::size_t j = 0; j < n; ++j) s[j] = softcap_ * std::tanh(s[j] / softcap_);
        }
        // The tile's rows the head sees (visible): the first nv; the others get probability 0,
        // and a tile it sees none of leaves its running max, sum and outputs as they are.
        // From `first`, rows before the head's first one likewise.
        std::size_t nv = n, lo = 0;
        if (visible) {
          const std::size_t seen = visible[h] > offset ? visible[h] - offset : 0;
          nv = seen > t0 ? std::min(n, seen - t0) : 0;
        }
        if (first) {
          const std::size_t from = first[h] > offset ? first[h] - offset : 0;
          lo = std::min(nv, from > t0 ? from - t0 : 0);
        }
        if (visible || first) {
          float* p = p_.data() + h * tile_;
          std::fill(p, p + lo, 0.0f);
          std::fill(p + nv, p + n, 0.0f);
          if (lo == nv) continue;
        }
        if (raw && raw[h]) std::copy(s, s + n, raw[h] + t0);
        const float mt = attn::max_value(s + lo, nv - lo);
        const float m_new = std::max(out.m[h], mt);
        const float sum = attn::exp_weights(s + lo, m_new, nv - lo, p_.data() + h * tile_ + lo);
        const float corr = std::isinf(out.m[h]) ? 0.0f : std::exp(out.m[h] - m_new);
        out.l[h] = out.l[h] * corr + sum;
        if (corr != 1.0f) {
          for (std::size_t c = 0; c < d_; ++c) out.acc[h * d_ + c] *= corr;
          if (!acc_t_.empty()) {
            for (std::size_t c = 0; c < d_; ++c) acc_t_[c * nq_ + h] *= corr;
          }
        }
        out.m[h] = m_new;
      }
      values(t0, t1, out.acc.data());
    }
    if (!acc_t_.empty()) {  // the nuq value outliers' sums, channel-major
      for (std::size_t h = 0; h < nq_; ++h) {
        for (std::size_t c = 0; c < d_; ++c) out.acc[h * d_ + c] += acc_t_[c * nq_ + h];
      }
      acc_t_.clear();
    }
  }

 private:
  void keys(std::size_t t0, std::size_t t1) {
    const TensorView& k = hp_.view->key;
    if (hp_.tq_key.type && tq_keys(t0, t1)) return;
    if (hp_.fp8_key.set() && fp8_keys(t0, t1)) return;
    if (hp_.qjl) {
      qjl_keys(t0, t1);
      return;
    }
    if (k.nuq.table && hp_.nuq_key.fused) {
      nuq_keys(t0, t1);
      return;
    }
    if (const auto rows = ggml_rows(k.ggml, t0, t1)) {
      attn::score_rows(*rows, nq_, hp_.q.data(), d_, nullptr, s_.data(), tile_);
      return;
    }
    if (k.ggml.type || k.nuq.table) {
      decoded_tile(k, t0, t1);
      attn::score_rows(f32_rows(t1 - t0), nq_, hp_.q.data(), d_, nullptr, s_.data(), tile_);
      return;
    }
    const PackedView& p = k.packed;
    const std::size_t e = std::min(t1, p.rows);
    if (t0 < e) {
      if (fast_packed_keys(p)) {
        packed_keys(t0, e, t0);
      } else if (fast_token_keys(p)) {
        token_keys(t0, e, t0);
      } else {
        generic_scores(k, t0, e, t0);
      }
    }
    const std::size_t r0 = std::max(t0, p.rows);
    if (r0 < t1) {
      if (d_ % 8 == 0) {
        const std::size_t eb = elem_bytes(k.dense.type), stride = d_ * eb;
        const Rows rows{dense_format(k.dense.type),
                        static_cast<const std::uint8_t*>(k.dense.data) + (r0 - p.rows) * stride, stride,
                        t1 - r0, d_ / 8};
        attn::score_rows(rows, nq_, hp_.q.data(), d_, nullptr, s_.data() + (r0 - t0), tile_);
      } else {
        generic_scores(k, r0, t1, t0);
      }
    }
  }

  // Per-channel packed keys, token group by token group: w = q * scale, bias = q . zero.
  void packed_keys(std::size_t r, std::size_t e, std::size_t t0) {
    const PackedView& p = hp_.view->key.packed;
    const std::size_t stride = p.cols * static_cast<std::size_t>(p.bits) / 8;
    while (r < e) {
      const std::size_t g = r / p.group, ge = std::min(e, (g + 1) * p.group);
      if (g != group_) load_key_group(g);
      const Rows rows{attn::code_format(p.bits), p.codes + r * stride, stride, ge - r, p.cols / 8};
      float* s = s_.data() + (r - t0);
      if (int8_keys(p, mode_)) {
        attn::score_rows_int8(rows, w8_, bias_.data(), s, tile_);
      } else {
        attn::score_rows(rows, nq_, w_.data(), p.cols, bias_.data(), s, tile_);
      }
      if (p.n_outliers > 0) {
        for (std::size_t i = r; i < ge; ++i) {
          const std::uint16_t* o = p.outlier_value + i * p.n_outliers;
          for (std::size_t h = 0; h < nq_; ++h) {
            float add = 0.0f;
            for (std::size_t j = 0; j < p.n_outliers; ++j) add += hp_.q_out[h * p.n_outliers + j] * f16_to_f32_ref(o[j]);
            s[h * tile_ + (i - r)] += add;
          }
        }
      }
      r = ge;
    }
  }

  // Per-token packed keys (a scale and a zero per row and group of channels): each group's dot
  // products by the code loops against the query's slice of the group (tok_s_ [nq, rows]), then
  // per row s = the sum over the groups, in order, of scale x dot + zero x (the slice's sum of q).
  void token_keys(std::size_t r0, std::size_t r1, std::size_t t0) {
    const PackedView& p = hp_.view->key.packed;
    const std::size_t n = r1 - r0, ng = ceil_div(p.cols, p.group), bits = static_cast<std::size_t>(p.bits);
    const std::size_t stride = p.cols * bits / 8;
    if (tok_qs_.empty()) {  // each query head's sum over each group's channels
      tok_qs_.assign(nq_ * ng, 0.0f);
      for (std::size_t h = 0; h < nq_; ++h) {
        for (std::size_t c = 0; c < p.cols; ++c) tok_qs_[h * ng + c / p.group] += hp_.q[h * d_ + c];
      }
    }
    tok_s_.resize(nq_ * n);
    tok_f_.resize(4 * n * ng);
    float* row_major = tok_f_.data();  // scales then zeros, [rows, groups] as stored
    float* scale = row_major + 2 * n * ng;  // group-major, [groups, rows]
    float* zero = scale + n * ng;
    f16_to_f32(p.scale + r0 * ng, row_major, n * ng);
    f16_to_f32(p.zero + r0 * ng, row_major + n * ng, n * ng);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t g = 0; g < ng; ++g) {
        scale[g * n + i] = row_major[i * ng + g];
        zero[g * n + i] = row_major[n * ng + i * ng + g];
      }
    }
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t c0 = g * p.group, width = std::min(p.group, p.cols - c0);
      const Rows rows{attn::code_format(p.bits), p.codes + r0 * stride + c0 * bits / 8, stride, n, width / 8};
      attn::score_rows(rows, nq_, hp_.q.data() + c0, d_, nullptr, tok_s_.data(), n);
      const float* sc = scale + g * n;
      const float* z = zero + g * n;
      for (std::size_t h = 0; h < nq_; ++h) {
        const float qs = tok_qs_[h * ng + g];
        const float* dot = tok_s_.data() + h * n;
        float* s = s_.data() + h * tile_ + (r0 - t0);
        if (g == 0) {
          for (std::size_t i = 0; i < n; ++i) s[i] = sc[i] * dot[i] + z[i] * qs;
        } else {
          for (std::size_t i = 0; i < n; ++i) s[i] += sc[i] * dot[i] + z[i] * qs;
        }
      }
    }
  }

  void load_key_group(std::size_t g) {
    const PackedView& p = hp_.view->key.packed;
    w_.resize(nq_ * p.cols);
    bias_.resize(nq_);
    attn::key_weights(hp_.q_in.data(), nq_, p.cols, p.scale + g * p.cols, p.zero + g * p.cols, w_.data(), bias_.data());
    if (int8_keys(p, mode_)) attn::quantize_weights_int8(w_.data(), nq_, p.cols, attn::code_format(p.bits), w8_);
    group_ = g;
  }

  // Scores of rows [r0, r1) (tile starting at t0) from a dequantized copy of those rows.
  void generic_scores(const TensorView& k, std::size_t r0, std::size_t r1, std::size_t t0) {
    buf_.resize((r1 - r0) * d_);
    dequantize_rows(k, d_, r0, r1, buf_.data());
    for (std::size_t r = r0; r < r1; ++r) {
      const float* x = buf_.data() + (r - r0) * d_;
      for (std::size_t h = 0; h < nq_; ++h) {
        float acc = 0.0f;
        for (std::size_t c = 0; c < d_; ++c) acc += hp_.q[h * d_ + c] * x[c];
        s_[h * tile_ + (r - t0)] = acc;
      }
    }
  }

  // TurboQuant keys with QJL signs the level loops do not read (1-bit levels, a non-finite f16
  // field): q . x_mse over the rows' decoded levels, plus each row's QJL term
  // from the query's sign tables (tq_qjl_add_scores), not the d x d reconstruction.
  void qjl_keys(std::size_t t0, std::size_t t1) {
    const TqType& t = *hp_.qjl;
    const std::uint8_t* rows = hp_.view->key.ggml.blocks + t0 * tq_row_bytes(t);
    buf_.resize((t1 - t0) * d_);
    tq_qjl_decode_levels(t, rows, t1 - t0, buf_.data());
    attn::score_rows(f32_rows(t1 - t0), nq_, hp_.q.data(), d_, nullptr, s_.data(), tile_);
    if (qjl_tables_.empty()) {  // the sign tables, for this fallback only
      for (std::size_t h = 0; h < nq_; ++h) qjl_tables_.push_back(tq_qjl_query(t, hp_.q.data() + h * d_));
    }
    tq_qjl_add_scores(t, qjl_tables_.data(), nq_, rows, t1 - t0, s_.data(), tile_);
  }

  // nuq rows [t0, t1) of a view: f16 sink rows as such, coded rows through the level loops (the
  // value of a code in f32, levels[code] x range + offset, not rounded to f16 as nuq_decode
  // rounds it): coded(rows, first) for the kernel's rows, first = their offset from t0;
  // sink(rows, first) for the sink rows. The coded rows' outliers: nuq_outliers.
  template <class Coded, class Sink>
  void nuq_rows(const NuqView& v, const NuqPrep& np, std::size_t t0, std::size_t t1, Coded&& coded, Sink&& sink) {
    const std::size_t se = std::min(t1, v.sink_rows);
    if (t0 < se) {
      sink(Rows{RowFormat::f16, reinterpret_cast<const std::uint8_t*>(v.sink + t0 * d_), 2 * d_, se - t0, d_ / 8}, 0);
    }
    const std::size_t r0 = std::max(t0, v.sink_rows);
    if (r0 >= t1) return;
    const NuqTable& t = *v.table;
    const RowFormat f = attn::level_format(t.bits);
    const std::size_t stride = packed_size(d_, t.bits), q0 = r0 - v.sink_rows, q1 = t1 - v.sink_rows;
    // The level loops read up to 4 bytes from a chunk's first: the view's last row from a
    // padded copy.
    const std::size_t last = v.rows - v.sink_rows - 1, in_place = q1 > last ? last : q1;
    if (q0 < in_place) coded(Rows{f, v.codes + q0 * stride, stride, in_place - q0, d_ / 8, np.levels}, r0 - t0);
    if (q1 > last && q0 <= last) {
      pad_.assign(stride + 8, 0);
      std::copy_n(v.codes + last * stride, stride, pad_.data());
      coded(Rows{f, pad_.data(), stride, 1, d_ / 8, np.levels}, last + v.sink_rows - t0);
    }
  }

  // fn(std::integral_constant<std::size_t, NQ>{}): NQ = nq_ for 1, 2, 4 and 8 query heads (loops
  // of a known count), 0 otherwise.
  template <class Fn>
  void with_heads(Fn&& fn) const {
    switch (nq_) {
      case 1: return fn(std::integral_constant<std::size_t, 1>{});
      case 2: return fn(std::integral_constant<std::size_t, 2>{});
      case 4: return fn(std::integral_constant<std::size_t, 4>{});
      case 8: return fn(std::integral_constant<std::size_t, 8>{});
      default: return fn(std::integral_constant<std::size_t, 0>{});
    }
  }

  // The outliers of the coded rows among [t0, t1): [first, end) of the view's outlier arrays.
  static std::pair<std::uint32_t, std::uint32_t> outlier_span(const NuqView& v, std::size_t t0, std::size_t t1) {
    const std::size_t r0 = std::max(t0, v.sink_rows);
    if (r0 >= t1) return {0, 0};
    const std::size_t q0 = r0 - v.sink_rows, q1 = t1 - v.sink_rows;
    return {q0 == 0 ? 0 : v.outlier_end[q0 - 1], v.outlier_end[q1 - 1]};
  }

  // Each outlier of the coded rows among [t0, t1) in storage order: f(row, channel, delta), row
  // its offset from t0, delta its value minus the code-0 value the level loops read there. Each
  // row's offset is first marked at its first outlier in out_row_ (a row without outliers is
  // overwritten by the next one that starts there), and an outlier's row is the largest mark up
  // to it: one store a row, no branch a row or outlier.
  template <class F>
  void nuq_outliers(const NuqView& v, const NuqPrep& np, std::size_t t0, std::size_t t1, F&& f) {
    const auto [e0, e1] = outlier_span(v, t0, t1);
    if (e0 == e1) return;
    const std::size_t r0 = std::max(t0, v.sink_rows), q0 = r0 - v.sink_rows, q1 = t1 - v.sink_rows, m = e1 - e0;
    out_row_.assign(m + 1, 0);
    std::uint32_t* __restrict mark = out_row_.data();
    const std::uint32_t* __restrict ends = v.outlier_end;
    std::uint32_t start = e0, r = static_cast<std::uint32_t>(r0 - t0);
    for (std::size_t q = q0; q < q1; ++q, ++r) {
      mark[start - e0] = r;
      start = ends[q];
    }
    const std::uint16_t* channel = v.outlier_channel + e0;
    const std::uint16_t* value = v.outlier_value + e0;
    std::uint32_t row = 0;
    if (v.table->per_channel) {
      const float* zero = np.zero.data();
      for (std::size_t e = 0; e < m; ++e) {
        row = std::max(row, mark[e]);
        f(row, channel[e], f16_value(value[e]) - zero[channel[e]]);
      }
      return;
    }
    const float l0 = np.levels[0];
    for (std::size_t e = 0; e < m; ++e) {
      row = std::max(row, mark[e]);
      const std::size_t q = row + t0 - v.sink_rows;
      f(row, channel[e], f16_value(value[e]) - std::fma(l0, v.range[q], v.offset[q]));
    }
  }

  void nuq_keys(std::size_t t0, std::size_t t1) {
    const NuqView& v = hp_.view->key.nuq;
    const NuqPrep& np = hp_.nuq_key;
    const bool per_channel = v.table->per_channel;
    nuq_rows(
        v, np, t0, t1,
        [&](const Rows& rows, std::size_t first) {
          float* s = s_.data() + first;
          if (per_channel) {
            attn::score_rows(rows, nq_, hp_.nuq_w.data(), d_, hp_.nuq_bias.data(), s, tile_);
            return;
          }
          attn::score_rows(rows, nq_, hp_.q.data(), d_, nullptr, s, tile_);
          const std::size_t q = t0 + first - v.sink_rows;
          scale_scores(s, rows.n, v.range + q, v.offset + q);
        },
        [&](const Rows& rows, std::size_t first) {
          attn::score_rows(rows, nq_, hp_.q.data(), d_, nullptr, s_.data() + first, tile_);
        });
    with_heads([&](auto nq) { key_outliers<decltype(nq)::value>(v, np, t0, t1); });
  }

  // s[h, row] += q[h, channel] x delta over the tile's key outliers, outlier by outlier, every
  // query head (a row's corrections add in outlier order per head; NQ as value_outliers').
  template <std::size_t NQ>
  void key_outliers(const NuqView& v, const NuqPrep& np, std::size_t t0, std::size_t t1) {
    const std::size_t w = NQ ? NQ : nq_;
    float* __restrict s = s_.data();
    const float* __restrict q = hp_.q.data();
    nuq_outliers(v, np, t0, t1, [&](std::uint32_t row, std::uint16_t channel, float delta) {
      for (std::size_t h = 0; h < w; ++h) s[h * tile_ + row] += q[h * d_ + channel] * delta;
    });
  }

  // The tile's first n probabilities row-major, [n, nq]: p_ itself for one head, else
  // transposed into pt_.
  const float* probs_by_row(std::size_t n) {
    if (nq_ == 1) return p_.data();
    pt_.resize(n * nq_);
    transpose_heads(p_.data(), tile_, n, nq_, pt_.data());
    return pt_.data();
  }

  // nuq values from the tile's probabilities row-major (probs_by_row): they are the coefficients
  // of the sink rows, scaled those of the coded rows, and each outlier's vector of nq.
  void nuq_values(std::size_t t0, std::size_t t1, float* acc) {
    const NuqView& v = hp_.view->value.nuq;
    const NuqPrep& np = hp_.nuq_value;
    const bool per_channel = v.table->per_channel;
    const float* p = probs_by_row(t1 - t0);
    nuq_rows(
        v, np, t0, t1,
        [&](const Rows& rows, std::size_t first) {
          const float* pt = p + first * nq_;
          if (per_channel) {  // acc += range x (p . levels) + offset x sum p, per channel
            tmp_.assign(nq_ * d_, 0.0f);
            attn::accumulate_rows(rows, nq_, pt, 1, d_ / 8, tmp_.data(), d_);
            for (std::size_t h = 0; h < nq_; ++h) {
              float psum = 0.0f;
              for (std::size_t i = 0; i < rows.n; ++i) psum += pt[i * nq_ + h];
              for (std::size_t c = 0; c < d_; ++c) acc[h * d_ + c] += np.range[c] * tmp_[h * d_ + c] + np.offset[c] * psum;
            }
            return;
          }
          const std::size_t q = t0 + first - v.sink_rows;
          scaled_accumulate(rows, pt, v.range + q, v.offset + q, acc);
        },
        [&](const Rows& rows, std::size_t first) {
          attn::accumulate_rows(rows, nq_, p + first * nq_, 1, d_ / 8, acc, d_);
        });
    with_heads([&](auto nq) { value_outliers<decltype(nq)::value>(v, np, t0, t1, p); });
  }

  // acc_t_[channel, h] += pt[row, h] x delta over the tile's value outliers (NQ: nq_ when known
  // at compile time, 0 otherwise). acc_t_ [d, nq] is channel-major (a vector of nq per outlier);
  // run() keeps it scaled with acc and adds it to acc at the partition's end. Per-row values (the
  // usual case: the same number of outliers in every row, a row's two extremes at head_dim 128)
  // row by row, the row's code-0 value and probabilities read once, a row of two outliers with
  // both values widened and their deltas taken by one vector (the same operations); per-channel
  // ones through nuq_outliers.
  template <std::size_t NQ>
  void value_outliers(const NuqView& v, const NuqPrep& np, std::size_t t0, std::size_t t1, const float* __restrict pt) {
    const auto [e0, e1] = outlier_span(v, t0, t1);
    if (e0 == e1) return;
    const std::size_t w = NQ ? NQ : nq_;
    if (acc_t_.empty()) acc_t_.assign(d_ * w, 0.0f);
    float* __restrict at = acc_t_.data();
    if (v.table->per_channel) {
      nuq_outliers(v, np, t0, t1, [&](std::uint32_t row, std::uint16_t channel, float dk) {
        add_scaled<NQ>(at + channel * w, pt + row * w, dk, w);
      });
      return;
    }
    const std::size_t r0 = std::max(t0, v.sink_rows), q0 = r0 - v.sink_rows, q1 = t1 - v.sink_rows;
    const float l0 = np.levels[0];
    const std::uint16_t* channel = v.outlier_channel;
    const std::uint16_t* value = v.outlier_value;
    const float* pr = pt + (r0 - t0) * w;
    std::uint32_t e = e0;
    std::size_t q = q0;
#ifdef __AVX2__
    if constexpr (NQ == 1 || NQ == 2) {  // eight rows of two outliers each at a time
      const __m256i steps = _mm256_setr_epi32(2, 4, 6, 8, 10, 12, 14, 16);
      for (; q + 8 <= q1; q += 8, pr += 8 * NQ, e += 16) {
        const __m256i ends = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.outlier_end + q));
        const __m256i want = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(e)), steps);
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(ends, want)) != -1) break;
        pair_rows8<NQ>(at, pr, channel + e, value + e, v.range + q, v.offset + q, l0);
      }
    }
#endif
    for (; q < q1; ++q, pr += w) {
      const float base = std::fma(l0, v.range[q], v.offset[q]);
      const std::uint32_t end = v.outlier_end[q];
#ifdef __F16C__
      if (end - e == 2) {
        std::uint32_t two;
        std::memcpy(&two, value + e, 4);
        const __m128 d = _mm_sub_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(two))), _mm_set1_ps(base));
        add_scaled<NQ>(at + channel[e] * w, pr, _mm_cvtss_f32(d), w);
        add_scaled<NQ>(at + channel[e + 1] * w, pr, _mm_cvtss_f32(_mm_movehdup_ps(d)), w);
        e = end;
        continue;
      }
#endif
      for (; e < end; ++e) add_scaled<NQ>(at + channel[e] * w, pr, f16_value(value[e]) - base, w);
    }
  }

#ifdef __AVX2__
  // value_outliers' eight rows of two outliers each: their 16 deltas (values widened, each row's
  // code-0 value fma(l0, range, offset) subtracted) by vectors, then added outlier by outlier in
  // storage order, as the row loop adds them.
  template <std::size_t NQ>
  static void pair_rows8(float* __restrict at, const float* __restrict pr, const std::uint16_t* __restrict channel,
                         const std::uint16_t* value, const float* range, const float* offset, float l0) {
    const __m256 base = _mm256_fmadd_ps(_mm256_set1_ps(l0), _mm256_loadu_ps(range), _mm256_loadu_ps(offset));
    alignas(32) float d[16];
    _mm256_store_ps(d, _mm256_sub_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(value))),
                                     _mm256_permutevar8x32_ps(base, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3))));
    _mm256_store_ps(d + 8, _mm256_sub_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(value + 8))),
                                         _mm256_permutevar8x32_ps(base, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7))));
    for (std::size_t i = 0; i < 16; ++i) add_scaled<NQ>(at + channel[i] * NQ, pr + (i / 2) * NQ, d[i], NQ);
  }
#endif

  // a[h] = fma(p[h], x, a[h]) for h < w (NQ: w when known at compile time, 0 otherwise).
  template <std::size_t NQ>
  static void add_scaled(float* __restrict a, const float* __restrict p, float x, std::size_t w) {
#ifdef __FMA__
    if constexpr (NQ == 2) {  // 64-bit loads and store (movq: no access as another type)
      const __m128 pv = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
      const __m128 av = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(a), _mm_castps_si128(_mm_fmadd_ps(pv, _mm_set1_ps(x), av)));
      return;
    } else if constexpr (NQ == 4) {
      _mm_storeu_ps(a, _mm_fmadd_ps(_mm_loadu_ps(p), _mm_set1_ps(x), _mm_loadu_ps(a)));
      return;
    } else if constexpr (NQ == 8) {
      _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_loadu_ps(p), _mm256_set1_ps(x), _mm256_loadu_ps(a)));
      return;
    }
#endif
    for (std::size_t h = 0; h < w; ++h) a[h] = std::fma(p[h], x, a[h]);
  }

  // Scores s[h * tile_ + i] (i < n) of rows stored as range_i x codes + offset_i from the
  // codes' scores: s x range_i + qsum[h] x offset_i (offset null: 0).
  void scale_scores(float* s, std::size_t n, const float* range, const float* offset) {
    for (std::size_t h = 0; h < nq_; ++h) {
      float* x = s + h * tile_;
      const float qs = hp_.qsum[h];
      if (offset) {
        for (std::size_t i = 0; i < n; ++i) x[i] = x[i] * range[i] + qs * offset[i];
      } else {
        for (std::size_t i = 0; i < n; ++i) x[i] *= range[i];
      }
    }
  }

  // acc += the probabilities pt ([rows.n, nq], row-major) times rows stored as range_i x codes +
  // offset_i: coef = p x range_i over the codes, and p x offset_i summed into every channel
  // (offset null: 0), as four partial sums over i % 4 (fused multiply-adds) added as (s0 + s1) +
  // (s2 + s3), value_coefficients' order (one sum in row order was a chain of dependent
  // multiply-adds, ~4% of a one-head nuq step).
  void scaled_accumulate(const Rows& rows, const float* pt, const float* range, const float* offset, float* acc) {
    coef_.resize(rows.n * nq_);
    zsum_.assign(nq_, 0.0f);
    float* __restrict coef = coef_.data();
    float* __restrict z = zsum_.data();
    std::size_t h0 = 0;
#ifdef __FMA__
    for (; h0 + 4 <= nq_; h0 += 4) {  // four heads a vector, each head's sums as below
      __m128 zs[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
      for (std::size_t i = 0; i < rows.n; ++i) {
        const __m128 p = _mm_loadu_ps(pt + i * nq_ + h0);
        _mm_storeu_ps(coef + i * nq_ + h0, _mm_mul_ps(p, _mm_set1_ps(range[i])));
        if (offset) zs[i % 4] = _mm_fmadd_ps(p, _mm_set1_ps(offset[i]), zs[i % 4]);
      }
      _mm_storeu_ps(z + h0, _mm_add_ps(_mm_add_ps(zs[0], zs[1]), _mm_add_ps(zs[2], zs[3])));
    }
    if (nq_ == 1) {  // consecutive: four rows a vector, lane j the sum of rows i % 4 == j (z0..z3 below)
      __m128 zs = _mm_setzero_ps();
      std::size_t i = 0;
      for (; i + 4 <= rows.n; i += 4) {
        const __m128 p = _mm_loadu_ps(pt + i);
        _mm_storeu_ps(coef + i, _mm_mul_ps(p, _mm_loadu_ps(range + i)));
        if (offset) zs = _mm_fmadd_ps(p, _mm_loadu_ps(offset + i), zs);
      }
      alignas(16) float zl[4];
      _mm_store_ps(zl, zs);
      for (; i < rows.n; ++i) {
        coef[i] = pt[i] * range[i];
        if (offset) zl[i % 4] = std::fma(pt[i], offset[i], zl[i % 4]);
      }
      z[0] = (zl[0] + zl[1]) + (zl[2] + zl[3]);
      h0 = 1;
    }
    if (nq_ == 2) {  // two rows' two heads a vector; the sums of the loop below, chains in lanes
      __m128 za = _mm_setzero_ps(), zb = _mm_setzero_ps();  // lanes (h0, h1) of rows i % 4 = 0, 1 / 2, 3
      std::size_t i = 0;
      const auto pairs = [](const float* x) {  // (x0, x0, x1, x1)
        const __m128 v = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x)));
        return _mm_unpacklo_ps(v, v);
      };
      for (; i + 4 <= rows.n; i += 4) {
        const __m128 p01 = _mm_loadu_ps(pt + 2 * i), p23 = _mm_loadu_ps(pt + 2 * i + 4);
        _mm_storeu_ps(coef + 2 * i, _mm_mul_ps(p01, pairs(range + i)));
        _mm_storeu_ps(coef + 2 * i + 4, _mm_mul_ps(p23, pairs(range + i + 2)));
        if (offset) {
          za = _mm_fmadd_ps(p01, pairs(offset + i), za);
          zb = _mm_fmadd_ps(p23, pairs(offset + i + 2), zb);
        }
      }
      alignas(16) float zl[2][4];  // zl[k / 2][2 (k % 2) + h]: chain k of head h
      _mm_store_ps(zl[0], za);
      _mm_store_ps(zl[1], zb);
      for (std::size_t k = 0; i < rows.n; ++i, ++k) {
        for (std::size_t h = 0; h < 2; ++h) {
          coef[2 * i + h] = pt[2 * i + h] * range[i];
          if (offset) zl[k / 2][2 * (k % 2) + h] = std::fma(pt[2 * i + h], offset[i], zl[k / 2][2 * (k % 2) + h]);
        }
      }
      for (std::size_t h = 0; h < 2; ++h) z[h] = (zl[0][h] + zl[0][2 + h]) + (zl[1][h] + zl[1][2 + h]);
      h0 = 2;
    }
#endif
    for (; h0 < nq_; ++h0) {
      for (std::size_t i = 0; i < rows.n; ++i) coef[i * nq_ + h0] = pt[i * nq_ + h0] * range[i];
      if (!offset) continue;
      // In registers (named: an array indexed by i % 4 stayed in memory, each step waiting for
      // its store).
      float z0 = 0.0f, z1 = 0.0f, z2 = 0.0f, z3 = 0.0f;
      const float* p = pt + h0;
      std::size_t i = 0;
      for (; i + 4 <= rows.n; i += 4) {
        z0 = std::fma(p[i * nq_], offset[i], z0);
        z1 = std::fma(p[(i + 1) * nq_], offset[i + 1], z1);
        z2 = std::fma(p[(i + 2) * nq_], offset[i + 2], z2);
        z3 = std::fma(p[(i + 3) * nq_], offset[i + 3], z3);
      }
      if (i < rows.n) z0 = std::fma(p[i * nq_], offset[i], z0);
      if (i + 1 < rows.n) z1 = std::fma(p[(i + 1) * nq_], offset[i + 1], z1);
      if (i + 2 < rows.n) z2 = std::fma(p[(i + 2) * nq_], offset[i + 2], z2);
      z[h0] = (z0 + z1) + (z2 + z3);
    }
    attn::accumulate_rows(rows, nq_, coef, 1, d_ / 8, acc, d_);
    if (!offset) return;
    for (std::size_t h = 0; h < nq_; ++h) {
      for (std::size_t c = 0; c < d_; ++c) acc[h * d_ + c] += z[h];
    }
  }

  // Rows [t0, t1) of a TurboQuant tensor (TqPrep) as the vector loops read them.
  Rows tq_rows(const GgmlRowsView& g, const TqPrep& tp, std::size_t t0, std::size_t t1) const {
    const std::size_t rb = tq_row_bytes(*tp.type);
    return Rows{tp.format, g.blocks + t0 * rb, rb, t1 - t0, d_ / 8, tp.levels};
  }

  // The f16 fields of those rows in tq_half_ ([n] norms or scales, then [n] minimums or key_qjl
  // gammas), widened in tq_range_ when `ranges` (key_nc: the norms still without their correction,
  // nc_ranges; value rows read as values take the halves, value_coefficients), key_qjl rows' QJL
  // factors in qjl_coef_; false when a row's f16 fields are not finite (the tile is then decoded:
  // tq_decode_rows's values, whatever they are). Keys gather them after the score loops have read
  // the rows (then in the nearest cache: gathered first, each row's first touch was theirs).
  bool tq_fields(const GgmlRowsView& g, const TqPrep& tp, std::size_t t0, std::size_t t1, bool ranges = true) {
    const TqType& t = *tp.type;
    const std::size_t rb = tq_row_bytes(t), n = t1 - t0, at = tq_code_bytes(t);
    const std::uint8_t* src = g.blocks + t0 * rb;
    const bool value = t.kind == TqKind::value, qjl = t.kind == TqKind::key_qjl;
    tq_half_.resize(2 * n);
    // Through a local pointer: stores through tq_half_'s own would reload its data each row.
    std::uint16_t* __restrict half = tq_half_.data();
    if (value) {  // scale and minimum side by side: one read per row
      for (std::size_t r = 0; r < n; ++r) {
        std::uint32_t both;
        std::memcpy(&both, src + r * rb + at, 4);
        half[r] = static_cast<std::uint16_t>(both);
        half[n + r] = static_cast<std::uint16_t>(both >> 16);
      }
    } else if (qjl) {  // the norm and the QJL term's gamma (qjl_scores' factors) in one pass
      const std::size_t ga = tq_qjl_gamma_offset(t);
      for (std::size_t r = 0; r < n; ++r) {
        std::memcpy(&half[r], src + r * rb + at, 2);
        std::memcpy(&half[n + r], src + r * rb + ga, 2);
      }
    } else {
      for (std::size_t r = 0; r < n; ++r) std::memcpy(&half[r], src + r * rb + at, 2);
    }
    unsigned bad = 0;  // checked apart: a loop over the gathered halves that vectorizes
    for (std::size_t i = 0; i < (value || qjl ? 2 * n : n); ++i) bad |= static_cast<unsigned>(f16_nonfinite(half[i]));
    if (bad != 0) return false;
    if (!ranges) return true;
    tq_range_.resize(value ? 2 * n : n);
    f16_to_f32(tq_half_.data(), tq_range_.data(), tq_range_.size());
    if (qjl) {
      qjl_coef_.resize(n);
      tq_qjl_factors(t, tq_half_.data() + n, n, qjl_coef_.data());
    }
    return true;
  }

  // key_nc rows: their norms times 1 / sqrt(the sums of squares in tq_sq_ + 1e-16).
  void nc_ranges(std::size_t n) { inverse_norms(tq_sq_.data(), n, tq_range_.data()); }

  // TurboQuant keys through the vector loops (false: decode them instead).
  bool tq_keys(std::size_t t0, std::size_t t1) {
    const TqPrep& tp = hp_.tq_key;
    const Rows rows = tq_rows(hp_.view->key.ggml, tp, t0, t1);
    const bool nc = tp.type->kind == TqKind::key_nc;
    if (nc) tq_sq_.resize(rows.n);
    if (tp.w1_tables) {  // 1-bit levels: s = (sum over the set bits of q x (c1 - c0)) + c0 x sum q
      tp.w1_tables->sums(rows.base, rows.stride, rows.n, s_.data(), tile_);
      for (std::size_t h = 0; h < nq_; ++h) {
        for (std::size_t i = 0; i < rows.n; ++i) s_[h * tile_ + i] += tp.bias1[h];
      }
    } else {
      attn::score_rows(rows, nq_, hp_.q.data(), d_, nullptr, s_.data(), tile_, nc ? tq_sq_.data() : nullptr);
    }
    if (!tq_fields(hp_.view->key.ggml, tp, t0, t1)) return false;
    if (nc) nc_ranges(rows.n);
    const bool value = tp.type->kind == TqKind::value;
    scale_scores(s_.data(), rows.n, tq_range_.data(), value ? tq_range_.data() + rows.n : nullptr);
    if (hp_.qjl) qjl_scores(t0, t1, rows.base);
    return true;
  }

  // The QJL term of key_qjl rows [t0, t1) (at src) added to the scores: s += coef_r x (2 (sq .
  // bits) - sum sq), sq . bits each query head's S q summed over the row's set sign bits by the
  // heads' sign tables (sign_tables.h).
  void qjl_scores(std::size_t t0, std::size_t t1, const std::uint8_t* src) {
    const TqType& t = *hp_.qjl;
    const std::size_t rb = tq_row_bytes(t), n = t1 - t0, at = tq_qjl_sign_offset(t);
    qjl_s_.resize(nq_ * n);
    hp_.qjl_signs->sums(src + at, rb, n, qjl_s_.data(), n);
    for (std::size_t h = 0; h < nq_; ++h) {  // qjl_coef_: the tile's factors, from tq_fields
      float* s = s_.data() + h * tile_;
      const float* b = qjl_s_.data() + h * n;
      const float sum = hp_.qjl_query[h].sq_sum;
      for (std::size_t i = 0; i < n; ++i) s[i] += qjl_coef_[i] * (2.0f * b[i] - sum);
    }
  }

  // TurboQuant values: value rows as packed_values reads per-token codes (one group a row: coef =
  // p x scale, zsum = sum of p x minimum), key rows as coef = p x range.
  bool tq_values(std::size_t t0, std::size_t t1, float* acc) {
    const TqPrep& tp = hp_.tq_value;
    if (!tq_fields(hp_.view->value.ggml, tp, t0, t1, tp.type->kind != TqKind::value)) return false;
    const Rows rows = tq_rows(hp_.view->value.ggml, tp, t0, t1);
    const std::size_t n = rows.n;
    if (tp.type->kind != TqKind::value) {
      if (tp.type->kind == TqKind::key_nc) {  // a pass for the sums of squares alone
        tq_sq_.resize(n);
        buf_.resize(n);
        attn::score_rows(rows, 1, tp.ones.data(), d_, nullptr, buf_.data(), n, tq_sq_.data());
        nc_ranges(n);
      }
      scaled_accumulate(rows, probs_by_row(n), tq_range_.data(), nullptr, acc);
      return true;
    }
    coef_.resize(n * nq_);
    zsum_.resize(nq_);
    attn::value_coefficients(p_.data(), tile_, tq_half_.data(), tq_half_.data() + n, n, nq_, 1, coef_.data(), zsum_.data());
    attn::accumulate_rows(rows, nq_, coef_.data(), 1, d_ / 8, acc, d_);
    for (std::size_t h = 0; h < nq_; ++h) {
      for (std::size_t c = 0; c < d_; ++c) acc[h * d_ + c] += zsum_[h];
    }
    return true;
  }

  // fp8 rows [t0, t1) of a view as the vector loops read them. e4m3 NaN codes (which those loads
  // read as 480) are looked for after the loops have read the tile (it is then in the nearest
  // cache; a scan before them measured 15% of the step, the tile's first touch): a tile holding
  // one is then computed again from its decoded rows (values: the accumulators restored first).
  Rows fp8_rows(const GgmlRowsView& g, const Fp8Prep& fp, std::size_t t0, std::size_t t1) const {
    return Rows{fp.format, g.blocks + t0 * d_, d_, t1 - t0, d_ / 8};
  }
  bool fp8_nan(const GgmlRowsView& g, const Fp8Prep& fp, const Rows& rows) const {
    return fp.format == RowFormat::e4m3 && !g.finite && has_e4m3_nan(rows.base, rows.n * d_);
  }

  bool fp8_keys(std::size_t t0, std::size_t t1) {
    const Rows rows = fp8_rows(hp_.view->key.ggml, hp_.fp8_key, t0, t1);
    attn::score_rows(rows, nq_, hp_.fp8_w.data(), d_, nullptr, s_.data(), tile_);
    return !fp8_nan(hp_.view->key.ggml, hp_.fp8_key, rows);
  }

  bool fp8_values(std::size_t t0, std::size_t t1, float* acc) {
    const Rows rows = fp8_rows(hp_.view->value.ggml, hp_.fp8_value, t0, t1);
    const bool scan = hp_.fp8_value.format == RowFormat::e4m3 && !hp_.view->value.ggml.finite;
    if (scan) saved_.assign(acc, acc + nq_ * d_);
    row_coefficients(t0, rows.n, t0);
    if (const float sc = hp_.fp8_value.scale; sc != 1.0f) {
      for (float& c : coef_) c *= sc;
    }
    attn::accumulate_rows(rows, nq_, coef_.data(), 1, d_ / 8, acc, d_);
    if (!fp8_nan(hp_.view->value.ggml, hp_.fp8_value, rows)) return true;
    std::copy(saved_.begin(), saved_.end(), acc);
    return false;
  }

  // Rows [t0, t1) of ggml's 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) as the vector
  // loops read them (the values ggml_dequantize gives, without the f32 tile), or nullopt for
  // other types and for the plain loops (generic: the dequantized tile, as the reference).
  std::optional<Rows> ggml_rows(const GgmlRowsView& g, std::size_t t0, std::size_t t1) const {
    if (!g.type || d_ % 32 != 0 || active_isa() == Isa::generic) return std::nullopt;
    const auto f = attn::ggml_row_format(g.type->id);
    if (!f) return std::nullopt;
    const std::size_t rb = d_ / 32 * g.type->bytes;
    return Rows{*f, g.blocks + t0 * rb, rb, t1 - t0, d_ / 8};
  }

  // Rows [t0, t1) of ggml blocks or nuq codes dequantized into buf_ (ggml_dequantize,
  // nuq_decode: the values the cache holds), which the f32 loops then read as dense rows.
  void decoded_tile(const TensorView& t, std::size_t t0, std::size_t t1) {
    buf_.resize((t1 - t0) * d_);
    dequantize_rows(t, d_, t0, t1, buf_.data());
  }
  attn::Rows f32_rows(std::size_t n) const {
    return {attn::RowFormat::f32, reinterpret_cast<const std::uint8_t*>(buf_.data()), d_ * sizeof(float), n, d_ / 8};
  }
  // Probabilities of rows [r0, r0 + n) of the tile starting at t0, row-major [n, nq].
  void row_coefficients(std::size_t r0, std::size_t n, std::size_t t0) {
    coef_.resize(n * nq_);
    transpose_heads(p_.data() + (r0 - t0), tile_, n, nq_, coef_.data());
  }

  void values(std::size_t t0, std::size_t t1, float* acc) {
    const TensorView& v = hp_.view->value;
    if (hp_.tq_value.type && tq_values(t0, t1, acc)) return;
    if (hp_.fp8_value.set() && fp8_values(t0, t1, acc)) return;
    if (v.nuq.table && hp_.nuq_value.fused) {
      nuq_values(t0, t1, acc);
      return;
    }
    if (const auto rows = ggml_rows(v.ggml, t0, t1)) {
      row_coefficients(t0, t1 - t0, t0);
      attn::accumulate_rows(*rows, nq_, coef_.data(), 1, d_ / 8, acc, d_);
      return;
    }
    if (v.ggml.type || v.nuq.table) {
      decoded_tile(v, t0, t1);
      row_coefficients(t0, t1 - t0, t0);
      attn::accumulate_rows(f32_rows(t1 - t0), nq_, coef_.data(), 1, d_ / 8, acc, d_);
      return;
    }
    const PackedView& p = v.packed;
    const std::size_t e = std::min(t1, p.rows);
    if (t0 < e) {
      if (fast_packed_values(p)) {
        packed_values(t0, e, t0, acc);
      } else if (fast_channel_values(p)) {
        channel_values(t0, e, t0, acc);
      } else {
        generic_values(v, t0, e, t0, acc);
      }
    }
    const std::size_t r0 = std::max(t0, p.rows);
    if (r0 < t1) {
      if (d_ % 8 == 0) {
        const std::size_t n = t1 - r0;
        row_coefficients(r0, n, t0);
        const std::size_t eb = elem_bytes(v.dense.type), stride = d_ * eb;
        const Rows rows{dense_format(v.dense.type),
                        static_cast<const std::uint8_t*>(v.dense.data) + (r0 - p.rows) * stride, stride,
                        n, d_ / 8};
        attn::accumulate_rows(rows, nq_, coef_.data(), 1, d_ / 8, acc, d_);
      } else {
        generic_values(v, r0, t1, t0, acc);
      }
    }
  }

  // Per-channel packed values (a scale and a zero per group of G tokens and channel): each token
  // group's codes accumulated with the probabilities (tmp_ [nq, d]), then per channel acc +=
  // scale x that + zero x (the group's sum of p), group by group.
  void channel_values(std::size_t r0, std::size_t r1, std::size_t t0, float* acc) {
    const PackedView& p = hp_.view->value.packed;
    const std::size_t stride = p.cols * static_cast<std::size_t>(p.bits) / 8;
    ch_f_.resize(2 * p.cols);
    float* scale = ch_f_.data();
    float* zero = scale + p.cols;
    for (std::size_t r = r0; r < r1;) {
      const std::size_t g = r / p.group, ge = std::min(r1, (g + 1) * p.group), n = ge - r;
      row_coefficients(r, n, t0);
      tmp_.assign(nq_ * d_, 0.0f);
      const Rows rows{attn::code_format(p.bits), p.codes + r * stride, stride, n, p.cols / 8};
      attn::accumulate_rows(rows, nq_, coef_.data(), 1, p.cols / 8, tmp_.data(), d_);
      f16_to_f32(p.scale + g * p.cols, scale, p.cols);
      f16_to_f32(p.zero + g * p.cols, zero, p.cols);
      for (std::size_t h = 0; h < nq_; ++h) {
        float psum = 0.0f;
        for (std::size_t i = 0; i < n; ++i) psum += coef_[i * nq_ + h];
        const float* t = tmp_.data() + h * d_;
        float* a = acc + h * d_;
        for (std::size_t c = 0; c < p.cols; ++c) a[c] += scale[c] * t[c] + zero[c] * psum;
      }
      r = ge;
    }
  }

  // Per-token packed values: coef = p * scale per (row, group); p * zero summed per group.
  void packed_values(std::size_t r0, std::size_t r1, std::size_t t0, float* acc) {
    const PackedView& p = hp_.view->value.packed;
    const std::size_t n = r1 - r0, ng = p.cols / p.group + (p.cols % p.group ? 1 : 0);
    coef_.resize(n * nq_ * ng);
    zsum_.resize(nq_ * ng);
    attn::value_coefficients(p_.data() + (r0 - t0), tile_, p.scale + r0 * ng, p.zero + r0 * ng, n, nq_, ng,
                             coef_.data(), zsum_.data());
    const std::size_t stride = p.cols * static_cast<std::size_t>(p.bits) / 8;
    if (int8_values(p, mode_)) {
      for (std::size_t i = 0; i < n; i += attn::kInt8ValueRows) {
        const std::size_t m = std::min(attn::kInt8ValueRows, n - i);
        attn::quantize_coefficients_int8(coef_.data() + i * nq_ * ng, m, nq_, ng, quads_, sigma_);
        const Rows rows{attn::code_format(p.bits), p.codes + (r0 + i) * stride, stride, m, p.cols / 8};
        attn::accumulate_rows_int8(rows, nq_, quads_.data(), ng, p.group, sigma_.data(), acc, d_);
      }
    } else {
      const Rows rows{attn::code_format(p.bits), p.codes + r0 * stride, stride, n, p.cols / 8};
      attn::accumulate_rows(rows, nq_, coef_.data(), ng, p.group / 8, acc, d_);
    }
    for (std::size_t h = 0; h < nq_; ++h) {
      for (std::size_t g = 0; g < ng; ++g) {
        const float z = zsum_[h * ng + g];
        float* a = acc + h * d_ + g * p.group;
        for (std::size_t c = 0; c < std::min(p.group, d_ - g * p.group); ++c) a[c] += z;
      }
    }
  }

  void generic_values(const TensorView& v, std::size_t r0, std::size_t r1, std::size_t t0, float* acc) {
    buf_.resize((r1 - r0) * d_);
    dequantize_rows(v, d_, r0, r1, buf_.data());
    for (std::size_t r = r0; r < r1; ++r) {
      const float* x = buf_.data() + (r - r0) * d_;
      for (std::size_t h = 0; h < nq_; ++h) {
        const float pr = p_[h * tile_ + (r - t0)];
        for (std::size_t c = 0; c < d_; ++c) acc[h * d_ + c] += pr * x[c];
      }
    }
  }

  const HeadPrep& hp_;
  std::size_t nq_, d_;
  std::size_t tile_;
  AttentionMode mode_;
  float softcap_;
  std::vector<float> s_, p_;  // [nq, tile] scores, probabilities (unnormalised)
  std::vector<float> w_, bias_, coef_, zsum_, buf_, tmp_;
  std::vector<std::uint32_t> out_row_;  // a nuq tile's row marks (nuq_outliers)
  std::vector<float> acc_t_;  // nuq value outliers' sums of the partition, [d, nq] (empty: none)
  std::vector<float> pt_;     // a tile's probabilities row-major, [rows, nq] (probs_by_row)
  std::vector<float> tq_range_, tq_sq_;  // a TurboQuant tile's rows (tq_fields)
  std::vector<TqQjlQuery> qjl_tables_;  // key_qjl rows decoded (qjl_keys): each query head's sign tables
  std::vector<float> qjl_s_, qjl_coef_;  // key_qjl: a tile's sign sums [nq, rows], factors [rows]
  std::vector<std::uint16_t> tq_half_;
  std::vector<float> ch_f_;  // per-channel values (channel_values): a token group's scales, zeros [cols]
  std::vector<float> tok_s_, tok_f_, tok_qs_;  // per-token keys (token_keys): a group's dots [nq, rows]; scales and zeros; q's group sums [nq, groups]
  std::vector<std::uint8_t> pad_;  // the last nuq row, padded for the level loops
  std::vector<float> saved_;       // e4m3 values: the accumulators before a tile (fp8_values)
  attn::Int8Weights w8_;  // int8 mode: w_ rounded
  std::vector<std::uint32_t> quads_;  // int8 mode: rounded value coefficients
  std::vector<float> sigma_;
  std::size_t group_ = static_cast<std::size_t>(-1);  // key group whose w_/bias_ are loaded
};

}  // namespace

void run_partition(const HeadPrep& hp, std::size_t nq, std::size_t d, const DecodeAttentionOptions& o, float softcap,
                   std::size_t a, std::size_t b, Partial& out, float* const* raw, const std::size_t* visible,
                   std::size_t offset, const std::size_t* first) {
  PartitionRunner runner(hp, nq, d, o.tile, o.mode, softcap);
  runner.run(a, b, out, raw, visible, offset, first);
}

}  // namespace akv::attn
