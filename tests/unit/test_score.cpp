#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/score/critical.h"
#include "akv/score/expected_attention.h"
#include "akv/score/kvzap.h"
#include "akv/score/kvzip.h"
#include "akv/score/qfilter.h"
#include "akv/score/score.h"
#include "akv/tensor/rope.h"

using namespace akv;

namespace {

KvWindow meta(std::size_t T, std::size_t nq) {
  KvWindow m;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  m.n_tokens = T;
  m.n_query = nq;
  return m;
}

// One KV head of 2-channel keys [1, n, 2] from hand-written rows.
Tensor3 keys_2d(const std::vector<std::array<float, 2>>& rows) {
  Tensor3 k(1, rows.size(), 2);
  for (std::size_t t = 0; t < rows.size(); ++t) {
    k.at(0, t, 0) = rows[t][0];
    k.at(0, t, 1) = rows[t][1];
  }
  return k;
}

// The kvzip tests' shape: one layer, two query heads on one KV head of 4 dims.
KvShape kvzip_shape() {
  KvShape s;
  s.n_layers = 1;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 4;
  return s;
}

void fill(Tensor3& t, std::uint64_t seed, double scale) {
  Rng r(seed);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(scale * r.normal());
}

}  // namespace

TEST_CASE("pool1d: hand-computed max and avg (zero padding counted)", "[score]") {
  const std::vector<double> x = {1, 5, 2, 0, 3};
  CHECK(pool1d(x, 5, 3, PoolKind::max) == std::vector<double>{5, 5, 5, 3, 3});
  const auto a = pool1d(x, 5, 3, PoolKind::avg);
  CHECK(a[0] == Approx(6.0 / 3));
  CHECK(a[2] == Approx(7.0 / 3));
  CHECK(a[4] == Approx(3.0 / 3));
  CHECK(pool1d(x, 3, 1, PoolKind::max) == std::vector<double>{1, 5, 2});
}

TEST_CASE("score_layer: fast path equals the f64 reference; mass sums to 1", "[score]") {
  const KvWindow m = meta(200, 24);
  Tensor3 q(4, 24, 16), k(2, 200, 16);
  fill(q, 1, 1.5);
  fill(k, 2, 1.0);
  for (ScoreMethod method : {ScoreMethod::snapkv, ScoreMethod::h2o, ScoreMethod::streamingllm}) {
    for (GqaReduce red : {GqaReduce::mean, GqaReduce::max}) {
      ScoreOptions o;
      o.method = method;
      o.window = 16;
      o.gqa_reduce = red;
      const auto a = score_layer(q, k, m, o), b = score_layer_ref(q, k, m, o);
      for (std::size_t h = 0; h < 2; ++h) {
        double total = 0;
        for (std::size_t t = 0; t < 200; ++t) {
          CHECK(a[h].score[t] == Approx(b[h].score[t]).epsilon(1e-4).margin(1e-9));
          CHECK(a[h].mass[t] == Approx(b[h].mass[t]).epsilon(1e-4).margin(1e-9));
          total += a[h].mass[t];
        }
        CHECK(total == Approx(1.0).epsilon(1e-9));
      }
      if (method == ScoreMethod::streamingllm) CHECK(a[0].score[199] == 199.0);
    }
  }
}

TEST_CASE("score_layer: query blocks (300 queries, window 260) equal the f64 reference", "[score]") {
  const KvWindow m = meta(400, 300);
  Tensor3 q(4, 300, 16), k(2, 400, 16);
  fill(q, 3, 1.5);
  fill(k, 4, 1.0);
  for (ScoreMethod method : {ScoreMethod::snapkv, ScoreMethod::h2o}) {
    ScoreOptions o;
    o.method = method;
    o.window = 260;
    const auto a = score_layer(q, k, m, o), b = score_layer_ref(q, k, m, o);
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t t = 0; t < 400; ++t) {
        CHECK(a[h].score[t] == Approx(b[h].score[t]).epsilon(1e-4).margin(1e-9));
        CHECK(a[h].mass[t] == Approx(b[h].mass[t]).epsilon(1e-4).margin(1e-9));
      }
    }
  }
}

