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

// j[key] as a count: a non-negative integer, InvalidInput naming the file, the field and the
// value otherwise (nlohmann would turn -1 into 2^64 - 1).
std::uint64_t part_count(const nlohmann::json& j, const char* key, const std::string& file);

// core/shard.h's check_follows for part j (from `file`): j[field] (e.g. "first_layer") == `next`.
void check_follows(const std::string& file, const nlohmann::json& j, const char* field, const char* items,
                   std::size_t next);

// The mean of method m's column of per-item rows (one value per method; 0 when there are none).
template <typename T>
double mean_of_method(const std::vector<std::vector<T>>& rows, std::size_t m) {
  double s = 0.0;
  for (const auto& row : rows) s += static_cast<double>(row[m]);
  return rows.empty() ? 0.0 : s / static_cast<double>(rows.size());
}

}  // namespace akv
