#include "akv/model/load.h"

#include <filesystem>
#include <system_error>

#include "akv/model/gguf.h"
#include "akv/model/hf.h"
#include "akv/model/llama2c.h"

namespace akv {

Model load_model(const std::string& path, WeightMode mode) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_hf(path, mode);
  if (is_gguf(path)) return load_gguf(path, mode);
  return load_llama2c(path);
}

}  // namespace akv
