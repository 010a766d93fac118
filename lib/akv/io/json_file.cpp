#include "akv/io/json_file.h"

#include <fstream>

#include "akv/core/errors.h"

namespace akv {

nlohmann::json read_json_file(const std::string& path, const std::string& what, const std::string& format,
                              int version) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open " + what + " file", {path});
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData(what + " file is not JSON", {path});
  const nlohmann::json f = j.value("format", nlohmann::json()), v = j.value("version", nlohmann::json());
  if (!f.is_string() || f.get<std::string>() != format) {
    throw InvalidInput("not an akv " + what + " file (expected format \"" + format + "\")",
                       {path, "format", f.is_string() ? f.get<std::string>() : f.dump().substr(0, 40)});
  }
  if (!v.is_number_integer() || v.get<long long>() != version) {
    throw InvalidInput("unsupported " + format + " version (this akv reads " + std::to_string(version) + ")",
                       {path, "version", v.dump().substr(0, 40)});
  }
  return j;
}

std::string read_json_format(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open JSON file", {path});
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CorruptData("not a JSON object", {path});
  const nlohmann::json f = j.value("format", nlohmann::json());
  return f.is_string() ? f.get<std::string>() : "";
}

}  // namespace akv
