#pragma once
// The shape of a model's KV cache, one struct for every place that needs it: dumps (DumpMeta),
// models (ModelConfig), runtime caches (KvGeometry), memory plans (PlanShape) and synthetic
// dumps (SynthOptions) extend it, so a shape passes between them as one value. KvWindow adds a
// sequence and its observation window: what the scorers and allocators read, from a dump or
// from a prompt inside the model.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "akv/tensor/rope.h"

namespace akv {

struct KvShape {
  std::size_t n_layers = 0;
  std::size_t n_heads = 0;     // query heads
  std::size_t n_kv_heads = 0;  // key/value heads (n_heads % n_kv_heads == 0)
  std::size_t head_dim = 0;
  double rope_theta = 10000.0;
  RopeLayout rope_layout = RopeLayout::rotate_half;
  // Empty: plain RoPE over the whole head with rope_theta. Otherwise how the model's RoPE
  // differs (scaling, partial rotation), e.g. "yarn x4": pre-RoPE quantization, which re-applies
  // plain RoPE after dequantization, is refused for such shapes.
  std::string rope_variant;
  // A model whose local (sliding-window) layers rotate with their own base says so last in
  // rope_variant, after this clause (Model): the global layers alone rotate as the rest says.
  static constexpr const char* kLocalThetaClause = "local layers theta ";
  // rope_variant without that clause: the RoPE of the global layers.
  std::string global_rope_variant() const {
    const std::size_t at = rope_variant.find(kLocalThetaClause);
    if (at == std::string::npos) return rope_variant;
    return rope_variant.substr(0, at >= 2 ? at - 2 : 0);  // the ", " before it
  }

  // Per layer, the window of a local (sliding-window) layer - position p attends to positions
  // p - w + 1 .. p - or 0 for a global layer; empty: every layer global. Gemma 2/3 mix both kinds;
  // Mistral (and Qwen2/3, Phi-3 with a sliding window) have every layer local. Models read it from
  // their files, dumps record it (formats.md), runtime caches keep local layers to their window
  // (kv/windowed.h), plans cost them so.
  std::vector<std::size_t> layer_window = {};
  // A shape of a model's global layers alone (the method's cache inside a WindowedCache,
  // kv/windowed.h) keeps, per layer here, the model's layer it is, and the model's layer count:
  // files written per model layer (calibrations, budgets) are read at those layers. Empty: the
  // layers are the model's.
  std::vector<std::size_t> model_layer = {};
  std::size_t model_layers = 0;

  std::size_t group_size() const { return n_heads / n_kv_heads; }  // query heads per KV head
  // Layer l's window (0 when global).
  std::size_t window_of(std::size_t l) const { return layer_window.empty() ? 0 : layer_window[l]; }
  // Whether some layer is local; whether every layer is (Mistral); the smallest window (0: none).
  bool windowed() const {
    return std::any_of(layer_window.begin(), layer_window.end(), [](std::size_t w) { return w != 0; });
  }
  bool all_local() const {
    return !layer_window.empty() && std::find(layer_window.begin(), layer_window.end(), 0) == layer_window.end();
  }
  std::size_t smallest_window() const {
    std::size_t w = 0;
    for (const std::size_t x : layer_window) w = x && (!w || x < w) ? x : w;
    return w;
  }
  // The global layers (the count a windowed cache's inner method holds).
  std::size_t global_layers() const {
    return layer_window.empty() ? n_layers
                                : static_cast<std::size_t>(std::count(layer_window.begin(), layer_window.end(), std::size_t{0}));
  }
  // Whether a run reaching `positions` positions decodes through the windowed cache: a model
  // with local and global layers always (methods compress the global layers only), a model whose
  // every layer is local once the run passes its smallest window (within it, windowed attention
  // is full attention, and the methods compress every layer).
  bool windowed_run(std::size_t positions) const { return windowed() && (!all_local() || positions > smallest_window()); }
  // The K/V rows per KV head an f16 cache of n positions holds, summed over layers: n per global
  // layer, min(n, window) per local one (the denominator of bits per element).
  std::size_t cached_rows(std::size_t n) const {
    std::size_t rows = 0;
    for (std::size_t l = 0; l < n_layers; ++l) rows += window_of(l) ? std::min(n, window_of(l)) : n;
    return rows;
  }
  // The layers a per-layer file written for this model holds, and the file's layer of layer l.
  std::size_t file_layers() const { return model_layer.empty() ? n_layers : model_layers; }
  std::size_t file_layer(std::size_t l) const { return model_layer.empty() ? l : model_layer[l]; }
  // This shape's global layers as a shape of their own (no windows; model_layer maps them back).
  KvShape global_shape() const {
    KvShape s = *this;
    s.n_layers = global_layers();
    s.layer_window.clear();
    s.rope_variant = global_rope_variant();
    s.model_layer.clear();
    for (std::size_t l = 0; l < n_layers; ++l) {
      if (!window_of(l)) s.model_layer.push_back(file_layer(l));
    }
    s.model_layers = file_layers();
    return s;
  }
  KvShape& kv_shape() { return *this; }
  const KvShape& kv_shape() const { return *this; }
};

// A sequence of n_tokens over a KV shape with queries at its last n_query positions (the
// observation window).
struct KvWindow : KvShape {
  std::size_t n_tokens = 0;
  std::size_t n_query = 0;

  std::size_t first_query_pos() const { return n_tokens - n_query; }
  KvWindow& window() { return *this; }
  const KvWindow& window() const { return *this; }
};

}  // namespace akv
