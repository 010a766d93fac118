#include "akv/alloc/alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <queue>
#include <tuple>

#include "akv/core/errors.h"

namespace akv {
namespace {

std::size_t total_available(const SortedScores& s) {
  std::size_t n = 0;
  for (const auto& v : s) n += v.size();
  return n;
}

std::vector<std::size_t> all_of(const SortedScores& s) {
  std::vector<std::size_t> c(s.size());
  for (std::size_t h = 0; h < s.size(); ++h) c[h] = s[h].size();
  return c;
}

// Gives `remaining` more tokens, one at a time, to the head with room whose next score is the
// highest (ties: lower head).
void fill_by_next_score(const SortedScores& s, std::vector<std::size_t>& c, std::size_t remaining) {
  using Item = std::tuple<double, std::size_t>;  // (next score, head)
  auto cmp = [](const Item& a, const Item& b) {
    return std::get<0>(a) < std::get<0>(b) ||
           (std::get<0>(a) == std::get<0>(b) && std::get<1>(a) > std::get<1>(b));
  };
  std::priority_queue<Item, std::vector<Item>, decltype(cmp)> q(cmp);
  for (std::size_t h = 0; h < s.size(); ++h) {
    if (c[h] < s[h].size()) q.emplace(s[h][c[h]], h);
  }
  while (remaining > 0 && !q.empty()) {
    const std::size_t h = std::get<1>(q.top());
    q.pop();
    ++c[h];
    --remaining;
    if (c[h] < s[h].size()) q.emplace(s[h][c[h]], h);
  }
}

// Clamps every head to what it has and hands the excess to heads with room.
void clamp_and_refill(const SortedScores& s, std::vector<std::size_t>& c) {
  std::size_t excess = 0;
  for (std::size_t h = 0; h < s.size(); ++h) {
    if (c[h] > s[h].size()) {
      excess += c[h] - s[h].size();
      c[h] = s[h].size();
    }
  }
  fill_by_next_score(s, c, excess);
}

// alpha*base + (1 - alpha)*count_h = count_h + alpha*(base - count_h) in exact arithmetic, alpha
// taken to 9 decimal places (the value a user writes: 0.2 is 2/10, not the double nearest it):
// each capacity is N_h / 10^9 with an integer N_h (128-bit). The integer parts, then one more
// token for the largest remainders N_h mod 10^9, ties to the lower head, until the total is
// H*base: no rounding, so no compiler flag can change the result.
std::vector<std::size_t> exact_total_capacities(const std::vector<std::size_t>& count, std::size_t base,
                                                double alpha) {
  __extension__ typedef __int128 i128;  // GCC and Clang; -Wpedantic accepts it marked so
  constexpr std::int64_t kScale = 1000000000;
  const std::int64_t a = std::llround(alpha * static_cast<double>(kScale));  // alpha in [0, 1]
  const std::size_t n = count.size();
  std::uint64_t total = 0;
  for (const std::size_t c : count) total += c;
  std::vector<std::int64_t> rem(n);
  std::vector<std::size_t> c(n);
  std::uint64_t sum = 0;
  for (std::size_t h = 0; h < n; ++h) {
    const i128 num = static_cast<i128>(count[h]) * kScale +
                     static_cast<i128>(a) * (static_cast<i128>(base) - static_cast<i128>(count[h]));
    c[h] = static_cast<std::size_t>(num / kScale);  // num >= 0 for alpha in [0, 1]
    rem[h] = static_cast<std::int64_t>(num % kScale);
    sum += c[h];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rem[x] > rem[y]; });
  for (std::size_t i = 0; sum < total && i < n; ++i, ++sum) ++c[order[i]];
  return c;
}

std::vector<std::size_t> adakv_from_counts(const SortedScores& s, const std::vector<std::size_t>& count,
                                           std::size_t base, double alpha, CapacityRule rule) {
  if (rule == CapacityRule::official) {
    // Python's int(base_capacity * floor_ratio): the double product truncated.
    const auto floor_capacity = static_cast<std::size_t>(static_cast<double>(base) * alpha);
    std::vector<std::size_t> c(s.size());
    for (std::size_t h = 0; h < s.size(); ++h) {
      c[h] = std::min(official_capacity(count[h], alpha, floor_capacity), s[h].size());
    }
    return c;
  }
  std::vector<std::size_t> c = exact_total_capacities(count, base, alpha);
  clamp_and_refill(s, c);
  return c;
}

}  // namespace

std::size_t official_capacity(std::size_t count, double alpha, std::size_t floor_capacity) {
  // torch: int64 counts * python float -> f32 tensor (f32(1 - alpha), the product rounded to
  // f32), + int -> f32 add, torch.round -> nearest, ties to even. A product or sum of two f32
  // values is exact in f64, so each cast below is exactly one f32 rounding: no FMA contraction
  // or excess precision can change the result.
  const float keep = static_cast<float>(1.0 - alpha);
  const auto product = static_cast<float>(static_cast<double>(static_cast<float>(count)) * static_cast<double>(keep));
  const auto sum = static_cast<float>(static_cast<double>(product) + static_cast<double>(static_cast<float>(floor_capacity)));
  const float r = std::nearbyint(sum);  // default rounding mode: to nearest, ties to even
  return r <= 0.0f ? 0 : static_cast<std::size_t>(r);
}