TEST_CASE("score: a key aligned with the queries scores highest", "[score]") {
  const KvWindow m = meta(100, 8);
  Tensor3 q(4, 8, 16), k(2, 100, 16);
  fill(k, 3, 0.1);
  for (std::size_t h = 0; h < 4; ++h) {
    for (std::size_t i = 0; i < 8; ++i) q.at(h, i, 0) = 4.0f;
  }
  k.at(0, 37, 0) = 3.0f;  // KV head 0: token 37 dominates every query's attention
  ScoreOptions o;
  o.window = 8;
  o.kernel = 1;
  const auto s = score_layer(q, k, m, o);
  const auto best = std::max_element(s[0].score.begin(), s[0].score.begin() + 92) - s[0].score.begin();
  CHECK(best == 37);
  o.window = 9;  // larger than n_query
  CHECK_THROWS_AS(score_layer(q, k, m, o), InvalidInput);
  o.window = 8;
  o.kernel = 4;
  CHECK_THROWS_AS(score_layer(q, k, m, o), InvalidInput);
}

TEST_CASE("knorm and keydiff: hand-computed scores; they read no queries (window 0)", "[score]") {
  KvWindow m = meta(3, 1);
  m.n_heads = m.n_kv_heads = 1;
  m.head_dim = 2;
  Tensor3 q(1, 1, 2);
  const Tensor3 k = keys_2d({{3, 4}, {1, 0}, {0, 2}});
  ScoreOptions o;
  o.method = ScoreMethod::knorm;
  o.window = 0;
  const HeadScores n = score_head(q, k, 0, m, o);
  CHECK(n.score == std::vector<double>{-5.0, -1.0, -2.0});
  // KeyDiff: unit keys (0.6, 0.8), (1, 0), (0, 1); anchor a = (1.6, 1.8) / 3; score -cos(k, a).
  o.method = ScoreMethod::keydiff;
  const HeadScores kd = score_head(q, k, 0, m, o);
  const double an = std::hypot(1.6, 1.8);
  CHECK(kd.score[0] == Approx(-(0.6 * 1.6 + 0.8 * 1.8) / an).epsilon(1e-12));
  CHECK(kd.score[1] == Approx(-1.6 / an).epsilon(1e-12));
  CHECK(kd.score[2] == Approx(-1.8 / an).epsilon(1e-12));
  o.method = ScoreMethod::snapkv;  // window 0 is for the query-free scorers only
  o.kernel = 1;
  CHECK_THROWS_AS(score_head(q, k, 0, m, o), InvalidInput);
}

TEST_CASE("tova: the last query's attention averaged over every head of the layer", "[score]") {
  const KvWindow m = meta(50, 4);
  Tensor3 q(4, 4, 16), k(2, 50, 16);
  fill(q, 5, 1.5);
  fill(k, 6, 1.0);
  ScoreOptions o;
  o.method = ScoreMethod::tova;
  o.window = 1;
  const auto s = score_layer(q, k, m, o), ref = score_layer_ref(q, k, m, o);
  // By hand: softmax(q_h k^T / 4) of each query head's last query over its own KV head's keys.
  std::vector<double> want(50, 0.0);
  for (std::size_t qh = 0; qh < 4; ++qh) {
    std::vector<double> logit(50);
    double mx = -1e300, sum = 0;
    for (std::size_t t = 0; t < 50; ++t) {
      double dot = 0;
      for (std::size_t c = 0; c < 16; ++c) dot += static_cast<double>(q.at(qh, 3, c)) * k.at(qh / 2, t, c);
      logit[t] = dot / 4.0;
      mx = std::max(mx, logit[t]);
    }
    for (double& l : logit) sum += (l = std::exp(l - mx));
    for (std::size_t t = 0; t < 50; ++t) want[t] += logit[t] / sum / 4.0;
  }
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t t = 0; t < 50; ++t) {
      CHECK(s[h].score[t] == Approx(want[t]).epsilon(1e-5).margin(1e-12));
      CHECK(ref[h].score[t] == Approx(want[t]).epsilon(1e-12).margin(1e-15));
    }
  }
}

