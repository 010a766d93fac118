#include "akv/io/json_file.h"

#include <fstream>

#include "akv/core/errors.h"

namespace akv {

namespace {

template <typename Json>
Json read_checked(const std::string& path, const std::string& what, const std::string& format, int version) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open " + what + " file", {path});
  Json j = Json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData(what + " file is not JSON", {path});
  const Json f = j.value("format", Json()), v = j.value("version", Json());
  if (!f.is_string() || f.template get<std::string>() != format) {
    throw InvalidInput("not an akv " + what + " file (expected format \"" + format + "\")",
                       {path, "format", f.is_string() ? f.template get<std::string>() : f.dump().substr(0, 40)});
  }
  if (!v.is_number_integer() || v.template get<long long>() != version) {
    throw InvalidInput("unsupported " + format + " version (this akv reads " + std::to_string(version) + ")",
                       {path, "version", v.dump().substr(0, 40)});
  }
  return j;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path, const std::string& what, const std::string& format,
                              int version) {
  return read_checked<nlohmann::json>(path, what, format, version);
}

nlohmann::ordered_json read_ordered_json_file(const std::string& path, const std::string& what,
                                              const std::string& format, int version) {
  return read_checked<nlohmann::ordered_json>(path, what, format, version);
}

std::string read_json_format(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open JSON file", {path});
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData("not a JSON object", {path});
  const nlohmann::json f = j.value("format", nlohmann::json());
  return f.is_string() ? f.template get<std::string>() : "";
}

}  // namespace akv
