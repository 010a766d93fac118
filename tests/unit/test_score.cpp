#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/score/score.h"

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
