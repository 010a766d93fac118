#pragma once
// The steps of `akv calibrate` (internal to the eval module): calibrate.cpp runs them over every
// layer (measure, fit, assemble); calibrate_shard.cpp over a shard's layers, writing what they
// measured as a part, and assembles the merged parts as the whole run would.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/alloc/calibration_file.h"
#include "akv/core/progress.h"
#include "akv/eval/calibrate.h"
#include "akv/io/dump.h"
#include "akv/quant/nuq.h"
#include "akv/quant/rotation.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv::calib {

// A head's measurements while calibrating (over dumps: amax the maximum, errors the mean or
// maximum), and its key norms.
struct HeadMeasure : HeadStats {
  std::vector<double> norms;  // ||k_t|| in token order (for the streaming proxy)
};

// The --types lists: which types keys and values may take (names), and their layouts.
struct TypeLists {
  std::vector<std::string> key, value;  // as given ("q4_0", "q4_0+hadamard")
  std::vector<const GgmlTypeInfo*> key_info, value_info;
  std::vector<RotationKind> key_rotate, value_rotate;  // each type's rotation (its own or --rotate)
};

// Checked options (candidates sorted and unique) and the dumps' shapes.
struct Setup {
  CalibrateOptions opt;
  std::vector<DumpMeta> metas;
  bool duo = false;  // every dump longer than duo_sinks + duo_window: DuoAttention head scores measured
  bool nuq = false;  // nuq bits asked for and every dump has key_pre_rope: codebooks fitted
  bool fisher = false;  // every dump has key_fisher and value_fisher: the nuq fit's weights
  bool kvzap = false;   // every dump has attn_input and kvzip_plus: KVzap's surrogate fitted
  std::size_t kvzap_rows = 0;  // the rows of its fit (each dump's tokens after kvzap_sinks)
  TypeLists types;      // --types, split into key and value candidates
};

// KVQuant's codebooks of one layer: [bits index], keys per channel, values per token and KV head;
// or why they could not be fitted (every value an outlier: data too sparse or constant).
struct LayerNuq {
  std::vector<NuqCalibration> key, value;
  std::string failed;
};

Setup setup(const std::vector<std::string>& dumps, const CalibrateOptions& o);

// Layers [lo, hi) measured over every dump and aggregated (mean or max): [hi - lo][head].
std::vector<std::vector<HeadMeasure>> measure_layers(const std::vector<std::string>& dumps, const Setup& st,
                                                     std::size_t lo, std::size_t hi, const ProgressFn& progress);

// The Q-Filters of layers [lo, hi) into agg.
void fit_layer_qfilters(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo, std::size_t hi,
                        std::vector<std::vector<HeadMeasure>>& agg);

// KVzap's surrogates of layers [lo, hi) into agg (nothing unless st.kvzap).
void fit_layer_kvzap(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo, std::size_t hi,
                     std::vector<std::vector<HeadMeasure>>& agg);

// KVQuant's codebooks of layers [lo, hi) (none unless st.nuq).
std::vector<LayerNuq> fit_layer_nuq(const std::vector<std::string>& dumps, const Setup& st, std::size_t lo,
                                    std::size_t hi);

// The allocation over every head and calib.json.
nlohmann::json assemble(const std::vector<std::string>& dumps, const Setup& st,
                        const std::vector<std::vector<HeadMeasure>>& agg, const std::vector<LayerNuq>& nuq);

}  // namespace akv::calib
