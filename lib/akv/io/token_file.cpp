#include "akv/io/token_file.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "akv/core/errors.h"
#include "akv/io/hdf5.h"
#include "akv/io/stdin_input.h"

namespace akv {

namespace {

std::vector<std::vector<std::int32_t>> parse_token_lines(std::istream& in, const std::string& path) {
  std::vector<std::vector<std::int32_t>> out;
  std::string line;
  for (std::size_t ln = 1; std::getline(in, line); ++ln) {
    std::vector<std::int32_t> seq;
    const char* p = line.c_str();
    while (*p) {
      while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\r') ++p;
      if (!*p) break;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(p, &end, 10);
      if (end == p || errno || v < 0 || v > std::numeric_limits<std::int32_t>::max()) {
        std::string tok(p, std::strcspn(p, " ,\t\r"));
        throw InvalidInput("not a token id", {path, "line " + std::to_string(ln), tok});
      }
      seq.push_back(static_cast<std::int32_t>(v));
      p = end;
    }
    if (!seq.empty()) out.push_back(std::move(seq));
  }
  if (out.empty()) throw InvalidInput("no token sequences", {path});
  return out;
}

}  // namespace

std::vector<std::vector<std::int32_t>> read_token_file(const std::string& path) {
  if (is_stdin_path(path)) {
    std::istringstream in(stdin_bytes());
    return parse_token_lines(in, path);
  }
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) throw IoError(std::string("cannot open token file: ") + std::strerror(errno), {path});
    char magic[8] = {};
    probe.read(magic, 8);
    if (probe.gcount() == 8 && std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0) {
      h5::File f = h5::open_read(path);
      const auto v = h5::read_int_vector(f.get(), "/tokens", path);
      std::vector<std::int32_t> seq;
      for (std::int64_t t : v) {
        if (t < 0 || t > std::numeric_limits<std::int32_t>::max()) {
          throw InvalidInput("token id out of range", {path, "/tokens", std::to_string(t)});
        }
        seq.push_back(static_cast<std::int32_t>(t));
      }
      if (seq.empty()) throw InvalidInput("no tokens", {path, "/tokens", "0"});
      return {seq};
    }
  }
  std::ifstream in(path);
  return parse_token_lines(in, path);
}

}  // namespace akv

namespace akv {

std::string read_text_file(const std::string& path) {
  if (is_stdin_path(path)) return stdin_bytes();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError(std::string("cannot open text file: ") + std::strerror(errno), {path});
  const std::streamoff size = in.tellg();
  if (size > (std::streamoff{1} << 30)) throw InvalidInput("text file above 1 GiB", {path, "size", std::to_string(size)});
  std::string text(static_cast<std::size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw IoError("cannot read text file", {path});
  return text;
}

}  // namespace akv
