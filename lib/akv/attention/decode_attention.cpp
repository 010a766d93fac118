#include "akv/attention/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "akv/attention/partition.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"

namespace akv {
namespace {

void check_tensor(const TensorView& t, std::size_t d, const char* name) {
  const PackedView& p = t.packed;
  if (p.rows > 0) {
    check_bits(p.bits, name);
    if (p.group == 0 || p.cols + p.n_outliers != d || !p.codes || !p.scale || !p.zero) {
      throw InvalidInput("packed rows inconsistent with head_dim (cols + outliers) or missing "
                         "codes/scales/zeros", {"", name, std::to_string(p.cols)});
    }
  }
  if (t.dense.rows > 0 && !t.dense.data) throw InvalidInput("dense rows without data", {"", name});
  if (t.ggml.type && (d % t.ggml.type->block != 0 || d % 8 != 0 || p.rows > 0 || t.dense.rows > 0 ||
                      (t.ggml.rows > 0 && !t.ggml.blocks))) {
    throw InvalidInput("ggml rows need head_dim a multiple of the block and no packed or dense rows beside them",
                       {"", name, t.ggml.type->name});
  }
  if (t.nuq.table && (d % 8 != 0 || p.rows > 0 || t.dense.rows > 0 || t.ggml.type)) {
    throw InvalidInput("nuq rows need head_dim a multiple of 8 and no other rows beside them", {"", name, "nuq"});
  }
}

void check_args(const DecodeAttentionArgs& a) {
  if (!a.query || !a.out || !a.heads || a.n_kv_heads == 0 || a.head_dim == 0 ||
      a.n_heads % a.n_kv_heads != 0 || a.n_heads == 0 || a.segments == 0) {
    throw InvalidInput("decode attention: n_heads must be a positive multiple of n_kv_heads, "
                       "with query, heads and out given",
                       {"", "n_heads/n_kv_heads", std::to_string(a.n_heads) + "/" + std::to_string(a.n_kv_heads)});
  }
  for (std::size_t h = 0; h < a.n_kv_heads * a.segments; ++h) {
    check_tensor(a.heads[h].key, a.head_dim, "key");
    check_tensor(a.heads[h].value, a.head_dim, "value");
    if (a.heads[h].key.rows() != a.heads[h].value.rows()) {
      throw InvalidInput("keys and values of a head have different row counts",
                         {"", "rows", std::to_string(a.heads[h].key.rows()) + " vs " +
                                          std::to_string(a.heads[h].value.rows())});
    }
  }
  if (a.visible || a.first) {
    if (a.probs) throw InvalidInput("decode attention: visible rows and probabilities together", {"", "probs", "set"});
    const std::size_t g = a.n_heads / a.n_kv_heads;
    for (std::size_t h = 0; h < a.n_heads; ++h) {
      std::size_t n = 0;
      for (std::size_t s = 0; s < a.segments; ++s) n += a.heads[(h / g) * a.segments + s].key.rows();
      if (a.visible && (a.visible[h] == 0 || a.visible[h] > n)) {
        throw InvalidInput("decode attention: a query head sees 1 to its KV head's rows",
                           {"", "visible[" + std::to_string(h) + "]", std::to_string(a.visible[h])});
      }
      if (a.first && a.first[h] >= (a.visible ? a.visible[h] : n)) {
        throw InvalidInput("decode attention: a query head's first row must be one it sees",
                           {"", "first[" + std::to_string(h) + "]", std::to_string(a.first[h])});
      }
    }
  }
}

// x [n] (n a multiple of 32) <- its values as llama.cpp's CPU quantize_row_q8_0 leaves them
// (ggml-cpu's x86 path: d = amax / 127 stored as f16, codes round-half-even(x * (127 / amax)),
// value f16(d) * code; the reference quantizer divides by d and rounds half away instead).
void round_q8_0_cpu(float* x, std::size_t n) {
  for (std::size_t b = 0; b + 32 <= n; b += 32) {
    float amax = 0.0f;
    for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = f16_nearest(amax / 127.0f), id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (std::size_t i = b; i < b + 32; ++i) x[i] = d * std::nearbyint(x[i] * id);
  }
}

// The rotation the non-empty views of KV head kv share (tensor: key or value); InvalidInput
// when its segments disagree.
Rotation head_rotation(const DecodeAttentionArgs& a, std::size_t kv, bool key) {
  Rotation r;
  bool first = true;
  for (std::size_t s = 0; s < a.segments; ++s) {
    const HeadView& h = a.heads[kv * a.segments + s];
    if (h.rows() == 0) continue;
    const Rotation& x = key ? h.key.rotation : h.value.rotation;
    if (!first && x != r) throw InvalidInput("the segments of a KV head are rotated differently", {"", "rotation"});
    r = x;
    first = false;
  }
  return r;
}

bool any_rotation(const DecodeAttentionArgs& a) {
  for (std::size_t i = 0; i < a.n_kv_heads * a.segments; ++i) {
    if (a.heads[i].key.rotation.active() || a.heads[i].value.rotation.active()) return true;
  }
  return false;
}

}  // namespace

const char* attention_mode_name(AttentionMode m) {
  return m == AttentionMode::int8 ? "int8" : m == AttentionMode::llama ? "llama" : "exact";
}

AttentionMode parse_attention_mode(const std::string& s, const char* flag) {
  if (s == "exact") return AttentionMode::exact;
  if (s == "int8") return AttentionMode::int8;
  throw InvalidInput("unknown attention path (exact, int8)", {"", flag, s});
}

namespace {

// Rotated keys: the query rotated the same way (q.k = (Rq).(Rk)); rotated values: the output
// rotated back. decode_attention reads the views as stored.
void decode_attention_rotated(const DecodeAttentionArgs& a, const DecodeAttentionOptions& o) {
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim;
  std::vector<float> query(a.query, a.query + a.n_heads * d);
  std::vector<HeadView> heads(a.heads, a.heads + a.n_kv_heads * a.segments);
  std::vector<Rotation> value_rotation(a.n_kv_heads);
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    rotate_rows(head_rotation(a, kv, true), query.data() + kv * nq * d, nq, d);
    value_rotation[kv] = head_rotation(a, kv, false);
  }
  for (HeadView& h : heads) h.key.rotation = h.value.rotation = {};
  DecodeAttentionArgs stored = a;
  stored.query = query.data();
  stored.heads = heads.data();
  decode_attention(stored, o);
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    unrotate_rows(value_rotation[kv], a.out + kv * nq * d, nq, d);
  }
}

