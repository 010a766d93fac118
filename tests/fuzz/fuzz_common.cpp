#include "fuzz_common.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

namespace akv::fuzz {

void copy_file_retrying(const std::string& from, const std::string& to) {
  for (;;) {
    std::error_code ec;
    std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec) return;
    if (ec != std::errc::interrupted) throw std::filesystem::filesystem_error("cannot copy file", from, to, ec);
  }
}

const std::string& work_dir() {
  static const std::string& dir = *new std::string([] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/akv-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("akv-fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(work_dir(), ec); });
    return pattern;
  }());  // never destroyed: the exit handler still needs it
  return dir;
}

std::string write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::string path = work_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "akv-fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

std::string write_input(const std::string& name, const std::string& text) {
  return write_input(name, reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
}

std::string fixtures_dir() { return AKV_FIXTURES_DIR; }

}  // namespace akv::fuzz
