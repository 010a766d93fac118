#pragma once
// The multiple-choice knapsack of akv: every item (a head, or a head's keys or values) picks
// exactly one option; minimise the summed error with the summed cost within a budget. One exact
// dynamic programme over integer cost totals serves both the per-head bit widths of `akv
// calibrate` (integer bits) and the tokens x bits candidates of `allocate --method joint` (bytes,
// rounded up to budget units).
#include <cstddef>
#include <optional>
#include <vector>

namespace akv {

// Exact DP: item i picks option j (cost[i][j] >= 0 units, error err[i][j]) with summed cost <=
// budget, minimising the summed error. Ties: the lowest cost total with the minimal error, and
// for each total the lower option index reached first (items in order, totals ascending).
// nullopt when no choice fits.
std::optional<std::vector<std::size_t>> knapsack(const std::vector<std::vector<double>>& err,
                                                 const std::vector<std::vector<long long>>& cost,
                                                 long long budget);

// Every item has the same options: cost[j] bits. Throws InvalidInput when even the cheapest
// choice exceeds the budget (or there are no options).
std::vector<std::size_t> knapsack_min_error(const std::vector<std::vector<double>>& err,
                                            const std::vector<int>& cost, long long budget);

// Real costs: rounded up to units of budget / resolution (so the result always fits); exact
// when costs are multiples of the unit. Throws InvalidInput naming the minimum when even the
// cheapest choice of every item exceeds the budget.
std::vector<std::size_t> knapsack_real(const std::vector<std::vector<double>>& err,
                                       const std::vector<std::vector<double>>& cost, double budget,
                                       std::size_t resolution = 20000);

}  // namespace akv