TEST_CASE("expected-attention: mean RoPE rotation by hand", "[score]") {
  // head_dim 2: one pair of frequency 1; positions 0 and 1.
  const std::vector<double> r = mean_rope_rotation(2, 10000.0, RopeLayout::rotate_half, 0, 2);
  const double c = (1 + std::cos(1.0)) / 2, s = std::sin(1.0) / 2;
  CHECK(r[0] == Approx(c).epsilon(1e-15));
  CHECK(r[1] == Approx(-s).epsilon(1e-15));
  CHECK(r[2] == Approx(s).epsilon(1e-15));
  CHECK(r[3] == Approx(c).epsilon(1e-15));
  // head_dim 4, interleaved: pairs (0, 1) and (2, 3); one position p: the RoPE rotation itself.
  const std::vector<double> one = mean_rope_rotation(4, 100.0, RopeLayout::interleaved, 7, 1);
  const double f1 = static_cast<double>(1.0f / 10.0f);  // 100^(-2/4) in f32
  CHECK(one[0 * 4 + 0] == Approx(std::cos(7.0)).epsilon(1e-12));
  CHECK(one[2 * 4 + 3] == Approx(-std::sin(7.0 * f1)).epsilon(1e-7));
  CHECK(one[3 * 4 + 2] == Approx(std::sin(7.0 * f1)).epsilon(1e-7));
  CHECK(one[0 * 4 + 2] == 0.0);
}

TEST_CASE("expected-attention: one repeated query, one future position = that query's attention there",
          "[score]") {
  // Every query equals x before RoPE, so the Gaussian is a point (no covariance) and, with one
  // future position T, the expected logits are those of x rotated to position T.
  for (RopeLayout layout : {RopeLayout::rotate_half, RopeLayout::interleaved}) {
    KvWindow m = meta(40, 10);
    m.rope_layout = layout;
    m.n_heads = m.n_kv_heads = 1;
    Tensor3 q(1, 10, 16), k(1, 40, 16), v(1, 40, 16);
    fill(k, 8, 1.0);
    fill(v, 9, 1.0);
    Rng rng(10);
    std::vector<float> x(16);
    for (float& e : x) e = static_cast<float>(rng.normal());
    for (std::size_t i = 0; i < 10; ++i) {
      std::copy(x.begin(), x.end(), q.row(0, i));
      apply_rope(q.row(0, i), 1, 30 + i, layout, RopeTable(16, m.rope_theta, 30 + i, 1));
    }
    std::vector<float> at_t = x;
    apply_rope(at_t.data(), 1, 40, layout, RopeTable(16, m.rope_theta, 40, 1));
    ScoreOptions o;
    o.method = ScoreMethod::expected_attention;
    o.window = 0;
    o.future = 1;
    const std::size_t sinks = 4;
    const HeadScores s = score_head(q, k, 0, m, o, &v, sinks);
    const auto ref = score_layer_ref(q, k, m, o, &v, sinks);
    std::vector<double> logit(36);
    double mx = -1e300, sum = 0;
    for (std::size_t t = 4; t < 40; ++t) {
      double dot = 0;
      for (std::size_t c = 0; c < 16; ++c) dot += static_cast<double>(at_t[c]) * k.at(0, t, c);
      mx = std::max(mx, logit[t - 4] = dot / 4.0);
    }
    for (double& l : logit) sum += (l = std::exp(l - mx));
    for (std::size_t t = 0; t < 40; ++t) {
      double vn = 0;
      for (std::size_t c = 0; c < 16; ++c) vn += static_cast<double>(v.at(0, t, c)) * v.at(0, t, c);
      const double want = t < 4 ? 0.0 : logit[t - 4] / sum * std::sqrt(vn);
      CHECK(s.score[t] == Approx(want).epsilon(1e-5).margin(1e-9));
      CHECK(ref[0].score[t] == Approx(want).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("expected-attention: a sequence moved by s positions scores as at 0 (a chunk needs no offset)",
          "[score]") {
  // Rows rotated to positions s.. but read as 0..: each query is undone to R_s q, and the mean
  // future rotation from T instead of s + T takes that R_s back (rotations of one frequency
  // commute), so the scores are those of the rows at 0..: --prefill-mode chunked scores a chunk
  // with chunk-relative positions.
  const std::size_t T = 48, s = 1000, d = 16;
  KvWindow m = meta(T, T);
  Tensor3 qpre(4, T, d), kpre(2, T, d), v(2, T, d);
  fill(qpre, 21, 1.5);
  fill(kpre, 22, 1.0);
  fill(v, 23, 1.0);
  auto rotated = [&](const Tensor3& x, std::size_t first) {
    Tensor3 y = x;
    for (std::size_t h = 0; h < y.dim0(); ++h) {
      apply_rope(y.row(h, 0), T, first, m.rope_layout, RopeTable(d, m.rope_theta, first, T));
    }
    return y;
  };
  ScoreOptions o;
  o.method = ScoreMethod::expected_attention;
  o.window = 0;
  o.future = 32;
  const auto at0 = score_layer(rotated(qpre, 0), rotated(kpre, 0), m, o, &v, 4);
  const Tensor3 qs = rotated(qpre, s), ks = rotated(kpre, s);
  const auto at_s = score_layer(qs, ks, m, o, &v, 4), ref_s = score_layer_ref(qs, ks, m, o, &v, 4);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t t = 0; t < T; ++t) {
      CHECK(at_s[h].score[t] == Approx(at0[h].score[t]).epsilon(1e-4).margin(1e-9));
      CHECK(ref_s[h].score[t] == Approx(at0[h].score[t]).epsilon(1e-4).margin(1e-9));
    }
  }
}

TEST_CASE("expected-attention: fast path equals the f64 reference; refusals", "[score]") {
  KvWindow m = meta(120, 120);
  Tensor3 q(4, 120, 16), k(2, 120, 16), v(2, 120, 16);
  fill(q, 11, 1.5);
  fill(k, 12, 1.0);
  fill(v, 13, 1.0);
  for (GqaReduce red : {GqaReduce::mean, GqaReduce::max}) {
    for (bool cov : {true, false}) {
      ScoreOptions o;
      o.method = ScoreMethod::expected_attention;
      o.window = 0;
      o.gqa_reduce = red;
      o.covariance = cov;
      o.future = 64;
      const auto a = score_layer(q, k, m, o, &v, 4), b = score_layer_ref(q, k, m, o, &v, 4);
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t t = 0; t < 120; ++t) CHECK(a[h].score[t] == Approx(b[h].score[t]).epsilon(1e-9).margin(1e-15));
      }
    }
  }
  ScoreOptions o;
  o.method = ScoreMethod::expected_attention;
  o.window = 0;
  const HeadScores all_sinks = score_head(q, k, 0, m, o, &v, 120);  // every token kept anyway
  CHECK(all_sinks.score == std::vector<double>(120, 0.0));
  m.rope_variant = "llama3 x8";
  CHECK_THROWS_AS(score_head(q, k, 0, m, o, &v, 4), InvalidInput);
}

