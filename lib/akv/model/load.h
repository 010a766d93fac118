#pragma once
// A model from any file akv reads, by what the path is: a Hugging Face directory (model/hf.h), a
// GGUF file by its magic (model/gguf.h), else a llama2.c checkpoint (model/llama2c.h).
#include <string>

#include "akv/model/model.h"

namespace akv {

Model load_model(const std::string& path, WeightMode mode = WeightMode::stored);

}  // namespace akv
