#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "akv/alloc/alloc.h"
#include "akv/core/rng.h"

using namespace akv;

namespace {

SortedScores random_sorted(std::size_t heads, std::size_t max_len, std::uint64_t seed,
                           bool ties = false) {
  Rng r(seed);
  SortedScores s(heads);
  for (auto& v : s) {
    v.resize(1 + r.below(max_len));
    // Heads differ in concentration: some have a few large scores, others many small ones.
    const double k = 0.2 + 3.0 * r.uniform();
    for (auto& x : v) x = ties ? static_cast<double>(r.below(4)) : std::pow(r.uniform(), k);
    std::sort(v.begin(), v.end(), std::greater<>());
  }
  return s;
}

std::size_t sum(const std::vector<std::size_t>& c) { return std::accumulate(c.begin(), c.end(), std::size_t{0}); }

// Best total utility over all allocations with c_h in [min, len_h] (multiples of `step` above the
// minimum, or the full length), summing to `total`: exhaustive search.
double brute_force(const SortedScores& s, std::size_t total, std::size_t min_tokens) {
  double best = -1;
  std::vector<std::size_t> c(s.size());
  std::function<void(std::size_t, std::size_t)> rec = [&](std::size_t h, std::size_t left) {
    if (h == s.size()) {
      if (left == 0) best = std::max(best, retained_utility(s, c));
      return;
    }
    for (std::size_t n = std::min(min_tokens, s[h].size()); n <= s[h].size() && n <= left; ++n) {
      c[h] = n;
      rec(h + 1, left - n);
    }
  };
  rec(0, total);
  return best;
}

}  // namespace

TEST_CASE("largest remainder: exact integer totals", "[alloc]") {
  CHECK(largest_remainder({1.5, 1.5, 1.0}, 4) == std::vector<std::size_t>{2, 1, 1});
  CHECK(largest_remainder({0.2, 0.3, 0.5}, 1) == std::vector<std::size_t>{0, 0, 1});
  CHECK(largest_remainder({2.0, 2.0}, 4) == std::vector<std::size_t>{2, 2});
}

TEST_CASE("adakv exact-total: fast selection equals the plain reference; sums and floors", "[alloc]") {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const auto s = random_sorted(2 + seed % 7, 60, seed, seed % 3 == 0);
    std::size_t avail = 0;
    for (const auto& v : s) avail += v.size();
    const std::size_t base = 1 + seed % 20;
    const double alpha = (seed % 5) * 0.2;
    const auto a = allocate_adakv(s, base, alpha, CapacityRule::exact_total);
    const auto b = allocate_adakv_ref(s, base, alpha, CapacityRule::exact_total);
    INFO("seed " << seed);
    CHECK(a == b);
    CHECK(sum(a) == std::min(avail, s.size() * base));
    for (std::size_t h = 0; h < s.size(); ++h) {
      CHECK(a[h] <= s[h].size());
      // floor(alpha * base) unless the head has fewer tokens
      CHECK(a[h] >= std::min(s[h].size(), static_cast<std::size_t>(std::floor(alpha * base))));
    }
  }
  // Hand case: 2 heads, base 2, alpha 0: the top 4 of {9, 8, 7, 1} and {3, 2} are 9, 8, 7, 3.
  const SortedScores s = {{9, 8, 7, 1}, {3, 2}};
  CHECK(allocate_adakv(s, 2, 0.0, CapacityRule::exact_total) == std::vector<std::size_t>{3, 1});
  // alpha 0.5: 0.5*2 + 0.5*{3, 1} = {2.5, 1.5} -> largest remainder, tie to head 0: {3, 1}.
  CHECK(allocate_adakv(s, 2, 0.5, CapacityRule::exact_total) == std::vector<std::size_t>{3, 1});
  // alpha 1: uniform.
  CHECK(allocate_adakv(s, 2, 1.0, CapacityRule::exact_total) == std::vector<std::size_t>{2, 2});
  // Equal remainders in decimal: base 10, alpha 0.1, counts {25, 5, 0}: 25 - 1.5 = 23.5, 5 + 0.5
  // = 5.5, 1: the spare token goes to the lower head. (With the double nearest 0.1 the first
  // remainder is a hair below 1/2 and the second a hair above; f64 sums decide by rounding noise.)
  // The scores below give exactly those counts (25 of head 0's first 25, head 1's first 5).
  const SortedScores d = {{9, 8, 7, 6, 5, 4, 3, 2, 1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.09, 0.08,
                           0.07, 0.06, 0.05, 0.04, 0.03, 0.001},
                          {0.0105, 0.0104, 0.0103, 0.0102, 0.0101, 0.00001},
                          {0.000001}};
  CHECK(allocate_adakv(d, 10, 0.1, CapacityRule::exact_total) == std::vector<std::size_t>{24, 5, 1});
}

