#include "hf_dir.h"

#include <filesystem>

#include "fuzz_common.h"

namespace akv::fuzz {

std::string hf_dir(const std::string& name, std::initializer_list<const char*> files) {
  namespace fs = std::filesystem;
  const std::string dir = work_dir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : files) {
    copy_file_retrying(std::string(AKV_FUZZ_DATA_DIR) + "/hf-tiny/" + f, dir + "/" + f);
  }
  return dir;
}

void exercise(const Model& m) {
  if (m.config().vocab_size >= 2 && m.config().seq_len >= 2) m.prefill({0, 1}, false);
}

}  // namespace akv::fuzz
