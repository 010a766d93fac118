#include "akv/kv/decode_compression.h"

#include <algorithm>
#include <stdexcept>

#include "akv/alloc/alloc.h"
#include "akv/score/qfilter.h"
#include "akv/score/score.h"
#include "akv/tensor/tensor.h"

namespace akv {

std::vector<std::vector<std::size_t>> decode_cut(const std::vector<HeadRows>& heads, const float* query,
                                                 std::size_t n_query, const KvShape& shape, const EvictionParams& e,
                                                 const std::vector<std::vector<double>>* qfilters) {
  const std::size_t H = shape.n_kv_heads, g = shape.group_size(), d = shape.head_dim, W = e.score.window;
  if (heads.size() != H || n_query == 0) throw std::logic_error("decode_cut: a row set per KV head and a query");
  const bool qfilter = e.score.method == ScoreMethod::qfilter;
  if (qfilter && (!qfilters || qfilters->size() != H)) throw std::logic_error("decode_cut: qfilter needs the layer's filters");
  const bool values = score_reads_values(e.score);
  SortedScores sorted(H);
  std::vector<std::vector<std::size_t>> order(H), forced(H);
  for (std::size_t h = 0; h < H; ++h) {
    const HeadRows& r = heads[h];
    const std::size_t nq = std::min(n_query, r.n);
    Tensor3 key(1, r.n, d), value, q(g, nq, d);
    std::copy_n(r.key, r.n * d, key.data());
    if (values) {
      value = Tensor3(1, r.n, d);
      std::copy_n(r.value, r.n * d, value.data());
    }
    for (std::size_t i = 0; i < nq; ++i) {
      const float* row = query + (n_query - nq + i) * shape.n_heads * d;
      for (std::size_t j = 0; j < g; ++j) std::copy_n(row + (h * g + j) * d, d, q.row(j, i));
    }
    KvWindow m;
    m.kv_shape() = shape;
    m.n_layers = 1;
    m.n_heads = g;
    m.n_kv_heads = 1;
    m.n_tokens = r.n;
    m.n_query = nq;
    ScoreOptions o = e.score;
    o.window = std::min(W, nq);
    std::size_t sinks = 0;  // rows of sink positions (the first rows)
    while (sinks < r.n && static_cast<std::size_t>(r.position[sinks]) < e.sinks) ++sinks;
    HeadScores s = score_head(q, key, 0, m, o, values ? &value : nullptr, sinks);
    if (qfilter) s.score = qfilter_scores(key, 0, (*qfilters)[h]);
    for (std::size_t t = 0; t < r.n; ++t) (t < sinks || t + W >= r.n ? forced[h] : order[h]).push_back(t);
    std::stable_sort(order[h].begin(), order[h].end(), [&](std::size_t a, std::size_t b) { return s.score[a] > s.score[b]; });
    for (std::size_t t : order[h]) sorted[h].push_back(s.score[t]);
  }
  const std::size_t base = e.target - std::min(e.target, e.sinks + W);
  const std::vector<std::size_t> extra =
      e.alloc == AllocMethod::adakv ? allocate_adakv(sorted, base, e.alpha, e.capacity_rule, e.sinks + W) : allocate_uniform(sorted, base);
  std::vector<std::vector<std::size_t>> keep(H);
  for (std::size_t h = 0; h < H; ++h) {
    keep[h] = forced[h];
    keep[h].insert(keep[h].end(), order[h].begin(), order[h].begin() + static_cast<std::ptrdiff_t>(extra[h]));
    std::sort(keep[h].begin(), keep[h].end());
  }
  return keep;
}

}  // namespace akv