TEST_CASE("pyramid official schedule: integer division and a constant step", "[alloc]") {
  // base 70, beta 20: min 70 // 20 = 3, max 140 - 3 = 137.
  CHECK(pyramid_layer_budgets_official(2, 70, 20, 480) == std::vector<std::size_t>{137, 3});
  CHECK(pyramid_layer_budgets_official(3, 70, 20, 480) == std::vector<std::size_t>{137, 70, 3});
  // 32 layers: step (137 - 3) // 31 = 4, so the layers keep 2400 > 32 * 70 = 2240 in all.
  const auto b = pyramid_layer_budgets_official(32, 70, 20, 480);
  CHECK(b.front() == 137);
  CHECK(b.back() == 137 - 31 * 4);
  CHECK(sum(b) == 2400);
  // max capped by the tokens before the window: max 480, min 600 - 480 = 120, step 120.
  CHECK(pyramid_layer_budgets_official(4, 300, 20, 480) == std::vector<std::size_t>{480, 360, 240, 120});
  CHECK(pyramid_layer_budgets_official(1, 70, 20, 480) == std::vector<std::size_t>{70});
}

TEST_CASE("adakv official: torch's f32 arithmetic and ties to even", "[alloc]") {
  // torch.round(torch.tensor([[count]]) * (1 - alpha) + floor), torch 1.13.1, 2026-11-30:
  // (5, 0.3, 0) -> 3.5 -> 4 (f64 arithmetic gives 3.4999999999999996 -> 3), (3, 0.5, 1) -> 2.5 -> 2,
  // (1, 0.5, 1) -> 1.5 -> 2, (5, 0.2, 0) -> 4.0 -> 4, (7, 0.2, 2) -> 7.5999999 -> 8,
  // (15, 0.3, 1) -> 11.5 -> 12, (25, 0.3, 0) -> 17.5 -> 18.
  CHECK(official_capacity(5, 0.3, 0) == 4);
  CHECK(official_capacity(3, 0.5, 1) == 2);
  CHECK(official_capacity(1, 0.5, 1) == 2);
  CHECK(official_capacity(5, 0.2, 0) == 4);
  CHECK(official_capacity(7, 0.2, 2) == 8);
  CHECK(official_capacity(15, 0.3, 1) == 12);
  CHECK(official_capacity(25, 0.3, 0) == 18);
  CHECK(official_capacity(0, 0.2, 0) == 0);
  // Counts {3, 1} as above; alpha 0.5: floor int(2 * 0.5) = 1, round(2.5) = 2, round(1.5) = 2.
  const SortedScores s = {{9, 8, 7, 1}, {3, 2}};
  CHECK(allocate_adakv(s, 2, 0.0) == std::vector<std::size_t>{3, 1});
  CHECK(allocate_adakv(s, 2, 0.5) == std::vector<std::size_t>{2, 2});
  CHECK(allocate_adakv(s, 2, 1.0) == std::vector<std::size_t>{2, 2});
  // base above what a head has: nothing is evicted; base equal to it: the rule still applies.
  const SortedScores eq = {{5, 4, 3, 2, 1, 0.5, 0.4, 0.3, 0.2}, {9, 8, 7, 6, 5, 4, 3, 2, 1}};
  CHECK(allocate_adakv(eq, 10, 0.2) == std::vector<std::size_t>{9, 9});
  // 9 each: count 9, floor int(9 * 0.2) = 1: round(7.2 + 1) = 8 of 9.
  CHECK(allocate_adakv(eq, 9, 0.2) == std::vector<std::size_t>{8, 8});
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const auto r = random_sorted(2 + seed % 7, 60, seed, seed % 3 == 0);
    const std::size_t base = 1 + seed % 20;
    const double alpha = (seed % 5) * 0.2;
    const auto a = allocate_adakv(r, base, alpha);
    INFO("seed " << seed);
    CHECK(a == allocate_adakv_ref(r, base, alpha));
    for (std::size_t h = 0; h < r.size(); ++h) CHECK(a[h] <= r[h].size());
  }
}

