#pragma once
// The budgets file, reader and writer: format "akv-budgets", version 1 (docs/formats.md).
// Written by `akv allocate` (token budgets of an eviction plan; joint plans add per-head bits),
// read by `akv compress --budgets` and the eviction planner.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/alloc/eviction.h"
#include "akv/io/dump.h"
#include "akv/quant/rotation.h"

namespace akv {

inline constexpr const char* kBudgetsFormat = "akv-budgets";
inline constexpr int kBudgetsVersion = 1;

// One KV head's entry.
struct BudgetHead {
  std::size_t tokens = 0;                   // kept, forced included
  std::optional<double> retained_mass;      // eviction plans: window attention mass kept (of 1)
  std::optional<int> key_bits, value_bits;  // joint plans: bits per tensor, 16 = f16, 0 = a cache type
  std::optional<std::string> key_type, value_type;  // joint plans with cache types: the tensor's (bits 0)
  std::optional<std::string> rotate;        // joint plans with a rotation: the head's (none, hadamard, random)
  std::optional<std::uint64_t> bytes;       // joint plans: predicted stored bytes
  std::optional<double> predicted_error;    // joint plans: attention-output relative error
  std::string kind;                         // the dump's head kind, empty when it has none
};

struct BudgetsFile {
  std::string dump_path, dump_hash;
  KvWindow shape;                             // n_layers, n_kv_heads, n_tokens, head_dim
  nlohmann::json summary;                     // "params" (EvictionParams) and totals
  nlohmann::json joint;                       // joint plans: budget and candidate grid; else null
  std::vector<std::vector<BudgetHead>> heads;  // [layer][kv head]
};

// The file's JSON; each layer also carries its token sum and, when its heads have retained
// mass, the minimum and mean over them.
nlohmann::json budgets_to_json(const BudgetsFile& f);

// A budgets file as `akv allocate` prints it: a summary line, then per layer its tokens,
// retained mass and each head's tokens (and kind).
std::string render_budgets(const nlohmann::json& j);

// An eviction plan as a budgets file (head kinds from the dump).
nlohmann::json budgets_json(const EvictionPlan& plan, const DumpReader& dump,
                            const std::string& dump_hash);

// What a budgets file holds, checked against the dump's shape (InvalidInput naming the field), for
// the shape's layers (KvShape::file_layer; indexed by the shape's layers).
struct BudgetsRead {
  std::vector<std::vector<std::size_t>> tokens;  // [layer][head], forced tokens included
  EvictionParams params;                          // the file's score, window, sinks, allocator
  // Joint plans (`akv allocate --method joint`): per-head {key bits, value bits} (16 = f16),
  // [layer * n_kv_heads + head], and the quantizer layout they were measured with.
  std::vector<std::pair<int, int>> bits;
  bool joint = false;
  std::optional<std::size_t> group, residual;
  // Joint plans measured with a rotation: each head's ([layer * n_kv_heads + head]; empty
  // without) and the random rotation's seed.
  std::vector<RotationKind> rotate;
  std::uint64_t rotate_seed = 0;
  // Joint plans with cache types: each head's {key type, value type} ("" = kivi codes; a type
  // exactly where the bits are 0), [layer * n_kv_heads + head]; empty when no head has one.
  std::vector<std::pair<std::string, std::string>> types;
};
BudgetsRead read_budgets(const std::string& path, const KvWindow& m);

// The eviction method a budgets file implies (`akv compress --budgets F` without -m): joint for a
// joint plan, else the method whose score and allocator made it (e.g. adakv).
std::string budgets_method(const std::string& path);

}  // namespace akv