std::vector<std::size_t> largest_remainder(const std::vector<double>& real, std::size_t total) {
  std::vector<std::size_t> c(real.size());
  std::size_t sum = 0;
  for (std::size_t i = 0; i < real.size(); ++i) {
    c[i] = static_cast<std::size_t>(std::floor(std::max(0.0, real[i]) + 1e-9));
    sum += c[i];
  }
  std::vector<std::size_t> order(real.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto frac = [&](std::size_t i) { return std::max(0.0, real[i]) - static_cast<double>(c[i]); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return frac(a) > frac(b); });
  for (std::size_t k = 0; sum < total && !order.empty(); k = (k + 1) % order.size()) {
    ++c[order[k]];
    ++sum;
  }
  while (sum > total) {  // only from rounding noise: take from the smallest remainders
    for (auto it = order.rbegin(); it != order.rend() && sum > total; ++it) {
      if (c[*it] > 0) {
        --c[*it];
        --sum;
      }
    }
  }
  return c;
}

std::vector<std::size_t> allocate_uniform(const SortedScores& s, std::size_t base) {
  if (s.size() * base >= total_available(s)) return all_of(s);
  std::vector<std::size_t> c(s.size(), base);
  clamp_and_refill(s, c);
  return c;
}

namespace {

// How many of the top n entries of the flattened scores each head holds, leaving out the first
// skip[h] of head h (a total order: score desc, head asc, rank asc). Each list is sorted, so the
// winners of head h are a prefix of what is left of it; nth_element finds them.
std::vector<std::size_t> top_counts(const SortedScores& s, const std::vector<std::size_t>& skip, std::size_t n) {
  struct Entry {
    double score;
    std::size_t head, rank;
  };
  std::vector<Entry> flat;
  flat.reserve(total_available(s));
  for (std::size_t h = 0; h < s.size(); ++h) {
    for (std::size_t r = skip[h]; r < s[h].size(); ++r) flat.push_back({s[h][r], h, r});
  }
  auto before = [](const Entry& a, const Entry& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.head != b.head) return a.head < b.head;
    return a.rank < b.rank;
  };
  std::vector<std::size_t> count(s.size(), 0);
  n = std::min(n, flat.size());
  if (n == 0) return count;
  std::nth_element(flat.begin(), flat.begin() + static_cast<std::ptrdiff_t>(n - 1), flat.end(), before);
  for (std::size_t i = 0; i < n; ++i) ++count[flat[i].head];
  return count;
}

// The same by a full stable sort (the reference).
std::vector<std::size_t> top_counts_ref(const SortedScores& s, const std::vector<std::size_t>& skip, std::size_t n) {
  std::vector<std::pair<double, std::size_t>> flat;  // (score, head), heads and ranks ascending
  for (std::size_t h = 0; h < s.size(); ++h) {
    for (std::size_t r = skip[h]; r < s[h].size(); ++r) flat.emplace_back(s[h][r], h);
  }
  std::stable_sort(flat.begin(), flat.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::size_t> count(s.size(), 0);
  for (std::size_t i = 0; i < std::min(n, flat.size()); ++i) ++count[flat[i].second];
  return count;
}

using TopCounts = std::vector<std::size_t> (*)(const SortedScores&, const std::vector<std::size_t>&, std::size_t);

std::vector<std::size_t> adakv_with(TopCounts top, const SortedScores& s, std::size_t base, double alpha,
                                    CapacityRule rule, std::size_t forced) {
  const std::size_t total = s.size() * base;
  // Official: nothing is evicted when base > prefix; at base == prefix the rule still applies.
  if (rule == CapacityRule::official ? total > total_available(s) : total >= total_available(s)) return all_of(s);
  std::vector<std::size_t> skip(s.size(), 0);
  if (rule == CapacityRule::kvpress) {
    std::size_t used = 0;
    for (std::size_t h = 0; h < s.size(); ++h) {
      skip[h] = kvpress_protected(base, forced, alpha, s[h].size());
      used += skip[h];
    }
    std::vector<std::size_t> c = top(s, skip, total - std::min(total, used));
    for (std::size_t h = 0; h < s.size(); ++h) c[h] += skip[h];
    return c;
  }
  return adakv_from_counts(s, top(s, skip, total), base, alpha, rule);
}

}  // namespace