TEST_CASE("waterfill: greedy equals brute force on concave utilities", "[alloc]") {
  for (std::uint64_t seed = 0; seed < 150; ++seed) {
    const auto s = random_sorted(2 + seed % 3, 7, 1000 + seed);
    std::size_t avail = 0;
    for (const auto& v : s) avail += v.size();
    const std::size_t min_tokens = seed % 2;
    std::size_t floor_total = 0;
    for (const auto& v : s) floor_total += std::min(min_tokens, v.size());
    const std::size_t total = floor_total + seed % (avail - floor_total + 1);
    const auto c = allocate_waterfill(s, total, min_tokens, 1);
    INFO("seed " << seed << " total " << total);
    CHECK(sum(c) == total);
    CHECK(retained_utility(s, c) == Approx(brute_force(s, total, min_tokens)).epsilon(1e-12));
  }
  // Step > 1 still sums exactly (last award may be partial).
  const SortedScores s = {{5, 4, 3, 2, 1}, {6, 0.5, 0.4}};
  const auto c = allocate_waterfill(s, 5, 0, 2);
  CHECK(sum(c) == 5);
}

TEST_CASE("uniform and pyramid budgets", "[alloc]") {
  const SortedScores s = {{3, 2, 1}, {9, 8, 7, 6, 5, 4}, {1}};
  // base 3: head 2 has only 1 token; its 2 spare tokens go to the best next scores (head 1).
  const auto u = allocate_uniform(s, 3);
  CHECK(u == std::vector<std::size_t>{3, 5, 1});
  CHECK(sum(allocate_uniform(s, 100)) == 10);
  for (std::size_t layers : {1u, 2u, 5u, 32u}) {
    for (std::size_t base : {1u, 10u, 77u}) {
      const auto b = pyramid_layer_budgets(layers, base, 20.0, 1000);
      CHECK(sum(b) == layers * base);
      CHECK(std::is_sorted(b.rbegin(), b.rend()));  // decreasing over depth
    }
  }
  // Clamped at the cap, the excess moves to other layers.
  const auto b = pyramid_layer_budgets(4, 10, 20.0, 12);
  CHECK(sum(b) == 40);
  for (auto v : b) CHECK(v <= 12);
}

