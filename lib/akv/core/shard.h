#pragma once
// Shard K of N of a run (docs/scale.md): `--shard K/N` on evaluate (sequences or layers),
// calibrate (layers) and compress (layers).
#include <cstddef>
#include <string>
#include <utility>

namespace akv {

struct Shard {
  std::size_t k = 1, n = 1;  // shard k of n, 1-based
  // Elements [first, last) of `count` that this shard takes (contiguous, sizes differ by <= 1).
  std::pair<std::size_t, std::size_t> range(std::size_t count) const { return {(k - 1) * count / n, k * count / n}; }
};
// "K/N" with 1 <= K <= N <= 100000; InvalidInput naming the flag and value.
Shard parse_shard(const std::string& text, const std::string& flag = "--shard");

}  // namespace akv
