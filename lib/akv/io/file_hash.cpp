#include "akv/io/file_hash.h"

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "akv/core/errors.h"

namespace akv {

std::string file_hash(const std::string& path) {
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
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(state.get())));
  return std::string("xxh3-64:") + hex;
}

}  // namespace akv
