#pragma once
// `akv evaluate`: fidelity of a compressed cache against its source dump, per layer and KV head,
// using the dump's queries (GQA: each query head reads its KV head). Streams a layer at a time.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/eval/attention.h"
#include "akv/eval/parts.h"
#include "akv/kv/compress.h"

namespace akv {

// Sums for one KV head (its query heads added together); ratios are derived.
struct FidelitySums {
  double key_err2 = 0, key_norm2 = 0, value_err2 = 0, value_norm2 = 0;
  AttentionFidelity attn;
  std::size_t heads = 0;  // KV heads summed
  FidelitySums& operator+=(const FidelitySums& o);
};

// Ratios reported for a head, a layer or the whole cache.
struct FidelityMetrics {
  double key_rel_mse = 0;    // ||K - K^||^2 / ||K||^2 (tokens not kept count as K^ = 0)
  double value_rel_mse = 0;
  double attn_rel_err = 0;   // sqrt(sum ||o - o^||^2 / sum ||o||^2) over queries
  double kl = 0;             // mean over queries of KL(p || p^), p restricted to kept tokens
  double evicted_mass = 0;   // mean over queries of the original attention on evicted tokens
  double retained_mass = 1;  // 1 - evicted_mass
  double recall[3] = {0, 0, 0};  // mean top-k recall, k = 1, 8, 32
};
FidelityMetrics metrics(const FidelitySums& s);

struct FidelityReport {
  std::string dump_path, cache_path;
  MemoryReport memory;
  std::vector<std::vector<FidelitySums>> heads;  // [layer][kv head]
  // Needle survival, when the dump has /needles: per needle, the (layer, KV head) pairs that
  // keep its position.
  std::vector<std::int32_t> needles;
  std::vector<std::size_t> needle_kept;  // [n_needles]
  double needle_survival() const;       // mean over needles of kept pairs / all pairs
  FidelitySums layer_sums(std::size_t l) const;
  FidelitySums total() const;
  nlohmann::json to_json() const;
  std::string to_csv() const;    // one row per layer/head
  std::string to_table(bool per_head) const;
};

// Checks the cache belongs to the dump (shape and content hash) unless `verify_hash` is false.
// With a shard, only its layers [(K-1) L / N, K L / N) are evaluated (the others stay zero).
FidelityReport evaluate_cache(const std::string& dump_path, const std::string& cache_path,
                              int threads, bool verify_hash, const ProgressFn& progress,
                              const Shard& shard = Shard{});
// The same for several caches of one dump in one pass over it: each query head's original
// attention is computed once for all of them (one report per cache, each as evaluate_cache's).
std::vector<FidelityReport> evaluate_caches(const std::string& dump_path, const std::vector<std::string>& cache_paths,
                                            int threads, bool verify_hash, const ProgressFn& progress,
                                            const Shard& shard = Shard{});

// Sharded evaluate --dump --cache (docs/scale.md): the partial report of a shard (format
// akv-fidelity-part v1: the dump's and cache's paths and hashes, its layers' raw sums, its needle
// counts), and the whole report rebuilt from parts 1..N (InvalidInput naming the file and field
// otherwise; the cache is read again for its byte counts): the unsharded report, byte for byte.
nlohmann::json fidelity_part_json(const FidelityReport& r, const Shard& shard);
FidelityReport merge_fidelity_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts);

}  // namespace akv
