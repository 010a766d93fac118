#include "akv/eval/kvzap_prefill.h"

#include <algorithm>

#include "akv/alloc/calibration_file.h"

namespace akv {

KvzapPrefill::KvzapPrefill(const std::vector<std::optional<CompressParams>>& methods, const ModelConfig& c)
    : n_layers_(c.n_layers), key_(methods.size()) {
  for (std::size_t m = 0; m < methods.size(); ++m) {
    const auto& p = methods[m];
    if (!p || !p->eviction() || p->eviction()->score.method != ScoreMethod::kvzap) continue;
    const std::string& f = p->eviction()->score.surrogate;
    const auto at = std::find(files_.begin(), files_.end(), f);
    key_[m] = static_cast<std::size_t>(at - files_.begin());
    if (at == files_.end()) {
      files_.push_back(f);
      models_.push_back(read_calibration_kvzap(f, c, c.dim));
    }
  }
}

std::vector<TokenScores> KvzapPrefill::fresh() const { return std::vector<TokenScores>(files_.size(), TokenScores(n_layers_)); }

LayerInputFn KvzapPrefill::input_fn(std::vector<TokenScores>& scores) const {
  if (empty()) return {};
  return [this, &scores](std::size_t l, std::size_t first, const RowMatrix& x) {
    for (std::size_t f = 0; f < models_.size(); ++f) kvzap_layer_scores(models_[f][l], x, scores[f][l], first);
  };
}

const TokenScores* KvzapPrefill::of(std::size_t m, const std::vector<TokenScores>& scores) const {
  return key_[m] ? &scores[*key_[m]] : nullptr;
}

const std::vector<std::vector<double>>* KvzapPrefill::layer_of(std::size_t m, const std::vector<TokenScores>& scores,
                                                               std::size_t l) const {
  return key_[m] ? &scores[*key_[m]][l] : nullptr;
}

}  // namespace akv