TEST_CASE("lagkv: partition ranks by hand; the tail scores 1; short sequences by position", "[score]") {
  KvWindow m = meta(6, 1);
  m.n_heads = m.n_kv_heads = 1;
  m.head_dim = 2;
  Tensor3 q(1, 1, 2);
  // Partition 0 = tokens 0, 1 against the ranges of tokens 2, 3 ([0, 1] per channel): scaled
  // stds 0.707 and 0; partition 1 = tokens 2, 3 against tokens 4, 5 ([0, 2]): stds 0 and 0.177.
  const Tensor3 k = keys_2d({{0, 1}, {0.5f, 0.5f}, {0, 0}, {0.5f, 1}, {0, 0}, {2, 2}});
  ScoreOptions o;
  o.method = ScoreMethod::lagkv;
  o.window = 0;
  o.lag = 2;
  CHECK(score_head(q, k, 0, m, o, &k, 0).score == std::vector<double>{0.5, 0, 0, 0.5, 1, 1});
  o.lag = 4;  // 6 < sinks + 2 lag: the most recent win
  const std::vector<double> s = score_head(q, k, 0, m, o, &k, 1).score;
  CHECK(s[0] == 1.0);
  for (std::size_t t = 1; t < 6; ++t) CHECK(s[t] == Approx((t - 1) / 5.0));
  o.lag = 0;
  CHECK_THROWS_AS(score_head(q, k, 0, m, o, &k, 0), InvalidInput);
}

