#include "akv/core/errors.h"

#include <cmath>
#include <cstdio>

namespace akv {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string format_error(const std::string& what, const Where& where) {
  std::string location;
  if (!where.file.empty()) location = where.file;
  if (!where.field.empty()) {
    if (!location.empty()) location += ": ";
    location += where.field;
    if (!where.value.empty()) location += " = " + where.value;
  } else if (!where.value.empty()) {
    if (!location.empty()) location += ": ";
    location += where.value;
  }
  if (location.empty()) return what;
  return what + " (" + location + ")";
}

Error::Error(ExitCode code, const std::string& what, const Where& where)
    : std::runtime_error(format_error(what, where)), code_(code), where_(where) {}

}  // namespace akv
