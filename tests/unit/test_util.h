#pragma once
// Helpers shared by the unit tests.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace akv::test {

// A fresh temporary directory, removed with its contents when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "akv-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  // Number of entries in the directory (to check that nothing partial was left behind).
  std::size_t entries() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::filesystem::path path_;
};

// ../shared (the real model and reference data), or $AKV_SHARED_DIR.
inline std::string shared_dir() {
  const char* env = std::getenv("AKV_SHARED_DIR");
  return env ? env : AKV_DEFAULT_SHARED_DIR;
}
inline bool have_shared() {
  return std::filesystem::exists(shared_dir() + "/models/stories260K.bin");
}

}  // namespace akv::test