TEST_CASE("kvzip: the softmax covers the sinks, the chunk and the repeat up to each query", "[score]") {
  // Zero queries: each repeat query spreads its attention evenly over what it sees. Context 6
  // tokens, chunk [2, 5), 1 sink, 2 repeat rows: the first sees 1 + 3 + 1 keys, the second 6.
  const KvShape s = kvzip_shape();
  Tensor3 q(2, 8, 4), k(1, 8, 4);
  fill(k, 14, 1.0);
  std::vector<std::vector<double>> score(1, std::vector<double>(6, -1.0));
  kvzip_chunk_scores(q, k, s, 6, 2, 5, 1, score);
  CHECK(score[0] == std::vector<double>{-1.0, -1.0, 0.2, 0.2, 0.2, -1.0});  // only the chunk written
  // Random queries: the fast path (f32 logits) against the f64 reference; the maximum over the
  // group's heads and the repeat queries.
  fill(q, 15, 1.5);
  std::vector<std::vector<double>> ref(1, std::vector<double>(6, 0.0));
  kvzip_chunk_scores(q, k, s, 6, 2, 5, 1, score);
  kvzip_chunk_scores_ref(q, k, s, 6, 2, 5, 1, ref);
  for (std::size_t t = 2; t < 5; ++t) CHECK(score[0][t] == Approx(ref[0][t]).epsilon(1e-5));
  double want = 0;  // token 3 by hand: the largest of the 4 probabilities it gets
  for (std::size_t qh = 0; qh < 2; ++qh) {
    for (std::size_t j = 0; j < 2; ++j) {
      const std::vector<std::size_t> rows = j == 0 ? std::vector<std::size_t>{0, 2, 3, 4, 6}
                                                   : std::vector<std::size_t>{0, 2, 3, 4, 6, 7};
      double sum = 0, mine = 0;
      for (std::size_t r : rows) {
        double dot = 0;
        for (std::size_t c = 0; c < 4; ++c) dot += static_cast<double>(q.at(qh, 6 + j, c)) * k.at(0, r, c);
        const double e = std::exp(dot / 2.0);
        sum += e;
        if (r == 3) mine = e;
      }
      want = std::max(want, mine / sum);
    }
  }
  CHECK(ref[0][3] == Approx(want).epsilon(1e-12));
}

TEST_CASE("|W_o v|: CriticalKV's L1 group mean and KVzip+'s L2 per head, by hand and against the f64 reference",
          "[score][critical]") {
  // One KV head, two query heads of d 2, hidden 2: v = (1, 2); head 0's slice is the identity
  // (W_o v = (1, 2), L1 3), head 1's rows (0, 1) and (1, 1) (W_o v = (2, 3), L1 5): mean 4.
  Tensor3 v(1, 1, 2);
  v.at(0, 0, 0) = 1;
  v.at(0, 0, 1) = 2;
  RowMatrix wo(2, 4);
  wo << 1, 0, 0, 1,
        0, 1, 1, 1;
  CHECK(projected_value_norms(v, wo, 2)[0][0] == 4.0);
  CHECK(projected_value_norms_ref(v, wo, 2)[0][0] == 4.0);
  // KVzip+'s L2 per query head: (1, 2) -> sqrt(5), (2, 3) -> sqrt(13).
  CHECK(head_value_out_norms(v, wo, 2, 2)[1][0] == Approx(std::sqrt(13.0)).epsilon(1e-12));
  CHECK(head_value_out_norms_ref(v, wo, 2, 2)[0][0] == Approx(std::sqrt(5.0)).epsilon(1e-12));

  // GQA 2, 300 tokens (more than one block of the fast path), hidden 24. Tolerance: 1e-5 of the
  // sum of |v_i W_ji| (f32 products against f64).
  Tensor3 value(2, 300, 16);
  fill(value, 31, 1.0);
  RowMatrix w(24, 4 * 16);
  Rng r(32);
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(0.3 * r.normal());
  const auto fast = projected_value_norms(value, w, 4, 1);
  const auto ref = projected_value_norms_ref(value, w, 4);
  CHECK(projected_value_norms(value, w, 4, 3) == fast);
  const auto fast2 = head_value_out_norms(value, w, 4, 2, 2), ref2 = head_value_out_norms_ref(value, w, 4, 2);
  for (std::size_t h = 0; h < 4; ++h) {
    for (std::size_t t = 0; t < 300; ++t) CHECK(fast2[h][t] == Approx(ref2[h][t]).epsilon(1e-5));
  }
  CHECK_THROWS_AS(head_value_out_norms(value, w, 4, 3), std::logic_error);
  for (std::size_t g = 0; g < 2; ++g) {
    for (std::size_t t = 0; t < 300; ++t) {
      double bound = 0;
      for (std::size_t h = 2 * g; h < 2 * g + 2; ++h) {
        for (Eigen::Index j = 0; j < w.rows(); ++j) {
          for (std::size_t i = 0; i < 16; ++i) bound += std::abs(value.at(g, t, i) * w(j, static_cast<Eigen::Index>(h * 16 + i)));
        }
      }
      INFO("kv head " << g << " token " << t);
      CHECK(std::abs(fast[g][t] - ref[g][t]) <= 1e-5 * bound / 2);
    }
  }
}