std::vector<std::size_t> allocate_duo(const SortedScores& s, std::size_t base, const std::vector<double>* head_scores) {
  if (head_scores && head_scores->size() != s.size()) throw std::logic_error("allocate_duo: one head score per head");
  std::size_t n = 0;
  for (const auto& h : s) n = std::max(n, h.size());
  std::vector<std::size_t> c(s.size(), 0);
  if (n == 0) return c;
  const auto r = std::min<std::size_t>(
      s.size(), static_cast<std::size_t>(std::llround(static_cast<double>(s.size() * base) / static_cast<double>(n))));
  std::vector<std::size_t> order(s.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto best = [&](std::size_t h) { return head_scores ? (*head_scores)[h] : s[h].empty() ? -INFINITY : s[h].front(); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return best(a) > best(b); });
  for (std::size_t i = 0; i < r; ++i) c[order[i]] = s[order[i]].size();
  return c;
}

std::size_t kvpress_protected(std::size_t base, std::size_t forced, double alpha, std::size_t selectable) {
  // Python's int(n_kept * alpha_safeguard); the forced tokens take the first protected places.
  const auto safe = static_cast<std::size_t>(static_cast<double>(base + forced) * alpha);
  return std::min(safe > forced ? safe - forced : 0, selectable);
}

std::vector<std::size_t> allocate_adakv(const SortedScores& s, std::size_t base, double alpha, CapacityRule rule,
                                        std::size_t forced) {
  return adakv_with(top_counts, s, base, alpha, rule, forced);
}

std::vector<std::size_t> allocate_adakv_ref(const SortedScores& s, std::size_t base, double alpha,
                                            CapacityRule rule, std::size_t forced) {
  return adakv_with(top_counts_ref, s, base, alpha, rule, forced);
}

std::vector<std::size_t> allocate_waterfill(const SortedScores& s, std::size_t total,
                                            std::size_t min_tokens, std::size_t step) {
  if (step == 0) throw InvalidInput("water-filling step must be >= 1", {"", "--step", "0"});
  if (total >= total_available(s)) return all_of(s);
  std::vector<std::size_t> c(s.size());
  std::size_t used = 0;
  for (std::size_t h = 0; h < s.size(); ++h) {
    c[h] = std::min(min_tokens, s[h].size());
    used += c[h];
  }
  if (used > total) {
    throw InvalidInput("budget below the water-filling minimum of every head",
                       {"", "--min-tokens", std::to_string(min_tokens)});
  }
  while (used < total) {
    std::size_t best = s.size();
    double best_gain = -INFINITY;
    std::size_t best_n = 0;
    for (std::size_t h = 0; h < s.size(); ++h) {
      const std::size_t n = std::min({step, s[h].size() - c[h], total - used});
      if (n == 0) continue;
      double gain = 0;
      for (std::size_t r = c[h]; r < c[h] + n; ++r) gain += s[h][r];
      if (gain > best_gain) {
        best_gain = gain;
        best = h;
        best_n = n;
      }
    }
    if (best == s.size()) break;
    c[best] += best_n;
    used += best_n;
  }
  return c;
}

std::vector<std::size_t> pyramid_layer_budgets(std::size_t n_layers, std::size_t base, double beta,
                                               std::size_t cap) {
  if (!(beta >= 1.0)) throw InvalidInput("pyramid beta must be >= 1", {"", "--beta", std::to_string(beta)});
  std::vector<double> real(n_layers, static_cast<double>(base));
  if (n_layers > 1) {
    const double lo = static_cast<double>(base) / beta, hi = 2.0 * static_cast<double>(base) - lo;
    for (std::size_t l = 0; l < n_layers; ++l) {
      real[l] = hi - static_cast<double>(l) * (hi - lo) / static_cast<double>(n_layers - 1);
    }
  }
  std::vector<std::size_t> b = largest_remainder(real, n_layers * base);
  std::size_t excess = 0;
  for (auto& v : b) {
    if (v > cap) {
      excess += v - cap;
      v = cap;
    }
  }
  for (auto& v : b) {
    const std::size_t add = std::min(excess, cap - v);
    v += add;
    excess -= add;
  }
  return b;
}

std::vector<std::size_t> pyramid_layer_budgets_official(std::size_t n_layers, std::size_t base,
                                                        double beta, std::size_t cap) {
  if (!(beta >= 1.0)) throw InvalidInput("pyramid beta must be >= 1", {"", "--beta", format_number(beta)});
  if (n_layers <= 1) return std::vector<std::size_t>(n_layers, std::min(base, cap));
  auto lo = static_cast<std::size_t>(std::floor(static_cast<double>(base) / beta));
  std::size_t hi = 2 * base - lo;
  if (hi >= cap) {
    hi = cap;
    lo = 2 * base - std::min(2 * base, hi);
  }
  const std::size_t step = (hi - std::min(hi, lo)) / (n_layers - 1);
  std::vector<std::size_t> b(n_layers);
  for (std::size_t l = 0; l < n_layers; ++l) b[l] = hi - l * step;
  return b;
}

double retained_utility(const SortedScores& s, const std::vector<std::size_t>& c) {
  double u = 0;
  for (std::size_t h = 0; h < s.size(); ++h) {
    for (std::size_t r = 0; r < c[h] && r < s[h].size(); ++r) u += s[h][r];
  }
  return u;
}

}  // namespace akv
