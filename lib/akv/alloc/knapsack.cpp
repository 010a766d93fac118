#include "akv/alloc/knapsack.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "akv/core/errors.h"

namespace akv {

std::optional<std::vector<std::size_t>> knapsack(const std::vector<std::vector<double>>& err,
                                                 const std::vector<std::vector<long long>>& cost,
                                                 long long budget) {
  const std::size_t n = err.size();
  long long reach = 0;  // the largest total any choice can have
  for (const auto& c : cost) reach += c.empty() ? 0 : *std::max_element(c.begin(), c.end());
  const std::size_t B = static_cast<std::size_t>(std::max<long long>(0, std::min(budget, reach)));
  const double inf = std::numeric_limits<double>::infinity();
  // best[i][b]: minimal error of items [0, i) using exactly b cost units; choice: the option.
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(B + 1, inf));
  std::vector<std::vector<int>> choice(n + 1, std::vector<int>(B + 1, -1));
  best[0][0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t b = 0; b <= B; ++b) {
      if (best[i][b] == inf) continue;
      for (std::size_t j = 0; j < cost[i].size(); ++j) {
        const std::size_t nb = b + static_cast<std::size_t>(cost[i][j]);
        if (nb > B) continue;
        const double v = best[i][b] + err[i][j];
        if (v < best[i + 1][nb]) {
          best[i + 1][nb] = v;
          choice[i + 1][nb] = static_cast<int>(j);
        }
      }
    }
  }
  std::size_t end = B + 1;
  for (std::size_t b = 0; b <= B; ++b) {
    if (best[n][b] < inf && (end > B || best[n][b] < best[n][end])) end = b;
  }
  if (end > B) return std::nullopt;
  std::vector<std::size_t> pick(n);
  for (std::size_t i = n; i > 0; --i) {
    const auto j = static_cast<std::size_t>(choice[i][end]);
    pick[i - 1] = j;
    end -= static_cast<std::size_t>(cost[i - 1][j]);
  }
  return pick;
}

std::vector<std::size_t> knapsack_min_error(const std::vector<std::vector<double>>& err,
                                            const std::vector<int>& cost, long long budget) {
  if (cost.empty()) throw InvalidInput("empty candidate set", {"", "--bits", ""});
  const long long n = static_cast<long long>(err.size());
  const int cmin = *std::min_element(cost.begin(), cost.end());
  if (n * cmin > budget) {
    throw InvalidInput("budget below the cheapest choice (needs " + std::to_string(n * cmin) + ")",
                       {"", "budget", std::to_string(budget)});
  }
  const std::vector<std::vector<long long>> costs(err.size(), std::vector<long long>(cost.begin(), cost.end()));
  return *knapsack(err, costs, budget);
}

std::vector<std::size_t> knapsack_real(const std::vector<std::vector<double>>& err,
                                       const std::vector<std::vector<double>>& cost, double budget,
                                       std::size_t resolution) {
  double min_total = 0;
  for (const auto& c : cost) {
    if (c.empty()) throw InvalidInput("empty candidate set", {"", "candidates"});
    min_total += *std::min_element(c.begin(), c.end());
  }
  if (min_total > budget) {
    throw InvalidInput("byte budget too small: the cheapest choice of every head needs " +
                           format_number(std::ceil(min_total)) + " bytes",
                       {"", "--bytes", format_number(budget) + " bytes"});
  }
  const double unit = budget / static_cast<double>(resolution);
  std::vector<std::vector<long long>> units(cost.size());
  for (std::size_t i = 0; i < cost.size(); ++i) {
    for (double c : cost[i]) units[i].push_back(static_cast<long long>(std::ceil(c / unit - 1e-9)));
  }
  auto pick = knapsack(err, units, static_cast<long long>(resolution));
  if (!pick) {
    throw InvalidInput("byte budget too small after rounding to " + std::to_string(resolution) + " units",
                       {"", "--bytes", format_number(budget)});
  }
  return *pick;
}

}  // namespace akv