TEST_CASE("CriticalKV's two stages: the best-scored first, then by (score + 1e-4) x norm", "[score][critical]") {
  // Positions 0..4 scored 5..1, norms 1, 0.1, 1, 2, 10. Keep 3, the first 1 by score (position
  // 0); weighed: 1: 0.40001, 2: 3.0003, 3: 4.0002, 4: 10.001 -> 4 and 3.
  const std::vector<double> score = {5, 4, 3, 2, 1}, norm = {1, 0.1, 1, 2, 10};
  std::vector<std::size_t> order = {0, 1, 2, 3, 4};
  critical_select(order, 3, 1, score, norm);
  CHECK(std::vector<std::size_t>(order.begin(), order.begin() + 3) == std::vector<std::size_t>{0, 4, 3});
  // Stage 1 alone (first = keep) leaves the score order; equal weighed scores keep the earlier position.
  order = {0, 1, 2, 3, 4};
  critical_select(order, 2, 2, score, norm);
  CHECK(order[0] == 0);
  CHECK(order[1] == 1);
  const std::vector<double> flat = {1, 1, 1}, ones = {1, 1, 1};
  order = {2, 0, 1};
  critical_select(order, 2, 0, flat, ones);
  CHECK(order == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("KVzip+: each probability over its query row's input norm, times the query head's value norm",
          "[score][kvzip]") {
  // Zero queries again (probabilities 0.2 and 1/6 per repeat row for the chunk [2, 5)); input
  // norms 2 (repeat row 6) and 0.5 (row 7); query head 0's value norms 1, 1, 1, head 1's 1, 3, 1.
  // Token 3: max(0.2 / 2, 1/6 / 0.5) x max over heads of (1, 3) = 1/3 x 3 = 1; tokens 2, 4: 1/3.
  const KvShape s = kvzip_shape();
  Tensor3 q(2, 8, 4), k(1, 8, 4);
  fill(k, 14, 1.0);
  const std::vector<double> input = {1, 1, 1, 1, 1, 1, 2, 0.5};
  const std::vector<std::vector<double>> out = {{1, 1, 1}, {1, 3, 1}};
  std::vector<std::vector<double>> score(1, std::vector<double>(6, 0.0)), ref = score;
  kvzip_chunk_scores(q, k, s, 6, 2, 5, 1, score, {&input, &out});
  CHECK(score[0][2] == Approx(1.0 / 3.0).epsilon(1e-12));
  CHECK(score[0][3] == Approx(1.0).epsilon(1e-12));
  CHECK(score[0][4] == Approx(1.0 / 3.0).epsilon(1e-12));
  // Random queries: the fast path against the reference, with the same weights.
  fill(q, 16, 1.5);
  kvzip_chunk_scores(q, k, s, 6, 2, 5, 1, score, {&input, &out});
  kvzip_chunk_scores_ref(q, k, s, 6, 2, 5, 1, ref, {&input, &out});
  for (std::size_t t = 2; t < 5; ++t) CHECK(score[0][t] == Approx(ref[0][t]).epsilon(1e-5));
  const std::vector<std::vector<double>> short_out = {{1, 1}, {1, 1}};
  CHECK_THROWS_AS(kvzip_chunk_scores(q, k, s, 6, 2, 5, 1, score, {&input, &short_out}), std::logic_error);
}

TEST_CASE("qfilter: the Gram-matrix direction equals the SVD reference on random queries", "[score]") {
  Tensor3 q(4, 50, 16);
  fill(q, 41, 1.0);
  for (std::size_t h = 0; h < 4; ++h) {  // a shared offset, as real queries have, differing per head
    for (std::size_t t = 0; t < 50; ++t) q.at(h, t, h) += 3.0f;
  }
  const auto fast = fit_qfilters(q, 2, 2), ref = fit_qfilters_ref(q, 2);
  for (std::size_t g = 0; g < 2; ++g) {
    for (std::size_t c = 0; c < 16; ++c) CHECK(fast[g][c] == Approx(ref[g][c]).margin(1e-9));
  }
  for (std::size_t h = 0; h < 4; ++h) {
    const auto a = query_direction(q.row(h, 0), 50, 16), b = query_direction_ref(q.row(h, 0), 50, 16);
    double norm = 0;
    for (std::size_t c = 0; c < 16; ++c) {
      CHECK(a[c] == Approx(b[c]).margin(1e-9));
      norm += a[c] * a[c];
    }
    CHECK(norm == Approx(1.0).epsilon(1e-12));
    CHECK(a[h] > 0.9);  // the offset's channel dominates, oriented along the majority
  }
}

TEST_CASE("qfilter: orientation, its tie rule, zero rows, the group mean and the scores by hand", "[score]") {
  auto direction = [](const std::vector<std::array<float, 2>>& rows, bool ref) {
    const Tensor3 t = keys_2d(rows);
    return ref ? query_direction_ref(t.row(0, 0), rows.size(), 2) : query_direction(t.row(0, 0), rows.size(), 2);
  };
  for (const bool ref : {false, true}) {
    // Gram [[17, 0], [0, 2]]: the first axis; every row projects positively on +e1.
    auto v = direction({{3, 0}, {2, 1}, {2, -1}}, ref);
    CHECK(v[0] == Approx(1.0).epsilon(1e-12));
    CHECK(v[1] == Approx(0.0).margin(1e-12));
    v = direction({{-3, 0}, {-2, 1}, {-2, -1}}, ref);
    CHECK(v[0] == Approx(-1.0).epsilon(1e-12));
    // One row each side: no strict majority, the larger sum of projections decides.
    v = direction({{2, 0}, {-1, 0}}, ref);
    CHECK(v[0] == Approx(1.0).epsilon(1e-12));
    v = direction({{1, 0}, {-2, 0}}, ref);
    CHECK(v[0] == Approx(-1.0).epsilon(1e-12));
    // Equal sums too: the first nonzero component positive.
    v = direction({{0, -1}, {0, 1}}, ref);
    CHECK(v[0] == Approx(0.0).margin(1e-12));
    CHECK(v[1] == Approx(1.0).epsilon(1e-12));
    v = direction({{0, 0}, {0, 0}}, ref);
    CHECK((v[0] == 0.0 && v[1] == 0.0));
  }
  // Two query heads on one KV head, along e1 and e2: the filter is -(e1 + e2) / 2.
  Tensor3 q(2, 3, 2);
  const float rows[2][3][2] = {{{3, 0}, {2, 1}, {2, -1}}, {{0, 3}, {1, 2}, {-1, 2}}};
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t t = 0; t < 3; ++t) std::copy(rows[h][t], rows[h][t] + 2, q.row(h, t));
  }
  const auto f = fit_qfilters(q, 1);
  CHECK(f[0][0] == Approx(-0.5).epsilon(1e-12));
  CHECK(f[0][1] == Approx(-0.5).epsilon(1e-12));
  // Scores -(f . k): keys along the queries' directions score highest.
  const auto s = qfilter_scores(keys_2d({{3, 1}, {-1, 0}, {0, 0}}), 0, {1.0, -2.0});
  CHECK(s == std::vector<double>{-1.0, 1.0, 0.0});
}

