#pragma once
// Shard K of N of a run (docs/scale.md): `--shard K/N` on evaluate --model (sequences) and
// calibrate (layers).
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace akv {

struct Shard {
  std::size_t k = 1, n = 1;  // shard k of n, 1-based
  // Elements [first, last) of `count` that this shard takes (contiguous, sizes differ by <= 1).
  std::pair<std::size_t, std::size_t> range(std::size_t count) const { return {(k - 1) * count / n, k * count / n}; }
};
// "K/N" with 1 <= K <= N <= 100000; InvalidInput naming the flag and value.
Shard parse_shard(const std::string& text, const std::string& flag = "--shard");

// Checks that partial outputs (each with the file it came from) are shards 1..N of one run: the
// format `format`, the same "shards", equal values at `same` (inputs, parameters), every shard
// once. Returns the parts' indices in shard order. InvalidInput naming the file and field.
std::vector<std::size_t> shard_order(const std::vector<std::pair<std::string, nlohmann::json>>& parts,
                                     const std::string& format, std::initializer_list<const char*> same);

}  // namespace akv
