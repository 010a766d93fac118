#pragma once
// The per-head entries of akv's side files (budgets, calibration): "layers": [{"heads": [...]}].
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/tensor/kv_shape.h"

namespace akv {

// Calls fn(head, "layers[l].heads[h]") for every head of the shape's layers (file layers
// KvShape::file_layer) of the side file `path` (parsed as j), in layer-major order, after checking
// that it holds the model's layers of n_kv_heads heads: InvalidInput "<what> made for another
// number of layers (this input has N)" or "... of KV heads" naming the field otherwise. JSON type
// errors propagate (the readers name the file).
template <class Fn>
void each_file_head(const nlohmann::json& j, const std::string& path, const std::string& what, const KvShape& shape,
                    Fn&& fn) {
  const auto& layers = j.at("layers");
  if (!layers.is_array() || layers.size() != shape.file_layers()) {
    throw InvalidInput(what + " made for another number of layers (this input has " +
                           std::to_string(shape.file_layers()) + ")",
                       {path, "layers", std::to_string(layers.size())});
  }
  for (std::size_t i = 0; i < shape.n_layers; ++i) {
    const std::size_t l = shape.file_layer(i);
    const auto& heads = layers[l].at("heads");
    const std::string at = "layers[" + std::to_string(l) + "].heads";
    if (!heads.is_array() || heads.size() != shape.n_kv_heads) {
      throw InvalidInput(what + " made for another number of KV heads", {path, at, std::to_string(heads.size())});
    }
    for (std::size_t h = 0; h < shape.n_kv_heads; ++h) fn(heads[h], at + "[" + std::to_string(h) + "]");
  }
}

}  // namespace akv
