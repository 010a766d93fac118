#pragma once
// A Hugging Face model directory for the model-loader harnesses: the tiny llama of
// tests/fuzz/data/hf-tiny (config.json, model.safetensors, and the same weights sharded as
// a.safetensors + b.safetensors) copied into a directory of the harness's own, where the harness
// then replaces one file with its input.
#include <string>

#include "akv/model/model.h"

namespace akv::fuzz {

// A fresh directory holding the files of data/hf-tiny named in `files`.
std::string hf_dir(const std::string& name, std::initializer_list<const char*> files);

// Runs a two-token prefill when the model's vocabulary and context allow it (the activations'
// finiteness checks and the RoPE table see the loaded configuration).
void exercise(const Model& m);

}  // namespace akv::fuzz