// AttentionMode::llama: the query heads of KV heads with ggml block keys rounded to Q8_0 (after
// any rotation), then the exact path.
void decode_attention_llama(const DecodeAttentionArgs& a, const DecodeAttentionOptions& o) {
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim;
  std::vector<float> query(a.query, a.query + a.n_heads * d);
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    bool blocked = false;
    for (std::size_t s = 0; s < a.segments; ++s) {
      const GgmlTypeInfo* t = a.heads[kv * a.segments + s].key.ggml.type;
      blocked = blocked || (t && !fp8_format_of(*t) && !tq_type_of(*t));  // not llama.cpp types
    }
    if (blocked) round_q8_0_cpu(query.data() + kv * nq * d, nq * d);
  }
  DecodeAttentionArgs rounded = a;
  rounded.query = query.data();
  DecodeAttentionOptions exact = o;
  exact.mode = AttentionMode::exact;
  decode_attention(rounded, exact);
}

// KV head kv's outputs (and, when asked, probabilities over its rows [n]) from its partitions'
// partial softmax states parts[0, count), rescaled to their common maximum.
void merge_partitions(const DecodeAttentionArgs& a, std::size_t kv, const attn::Partial* parts, std::size_t count,
                      std::size_t n) {
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim;
  for (std::size_t h = 0; h < nq; ++h) {
    float* out = a.out + (kv * nq + h) * d;
    std::fill(out, out + d, 0.0f);
    if (n == 0) continue;
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < count; ++i) m = std::max(m, parts[i].m[h]);
    float l = 0.0f;
    for (std::size_t i = 0; i < count; ++i) {
      if (std::isinf(parts[i].m[h])) continue;  // rows the head does not see (visible)
      const float w = std::exp(parts[i].m[h] - m);
      l += parts[i].l[h] * w;
      for (std::size_t c = 0; c < d; ++c) out[c] += parts[i].acc[h * d + c] * w;
    }
    const float inv = 1.0f / l;
    for (std::size_t c = 0; c < d; ++c) out[c] *= inv;
    float* pr = a.probs ? a.probs[kv * nq + h] : nullptr;
    if (pr) {
      attn::exp_shifted(pr, m, n, pr);
      for (std::size_t t = 0; t < n; ++t) pr[t] *= inv;
    }
  }
}

}  // namespace