TEST_CASE("Ada-KV with kvpress's capacity rule: each head's best protected, the rest by the best of all heads",
          "[alloc][adakv]") {
  // By hand: base 2 per head, alpha 0.5: int(2 x 0.5) = 1 protected each (0.9, 0.1); the other 2
  // places go to the best remaining scores of both heads, 0.8 and 0.75.
  const SortedScores s = {{0.9, 0.8, 0.75}, {0.1, 0.05, 0.01}};
  CHECK(allocate_adakv(s, 2, 0.5, CapacityRule::kvpress) == std::vector<std::size_t>{3, 1});
  // alpha 1: int(2 x 1) = 2 protected each, nothing left to share.
  CHECK(allocate_adakv(s, 2, 1.0, CapacityRule::kvpress) == std::vector<std::size_t>{2, 2});
  // Forced tokens count in kvpress's n_kept and take the protected places first: base 2 + 2
  // forced at alpha 0.5 protects int(4 x 0.5) = 2, the forced ones: the 4 places by score alone.
  CHECK(allocate_adakv(s, 2, 0.5, CapacityRule::kvpress, 2) == std::vector<std::size_t>{3, 1});
  const SortedScores skew = {{0.9, 0.8, 0.75, 0.7}, {0.1, 0.05, 0.01, 0.0}};
  CHECK(allocate_adakv(skew, 3, 0.5, CapacityRule::kvpress, 1) == std::vector<std::size_t>{4, 2});  // int(4 x 0.5) - 1 = 1 protected
  // Totals are exact; nothing is evicted when the heads have no more than the budget.
  CHECK(allocate_adakv(s, 3, 0.2, CapacityRule::kvpress) == std::vector<std::size_t>{3, 3});
  // The fast path equals the reference on random scores, ties included.
  Rng r(17);
  for (int trial = 0; trial < 50; ++trial) {
    SortedScores x(1 + r.below(6));
    for (auto& h : x) {
      h.resize(r.below(40));
      for (auto& v : h) v = std::round(r.uniform() * 20) / 20;  // many ties
      std::sort(h.rbegin(), h.rend());
    }
    const std::size_t base = r.below(30), forced = r.below(8);
    const double alpha = r.uniform();
    const auto a = allocate_adakv(x, base, alpha, CapacityRule::kvpress, forced);
    CHECK(a == allocate_adakv_ref(x, base, alpha, CapacityRule::kvpress, forced));
    std::size_t total = 0, have = 0;
    for (std::size_t h = 0; h < x.size(); ++h) {
      CHECK(a[h] <= x[h].size());
      total += a[h];
      have += x[h].size();
    }
    CHECK(total == std::min(have, x.size() * base));
  }
}

TEST_CASE("duo: round(H base / n) heads keep everything, by their best score, ties to the lower head", "[alloc]") {
  // 4 heads of 10 selectable tokens (best 0.5, 0.9, 0.5, 0): base 5 -> round(4 x 5 / 10) = 2 heads
  // keep all: head 1, then head 0 (the tie at 0.5 goes to the lower head).
  SortedScores s = {{0.5, 0.1}, {0.9}, {0.5, 0.4}, {0.0}};
  for (auto& h : s) h.resize(10, 0.0);
  CHECK(allocate_duo(s, 5) == std::vector<std::size_t>{10, 10, 0, 0});
  CHECK(allocate_duo(s, 4) == std::vector<std::size_t>{10, 10, 0, 0});  // round(1.6)
  CHECK(allocate_duo(s, 2) == std::vector<std::size_t>{0, 10, 0, 0});   // round(0.8)
  CHECK(allocate_duo(s, 1) == std::vector<std::size_t>{0, 0, 0, 0});    // round(0.4)
  CHECK(allocate_duo(s, 10) == std::vector<std::size_t>{10, 10, 10, 10});
  // A head with fewer tokens (shorter than the others) ranks by what it has; empty heads last.
  SortedScores t = {{}, {0.2, 0.1}, {0.3}};
  CHECK(allocate_duo(t, 1) == std::vector<std::size_t>{0, 2, 1});  // round(3 x 1 / 2) = 2 heads
}

TEST_CASE("duo with given head scores: they rank the heads, not the token scores; same ties", "[alloc]") {
  SortedScores s = {{0.5, 0.1}, {0.9}, {0.5, 0.4}, {0.0}};
  for (auto& h : s) h.resize(10, 0.0);
  const std::vector<double> heads = {0.1, 0.0, 0.7, 0.7};  // heads 2 and 3 tie: 2 first
  CHECK(allocate_duo(s, 5, &heads) == std::vector<std::size_t>{0, 0, 10, 10});
  CHECK(allocate_duo(s, 2, &heads) == std::vector<std::size_t>{0, 0, 10, 0});
  CHECK(allocate_duo(s, 8, &heads) == std::vector<std::size_t>{10, 0, 10, 10});  // round(3.2)
  const std::vector<double> short_list = {1.0};
  CHECK_THROWS_AS(allocate_duo(s, 5, &short_list), std::logic_error);
}