TEST_CASE("kvzap: the ridge fit from accumulated sums equals the centred reference, blocks and skipped rows "
          "included", "[score]") {
  Rng rng(41);
  const std::size_t n = 90, dim = 7, T = 3;
  RowMatrix x(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(dim));
  std::vector<std::vector<double>> y(T, std::vector<double>(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < dim; ++j) x(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = static_cast<float>(rng.normal() + 3.0);
    for (std::size_t k = 0; k < T; ++k) y[k][i] = rng.normal() + 0.5 * x(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(k)) - 5.0;
  }
  // Three blocks, the first 4 rows of each left out (as calibrate leaves out each dump's sinks).
  RidgeAccumulator acc(dim, T);
  std::vector<std::vector<double>> rows_x, rows_y;
  for (std::size_t b = 0; b < 3; ++b) {
    const RowMatrix xb = x.middleRows(static_cast<Eigen::Index>(30 * b), 30);
    std::vector<std::vector<double>> yb(T);
    for (std::size_t k = 0; k < T; ++k) yb[k].assign(y[k].begin() + 30 * b, y[k].begin() + 30 * (b + 1));
    acc.add(xb, yb, 4);
    for (std::size_t i = 4; i < 30; ++i) {
      const float* r = xb.row(static_cast<Eigen::Index>(i)).data();
      rows_x.emplace_back(r, r + dim);
      rows_y.push_back({});
      for (std::size_t k = 0; k < T; ++k) rows_y.back().push_back(yb[k][i]);
    }
  }
  REQUIRE(acc.rows() == 78);
  for (const double alpha : {1.0, 1e-3, 50.0}) {
    const KvzapLayer fast = acc.solve(alpha), ref = ridge_fit_ref(rows_x, rows_y, alpha);
    for (std::size_t k = 0; k < T; ++k) {
      INFO("alpha " << alpha << " target " << k);
      for (std::size_t j = 0; j < dim; ++j) CHECK(fast.weight[k][j] == Approx(ref.weight[k][j]).epsilon(1e-9).margin(1e-12));
      CHECK(fast.bias[k] == Approx(ref.bias[k]).epsilon(1e-9));
    }
    // R^2 from the sums against the residuals computed row by row.
    const std::vector<double> r2 = acc.r2(fast);
    for (std::size_t k = 0; k < T; ++k) {
      double mean = 0, sse = 0, sst = 0;
      for (const auto& r : rows_y) mean += r[k] / static_cast<double>(rows_y.size());
      for (std::size_t i = 0; i < rows_x.size(); ++i) {
        double p = fast.bias[k];
        for (std::size_t j = 0; j < dim; ++j) p += fast.weight[k][j] * rows_x[i][j];
        sse += (rows_y[i][k] - p) * (rows_y[i][k] - p);
        sst += (rows_y[i][k] - mean) * (rows_y[i][k] - mean);
      }
      CHECK(r2[k] == Approx(1 - sse / sst).epsilon(1e-9));
    }
  }
}

TEST_CASE("kvzap: an exact linear target is recovered as alpha goes to 0; the scores by hand", "[score]") {
  const std::size_t n = 12, dim = 3;
  RowMatrix x(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(dim));
  std::vector<std::vector<double>> y(1, std::vector<double>(n));
  for (std::size_t i = 0; i < n; ++i) {
    const float a = static_cast<float>(i), b = static_cast<float>((i * i) % 7), c = static_cast<float>((3 * i) % 5);
    x.row(static_cast<Eigen::Index>(i)) << a, b, c;
    y[0][i] = 2.0 * a - 0.5 * b + 0.25 * c + 1.5;
  }
  RidgeAccumulator acc(dim, 1);
  acc.add(x, y);
  const KvzapLayer f = acc.solve(1e-10);
  CHECK(f.weight[0][0] == Approx(2.0).epsilon(1e-7));
  CHECK(f.weight[0][1] == Approx(-0.5).epsilon(1e-7));
  CHECK(f.weight[0][2] == Approx(0.25).epsilon(1e-7));
  CHECK(f.bias[0] == Approx(1.5).epsilon(1e-7));
  CHECK(acc.r2(f)[0] == Approx(1.0).epsilon(1e-9));
  // A larger penalty shrinks the weights.
  CHECK(std::fabs(acc.solve(1e4).weight[0][0]) < 1.0);
  // s = b + W x, per head and token.
  KvzapLayer layer;
  layer.weight = {{1.0, 0.0, -1.0}, {0.5, 0.5, 0.5}};
  layer.bias = {0.25, -1.0};
  std::vector<std::vector<double>> s;
  kvzap_layer_scores(layer, x.topRows(3), s);
  REQUIRE(s.size() == 2);
  REQUIRE(s[0].size() == 3);
  // rows: (0, 0, 0), (1, 1, 3), (2, 4, 1)
  CHECK(s[0][0] == 0.25);
  CHECK(s[0][1] == 0.25 + 1.0 - 3.0);
  CHECK(s[0][2] == 0.25 + 2.0 - 1.0);
  CHECK(s[1][2] == -1.0 + 0.5 * 7.0);
}
