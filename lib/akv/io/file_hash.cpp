#include "akv/io/file_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <memory>
#include <vector>

#include "akv/core/errors.h"
#include "akv/io/stdin_input.h"

namespace akv {

namespace {

std::string hex_digest(XXH64_hash_t h) {
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("xxh3-64:") + hex;
}

}  // namespace

std::string file_hash(const std::string& path) {
  if (is_stdin_path(path)) return hex_digest(XXH3_64bits(stdin_bytes().data(), stdin_bytes().size()));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw IoError(std::string("cannot open file: ") + std::strerror(errno), {path});
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) throw IoError("cannot hash", {path});
  std::vector<char> buf(1 << 20);
  for (;;) {
    const std::size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n > 0) XXH3_64bits_update(state.get(), buf.data(), n);
    if (n < buf.size()) break;
  }
  if (std::ferror(f.get())) throw IoError("cannot read file", {path});
  return hex_digest(XXH3_64bits_digest(state.get()));
}

std::string path_hash(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return file_hash(path);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  }
  if (ec) throw IoError("cannot list directory: " + ec.message(), {path});
  std::sort(names.begin(), names.end());
  std::string listing;
  for (const auto& n : names) listing += n + '\0' + file_hash((fs::path(path) / n).string()) + '\n';
  return hex_digest(XXH3_64bits(listing.data(), listing.size()));
}

}  // namespace akv
