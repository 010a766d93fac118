#pragma once
// `akv plan`: for a model shape and a memory budget, the KV bytes per token of each method and
// the longest context / largest batch that fit. Byte counts follow what each runtime cache
// stores (kv/runtime.h, kv/tiered.h), in closed form.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/method/params.h"
#include "akv/tensor/kv_shape.h"

namespace akv {

// The KV shape of a model to plan for (RoPE fields unused), its name and weight bytes.
struct PlanShape : KvShape {
  std::string name;
  std::uint64_t weight_bytes = 0;  // parameters x bytes per parameter; 0 when unknown
  // KvShape::layer_window: Gemma 2/3's local layers hold min(n, window) f16 rows (f32 for f32)
  // whatever the method, which is costed over the global layers only (kv/windowed.h). A model
  // whose every layer is local (Mistral) is costed as without windows up to its window, and as the
  // windows' rows past it.
};

// Reads num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, head_dim,
// intermediate_size, vocab_size, tie_word_embeddings and torch_dtype from a Hugging Face
// config.json (or the directory holding it), and the layers' sliding windows (hf_layer_windows);
// weights = Llama-architecture parameter count x the dtype's bytes (`weight_dtype_bytes` > 0
// overrides torch_dtype). A GGUF file (by its magic) or a llama2.c checkpoint (.bin) instead: the
// shape of the model load_model makes of it, and its weights' bytes as loaded (encoded GGUF
// tensors as stored, as `akv info` reports them); `weight_dtype_bytes` > 0 is then a UsageError.
PlanShape read_plan_config(const std::string& path, int weight_dtype_bytes = 0);

// "16GiB", "16GB", "512MiB", "1.5e10", "16000000000" -> bytes. Throws InvalidInput naming flag.
std::uint64_t parse_bytes(const std::string& text, const std::string& flag);

struct PlanMethod {
  std::string spec;                       // as given; "f32" = the full f32 cache
  std::optional<CompressParams> params;   // nullopt = f32
};

// Device and host bytes of the whole cache (all layers and KV heads) after n tokens. On a shape
// with global and local layers a method's per-head bits or cache types (a calibration's) are
// those of the global layers (read for KvShape::global_shape, as the method's cache reads them;
// std::logic_error otherwise).
struct PlanBytes {
  double device = 0, host = 0;
};
PlanBytes plan_bytes(const PlanShape& s, const PlanMethod& m, std::size_t n);

struct PlanRow {
  std::string spec, description;
  double device_per_token = 0, host_per_token = 0;  // at `context`, averaged per token
  std::optional<std::uint64_t> max_context;  // batch 1; nullopt: device use stops growing
  std::uint64_t max_batch = 0;               // at `context`
};

struct PlanReport {
  PlanShape shape;
  std::uint64_t memory = 0, context = 0;
  std::optional<std::uint64_t> host_memory;
  std::vector<PlanRow> rows;
  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Throws InvalidInput when the weights alone exceed the memory.
PlanReport plan(const PlanShape& s, const std::vector<PlanMethod>& methods, std::uint64_t memory,
                std::uint64_t context, std::optional<std::uint64_t> host_memory);

}  // namespace akv
