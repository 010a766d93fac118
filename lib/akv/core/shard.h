#pragma once
// Shard K of N of a run (docs/scale.md): `--shard K/N` on evaluate (sequences or layers),
// calibrate (layers), compress (layers) and bench (cases); and the check every merge makes that
// its parts are shards 1..N of one run (ShardSet).
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace akv {

struct Shard {
  std::size_t k = 1, n = 1;  // shard k of n, 1-based
  // Elements [first, last) of `count` that this shard takes (contiguous, sizes differ by <= 1).
  std::pair<std::size_t, std::size_t> range(std::size_t count) const { return {(k - 1) * count / n, k * count / n}; }
};
// "K/N" with 1 <= K <= N <= 100000; InvalidInput naming the flag and value.
Shard parse_shard(const std::string& text, const std::string& flag = "--shard");

// The parts of a merge, added one at a time (after the caller's own checks of each part): every
// part of the first part's shard count N, its shard in 1..N, no shard twice; order() then checks
// that none is missing. InvalidInput naming the file and field.
class ShardSet {
 public:
  void add(const std::string& file, std::size_t shard, std::size_t shards);
  std::size_t shards() const { return n_; }
  // Indices of the parts (in the order added) sorted by shard.
  std::vector<std::size_t> order() const;

 private:
  std::string file0_;
  std::size_t n_ = 0;
  std::map<std::size_t, std::pair<std::size_t, std::string>> given_;  // shard -> (index, file)
};

// A part must start where the previous shards ended (its `field`, e.g. "first_layer", equal to
// `next`); InvalidInput "ITEMS do not follow the previous shard's (NEXT)" naming the file and field.
void check_follows(const std::string& file, const char* field, const char* items, std::size_t first,
                   std::size_t next);

}  // namespace akv
