#pragma once
// The partial JSON outputs of sharded runs (docs/scale.md; Shard and ShardSet: core/shard.h).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/shard.h"

namespace akv {

// Checks that partial JSON outputs (each with the file it came from) are shards 1..N of one run:
// the format `format`, equal values at `same` (inputs, parameters), then core/shard.h's ShardSet
// (one shard count, every shard once). Returns the parts' indices in shard order. InvalidInput
// naming the file and field.
std::vector<std::size_t> shard_order(const std::vector<std::pair<std::string, nlohmann::json>>& parts,
                                     const std::string& format, std::initializer_list<const char*> same);

// A part's "specs" and "descriptions": the full cache first, one description per method;
// InvalidInput naming the file and field otherwise (reports index one list by the other).
void read_method_lists(const std::string& file, const nlohmann::json& j, std::vector<std::string>& specs,
                       std::vector<std::string>& descriptions);

// core/shard.h's check_follows for part j (from `file`): j[field] (e.g. "first_layer") == `next`.
void check_follows(const std::string& file, const nlohmann::json& j, const char* field, const char* items,
                   std::size_t next);

// The parts' items (sequences, prompts, samples) against the run's total (the first part's
// j[field]): InvalidInput "parts hold N items, the run M" naming the file and field otherwise.
void check_parts_hold(const std::string& file, const char* field, const char* items, std::size_t held,
                      std::size_t total);

// A part's "depths": numbers in [0, 1]; InvalidInput naming the file and the value otherwise.
std::vector<double> read_depths(const std::string& file, const nlohmann::json& j);

// Appends part `file`'s per-item rows at j[key] (one value per method; items = prompts, samples)
// to `rows`, which must then hold `items` rows (the items read so far); the integer form takes
// non-negative integers only. InvalidInput naming the file and field otherwise.
void read_method_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
                      std::size_t items, std::vector<std::vector<double>>& rows);
void read_method_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
                      std::size_t items, std::vector<std::vector<std::uint64_t>>& rows);

// The mean of method m's column of such per-item rows (0 when there are none).
template <typename T>
double mean_of_method(const std::vector<std::vector<T>>& rows, std::size_t m) {
  double s = 0.0;
  for (const auto& row : rows) s += static_cast<double>(row[m]);
  return rows.empty() ? 0.0 : s / static_cast<double>(rows.size());
}

}  // namespace akv
