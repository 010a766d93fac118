#pragma once
// The prefill-time scores of a run's kvzap methods (score/kvzap.h): each distinct surrogate file
// read once, then, per prompt, applied to every layer's attention inputs as Model::prefill hands
// them (its LayerInputFn). A layer's scores are complete once the prefill has passed its inputs,
// before the layer is done: a cache that plans each layer takes them with the layer
// (LayerKv::scores), the others with the prompt (PromptKv::scores). Shared by the lane engine
// (eval/lanes.h) and `akv bench decode`.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "akv/method/params.h"
#include "akv/model/model.h"
#include "akv/score/kvzap.h"
#include "akv/score/kvzip.h"

namespace akv {

class KvzapPrefill {
 public:
  // Reads the surrogate of every kvzap method (score kvzap) among `methods`, checked against the
  // model's layers, KV heads and attention input width (alloc/calibration_file.h's errors).
  KvzapPrefill(const std::vector<std::optional<CompressParams>>& methods, const ModelConfig& c);

  bool empty() const { return files_.empty(); }
  // One prompt's scores [surrogate][layer][kv head][token], empty until filled by input_fn.
  std::vector<TokenScores> fresh() const;
  // The prefill's LayerInputFn filling `scores` (one prompt's; empty() gives an empty function).
  LayerInputFn input_fn(std::vector<TokenScores>& scores) const;
  // Method m's scores in `scores` (nullptr when it is not a kvzap method), whole or of layer l.
  const TokenScores* of(std::size_t m, const std::vector<TokenScores>& scores) const;
  const std::vector<std::vector<double>>* layer_of(std::size_t m, const std::vector<TokenScores>& scores,
                                                   std::size_t l) const;

 private:
  std::size_t n_layers_ = 0;
  std::vector<std::string> files_;
  std::vector<KvzapModel> models_;               // [surrogate]
  std::vector<std::optional<std::size_t>> key_;  // [method]: its surrogate
};

}  // namespace akv
