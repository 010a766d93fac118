#include "akv/io/stdin_input.h"

#include <cstdio>
#include <string>

#include "akv/core/errors.h"

namespace akv {

const std::string& stdin_bytes() {
  static const std::string bytes = [] {
    constexpr std::size_t kLimit = std::size_t{1} << 30;
    std::string out;
    char buf[1 << 16];
    for (;;) {
      const std::size_t n = std::fread(buf, 1, sizeof buf, stdin);
      out.append(buf, n);
      if (out.size() > kLimit) throw InvalidInput("standard input above 1 GiB", {"-", "size", "> 1 GiB"});
      if (n < sizeof buf) break;
    }
    if (std::ferror(stdin)) throw IoError("cannot read standard input", {"-"});
    return out;
  }();
  return bytes;
}

}  // namespace akv
