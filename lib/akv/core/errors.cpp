#include "akv/core/errors.h"

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <string_view>

namespace akv {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string excerpt(const std::string& text, std::size_t max) {
  auto escape = [](std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      } else {
        out += ch;
      }
    }
    return out;
  };
  const std::string_view v(text);
  if (v.size() <= max) return escape(v);
  const std::size_t keep = std::max<std::size_t>(max / 2, 1);
  return escape(v.substr(0, keep)) + "..." + escape(v.substr(v.size() - keep / 2)) + " (" +
         std::to_string(v.size()) + " bytes)";
}

std::string format_error(const std::string& what, const Where& where) {
  std::string location;
  if (!where.file.empty()) location = excerpt(where.file, 4096);  // paths: escaped, not cut
  if (!where.field.empty()) {
    if (!location.empty()) location += ": ";
    location += excerpt(where.field);
    if (!where.value.empty()) location += " = " + excerpt(where.value);
  } else if (!where.value.empty()) {
    if (!location.empty()) location += ": ";
    location += excerpt(where.value);
  }
  if (location.empty()) return what;
  return what + " (" + location + ")";
}

Error::Error(ExitCode code, const std::string& what, const Where& where)
    : std::runtime_error(format_error(what, where)), code_(code), where_(where), message_(what) {}

}  // namespace akv