void decode_attention(const DecodeAttentionArgs& a, const DecodeAttentionOptions& o) {
  check_args(a);
  if (any_rotation(a)) return decode_attention_rotated(a, o);
  if (o.mode == AttentionMode::llama) return decode_attention_llama(a, o);
  if (o.tile == 0 || o.partition == 0 || o.partition % o.tile != 0) {
    throw InvalidInput("partition must be a positive multiple of tile",
                       {"", "partition/tile", std::to_string(o.partition) + "/" + std::to_string(o.tile)});
  }
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim, ns = a.segments;
  std::vector<attn::HeadPrep> prep;
  prep.reserve(a.n_kv_heads * ns);
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    for (std::size_t s = 0; s < ns; ++s) prep.push_back(attn::prepare_head(a, kv, s));
  }
  // Work items: (KV head, segment, partition), fixed by the row counts alone; a KV head's items
  // are consecutive, from first[kv] to first[kv + 1].
  struct Item {
    std::size_t view, t0, t1, offset;  // offset: rows of the head's earlier segments
  };
  std::vector<Item> items;
  std::vector<std::size_t> first(a.n_kv_heads + 1, 0), rows(a.n_kv_heads, 0);
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    for (std::size_t s = 0; s < ns; ++s) {
      const std::size_t v = kv * ns + s, n = a.heads[v].rows();
      for (std::size_t t0 = 0; t0 < n; t0 += o.partition) items.push_back({v, t0, std::min(n, t0 + o.partition), rows[kv]});
      rows[kv] += n;
    }
    first[kv + 1] = items.size();
  }
  std::vector<attn::Partial> parts(items.size());
  parallel_for(parts.size(), o.threads, [&](std::size_t i) {
    const Item& it = items[i];
    const std::size_t kv = it.view / ns;
    std::vector<float*> raw;
    if (a.probs) {
      for (std::size_t h = 0; h < nq; ++h) raw.push_back(a.probs[kv * nq + h] ? a.probs[kv * nq + h] + it.offset : nullptr);
    }
    attn::run_partition(prep[it.view], nq, d, o, a.softcap, it.t0, it.t1, parts[i], a.probs ? raw.data() : nullptr,
                        a.visible ? a.visible + kv * nq : nullptr, it.offset, a.first ? a.first + kv * nq : nullptr);
  });
  // The merge is a few vector adds per head unless probabilities are asked for (a pass over
  // every row): threads only then.
  parallel_for(a.n_kv_heads, a.probs ? o.threads : 1, [&](std::size_t kv) {
    merge_partitions(a, kv, parts.data() + first[kv], first[kv + 1] - first[kv], rows[kv]);
  });
}

void decode_attention_ref(const DecodeAttentionArgs& a) {
  check_args(a);
  const std::size_t nq = a.n_heads / a.n_kv_heads, d = a.head_dim;
  for (std::size_t kv = 0; kv < a.n_kv_heads; ++kv) {
    std::vector<float> k, v;
    for (std::size_t s = 0; s < a.segments; ++s) {
      const HeadView& hv = a.heads[kv * a.segments + s];
      const std::size_t m = hv.rows(), old = k.size();
      k.resize(old + m * d);
      v.resize(old + m * d);
      dequantize_rows(hv.key, d, 0, m, k.data() + old);
      dequantize_rows(hv.value, d, 0, m, v.data() + old);
    }
    for (std::size_t h = kv * nq; h < (kv + 1) * nq; ++h) {
      const std::size_t n = a.visible ? a.visible[h] : k.size() / d, lo = a.first ? a.first[h] : 0;
      std::vector<double> s(n);
      double m = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t < n; ++t) {
        if (t < lo) {
          s[t] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0.0;
        for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(a.query[h * d + c]) * k[t * d + c];
        s[t] = dot * a.scale;
        if (a.softcap != 0.0f) s[t] = a.softcap * std::tanh(s[t] / a.softcap);
        m = std::max(m, s[t]);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - m));
      std::vector<double> out(d, 0.0);
      for (std::size_t t = 0; t < n; ++t) {
        s[t] /= sum;
        for (std::size_t c = 0; c < d; ++c) out[c] += s[t] * v[t * d + c];
      }
      for (std::size_t c = 0; c < d; ++c) a.out[h * d + c] = static_cast<float>(out[c]);
      if (a.probs && a.probs[h]) {
        for (std::size_t t = 0; t < n; ++t) a.probs[h][t] = static_cast<float>(s[t]);
      }
    }
  }
}

}  // namespace akv
