#pragma once
// Dump -> compressed cache -> dense dump, streamed a layer at a time.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/core/shard.h"
#include "akv/kv/cache_file.h"
#include "akv/method/params.h"
#include "akv/tensor/dtype.h"

namespace akv {

// Honest memory accounting of a cache: bytes stored per component, per layer and in total,
// next to the f16 size of the same K/V.
struct MemoryReport {
  CacheHeader header;
  std::vector<CacheBytes> layers;  // [n_layers]
  CacheBytes total;
  std::uint64_t elements = 0;      // K and V elements of the source: 2 * L * Hkv * T * D
  nlohmann::json eviction;         // eviction summary (EvictionPlan::summary_json) or null
  std::uint64_t f16_bytes() const { return 2 * elements; }
  double bits_per_element() const;  // 8 * total / elements
  double ratio() const;             // f16_bytes / total
  nlohmann::json to_json() const;
};

// Compresses every layer and head of `dump_path` into a cache at `out_path` (atomic), threads
// over heads. Output is bitwise identical for any thread count. With a shard of N > 1 only its
// layers [(K-1) L / N, K L / N) are compressed into a partial cache (eviction plans are made over
// all layers, as unsharded; tiered heads are independent); the report's layers outside the shard
// are empty. `source_hash`: the dump's file_hash when the caller has it (evaluate --dump gives
// its first cache's to the others); empty: computed here.
MemoryReport compress_dump(const std::string& dump_path, const std::string& out_path,
                           const CompressParams& params, int threads, const ProgressFn& progress,
                           const Shard& shard = Shard{}, const std::string& source_hash = "");

// Writes the cache of partial caches 1..N of one run (any order) to `out_path`: the unsharded
// run's file, byte for byte. InvalidInput naming the file and field: a shard missing or twice,
// parts of other parameters, sources or shard counts.
MemoryReport merge_cache_parts(const std::vector<std::string>& parts, const std::string& out_path);

// Memory report of an existing cache from its stored dataset sizes.
MemoryReport cache_memory(const CacheReader& cache);

// Rebuilds a dense dump from a cache. Queries, tokens, needles and head kinds come from the
// source dump `source_path` (empty: the path recorded in the cache), which must match the
// cache's source hash. Evicted positions (if any) are written as zeros.
void decompress_cache(const std::string& cache_path, const std::string& out_path,
                      const std::string& source_path, DType dtype, int threads,
                      const ProgressFn& progress);

// Checks that `dump` is the dump `cache` was made from (shape and content hash); throws
// InvalidInput naming both files otherwise. `dump_hash`: the dump's file_hash when the caller has
// it (one for several caches); empty: computed here.
void check_cache_matches_dump(const CacheReader& cache, const DumpReader& dump, const std::string& dump_hash = "");

}  // namespace akv
