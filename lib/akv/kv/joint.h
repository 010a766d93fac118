#pragma once
// `akv allocate --method joint`: per KV head, choose how many tokens to keep and how many bits
// for its keys and values together, under one byte budget, from measured errors.
//
// For every head and every candidate (keep fraction, key bits, value bits) - plus keeping the
// kept tokens in f16 - the head is evicted (SnapKV scores, window always kept) and quantized
// (kivi layout) exactly as `akv compress` would, its stored bytes are counted (codes, scales,
// zeros, f16 residual, kept indices) and the attention-output error of its query group against
// the full cache is measured. A multiple-choice knapsack then picks one candidate per head
// minimising the summed squared output error sum ||o - o^||^2 (so the reported aggregate error
// sqrt(sum ||o - o^||^2 / sum ||o||^2) is minimised) with the summed bytes <= budget.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/alloc/eviction.h"
#include "akv/core/progress.h"
#include "akv/io/dump.h"
#include "akv/method/params.h"

namespace akv {

struct JointOptions {
  double bytes_fraction = 0.15;  // budget: fraction of the f16 size of K and V
  std::vector<int> bits = {2, 3, 4};
  std::vector<double> keep = {0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0};
  bool f16_option = true;        // also offer the kept tokens unquantized
  std::size_t window = 32, group = 32, residual = 128;
  QuantRule rule = QuantRule::kivi;  // the candidates' quantization rule (quant/affine.h)
  RotationKind rotate = RotationKind::none;  // and rotation (quant/rotation.h)
  std::uint64_t rotate_seed = 0;
  // Also offer every quantized candidate unrotated (rotate hadamard or random): each head then
  // chooses its rotation by its measured error too (JointChoice::rotate).
  bool rotate_choice = false;
  // Cache types also offered for each tensor (parse_head_type: "q4_0", "fp8_e4m3", "tq3+hadamard"):
  // a head's key and value are each kivi codes of some bits or one of these types (a bare type
  // rotated as the candidate's rotation, a suffixed one by its own), so that a head may get fp8,
  // another TurboQuant, another q4_0+hadamard under one byte budget.
  std::vector<std::string> types;
  int threads = 1;
};

// The choice for one head: kept positions (ascending), bits (16 = f16; 0: the tensor is stored as
// its type), the cache types (empty: kivi codes) and the rotation of its keys and values (none
// for f16).
struct JointChoice {
  std::vector<std::int32_t> kept;
  int key_bits = 16, value_bits = 16;
  std::string key_type, value_type;
  RotationKind rotate = RotationKind::none;
  std::uint64_t bytes = 0;
  double error = 0, err2 = 0, norm2 = 0;
  double retained_mass = 0;  // window attention mass on the kept tokens
};

// Source of one layer's tensors: query [n_heads, m.n_query, hd] (the last n_query positions),
// key and value [n_kv_heads, m.n_tokens, hd].
using JointSource = std::function<void(std::size_t layer, Tensor3& query, Tensor3& key, Tensor3& value)>;

// Measures every candidate of every head and solves the knapsack: [layer * n_kv_heads + head].
std::vector<JointChoice> plan_joint(const KvWindow& m, const JointSource& source, const JointOptions& o,
                                    const ProgressFn& progress);

// Measures the candidates, optimises, and returns a budgets file (akv-budgets v1 with per-head
// key_bits / value_bits and predicted error, docs/formats.md).
nlohmann::json allocate_joint(const std::string& dump_path, const JointOptions& o,
                              const ProgressFn& progress);

// A joint budgets file as `akv allocate --method joint` prints it: the budget and predictions,
// then per head its tokens, key and value storage, rotation (when chosen), bytes and error.
std::string render_joint(const nlohmann::json& j);

// A joint plan (tokens and bits per head under the byte budget params.eviction()->budget_fraction)
// as an eviction plan; the chosen bits go to per_head.head_bits, with rotate-choice=on the chosen
// rotations to per_head.head_rotate and with cache-types= the chosen types to
// per_head.head_tensor_types (each cleared otherwise).
EvictionPlan joint_plan(const KvWindow& m, const JointSource& source, const CompressParams& params,
                        int threads, const ProgressFn& progress, CompressParams& per_head);

}  // namespace akv
