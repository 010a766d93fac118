#pragma once
// The flags of commands that load a model (dump, evaluate --model, bench decode).
#include <string>

#include <CLI/CLI.hpp>

#include "akv/eval/model_run.h"

namespace akv::cli {

inline constexpr const char* kModelHelp =
    "Model: a Hugging Face directory (config.json + safetensors), a GGUF file, or a llama2.c "
    "checkpoint (.bin) (docs/model.md)";

// --weights stored|f32 into `mode`.
inline void add_weights_flag(CLI::App* sub, std::string& mode) {
  sub->add_option("--weights", mode,
                  "stored: F16/BF16 and GGUF block weights stay as the file stores them (memory-mapped) "
                  "and are converted to f32 a tile at a time in each product; f32: converted on load "
                  "(4 bytes per weight; results equal within float rounding)")
      ->capture_default_str()->check(CLI::IsMember({"stored", "f32"}));
}

}  // namespace akv::cli
