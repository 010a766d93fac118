#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numeric>

#include "akv/alloc/bits.h"
#include "akv/alloc/knapsack.h"
#include "akv/core/errors.h"
#include "akv/core/rng.h"

using namespace akv;

TEST_CASE("running moments equal the two-pass variance", "[bits]") {
  Rng r(4);
  std::vector<double> x(1000);
  for (auto& v : x) v = 3.0 + 2.0 * r.normal();
  RunningMoments m;
  for (double v : x) m.add(v);
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / 1000.0;
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  CHECK(m.variance() == Approx(var / 1000.0).epsilon(1e-9));
}

TEST_CASE("adakv-proxy: the seed's evidence list", "[bits]") {
  // High-importance heads get more bits.
  const auto b = adakv_proxy_bits({0.1, 0.1, 1.0, 3.0}, 3.0, 2, 3, 4);
  CHECK(b[3] >= b[2]);
  CHECK(b[2] >= b[0]);
  CHECK(b[3] == 4);
  // Average within +/- 0.5 of the target, on random importances.
  Rng r(9);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> imp(1 + r.below(32));
    for (auto& v : imp) v = std::exp(2.0 * r.normal());
    for (double target : {2.0, 2.5, 3.0, 3.5, 4.0}) {
      const auto bits = adakv_proxy_bits(imp, target, 2, 3, 4);
      const double avg = std::accumulate(bits.begin(), bits.end(), 0.0) / static_cast<double>(bits.size());
      INFO("trial " << trial << " target " << target << " avg " << avg);
      CHECK(std::fabs(avg - target) <= 0.5 + 1e-12);
      CHECK(adakv_proxy_bits(imp, target, 2, 3, 4) == bits);  // deterministic
    }
  }
  // Equal importance gives the uniform target; a single head gets the target.
  CHECK(adakv_proxy_bits({1, 1, 1, 1}, 3.0, 2, 3, 4) == std::vector<int>{3, 3, 3, 3});
  CHECK(adakv_proxy_bits({5.0}, 4.0, 2, 3, 4) == std::vector<int>{4});
  // The case the seed's default hides: target == lo is necessarily uniform.
  CHECK(adakv_proxy_bits({0.01, 1, 100, 1e4}, 2.0, 2, 3, 4) == std::vector<int>{2, 2, 2, 2});
  CHECK_THROWS_AS(adakv_proxy_bits({1, 2}, 3.0, 4, 3, 2), InvalidInput);  // lo > hi
  CHECK_THROWS_AS(adakv_proxy_bits({1, 2}, 5.0, 2, 3, 4), InvalidInput);  // target outside
}

TEST_CASE("knapsack equals brute force on small cases", "[bits]") {
  Rng r(11);
  const std::vector<int> cost = {2, 3, 4, 8};
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + r.below(5);
    std::vector<std::vector<double>> err(n, std::vector<double>(4));
    for (auto& e : err) {
      double v = r.uniform();
      for (auto& x : e) {
        x = v;
        v *= r.uniform();  // decreasing with bits, not necessarily convex
      }
    }
    const long long budget = static_cast<long long>(2 * n + r.below(6 * n + 1));
    const auto pick = knapsack_min_error(err, cost, budget);
    double got = 0;
    long long used = 0;
    for (std::size_t i = 0; i < n; ++i) {
      got += err[i][pick[i]];
      used += cost[pick[i]];
    }
    double best = INFINITY;
    std::vector<std::size_t> c(n, 0);
    std::function<void(std::size_t, long long, double)> rec = [&](std::size_t i, long long b, double e) {
      if (i == n) {
        best = std::min(best, e);
        return;
      }
      for (std::size_t j = 0; j < 4; ++j) {
        if (b + cost[j] <= budget) rec(i + 1, b + cost[j], e + err[i][j]);
      }
    };
    rec(0, 0, 0.0);
    INFO("trial " << trial);
    CHECK(used <= budget);
    CHECK(got == Approx(best).epsilon(1e-12));
  }
  CHECK_THROWS_AS(knapsack_min_error({{1, 0}, {1, 0}}, {2, 4}, 3), InvalidInput);  // needs 4
  CHECK_THROWS_AS(knapsack_min_error({{1}}, {}, 3), InvalidInput);
}
