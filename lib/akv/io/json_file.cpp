#include "akv/io/json_file.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "akv/core/errors.h"
#include "akv/io/stdin_input.h"

namespace akv {

namespace {

template <typename Json, typename Input>
Json parse_limited(Input&& input, const std::string& file, const std::string& what) {
  bool too_deep = false;
  // Called at each value with the number of arrays/objects open around it; a value nested too
  // deep is dropped (returning false), so the parser, which keeps its own stack, goes on without
  // building it and the error below is thrown outside nlohmann's code.
  const auto limit = [&too_deep](int depth, nlohmann::json::parse_event_t event, Json&) {
    if (depth >= kMaxJsonDepth && (event == nlohmann::json::parse_event_t::object_start ||
                                   event == nlohmann::json::parse_event_t::array_start)) {
      too_deep = true;
    }
    return !too_deep;
  };
  Json j = Json::parse(std::forward<Input>(input), limit, false);
  if (too_deep) {
    throw CorruptData(what + " nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                      {file, "depth", "> " + std::to_string(kMaxJsonDepth)});
  }
  if (j.is_discarded()) throw CorruptData(what + " is not JSON", {file});
  return j;
}

// A JSON file parsed whole; "-" is standard input (io/stdin_input.h).
template <typename Json>
Json parse_file(const std::string& path, const std::string& what) {
  if (is_stdin_path(path)) return parse_limited<Json>(stdin_bytes(), path, what);
  std::ifstream in = open_json(path, what);
  return parse_limited<Json>(in, path, what);
}

template <typename Json>
Json read_checked(const std::string& path, const std::string& what, const std::string& format, int version) {
  Json j = parse_file<Json>(path, what + " file");
  if (!j.is_object()) throw CorruptData(what + " file is not a JSON object", {path});
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

template <typename Json>
Json parse_json(std::istream& in, const std::string& file, const std::string& what) {
  return parse_limited<Json>(in, file, what);
}

template <typename Json>
Json parse_json(const std::string& text, const std::string& file, const std::string& what) {
  return parse_limited<Json>(text, file, what);
}

template nlohmann::json parse_json<nlohmann::json>(std::istream&, const std::string&, const std::string&);
template nlohmann::json parse_json<nlohmann::json>(const std::string&, const std::string&, const std::string&);
template nlohmann::ordered_json parse_json<nlohmann::ordered_json>(std::istream&, const std::string&,
                                                                   const std::string&);
template nlohmann::ordered_json parse_json<nlohmann::ordered_json>(const std::string&, const std::string&,
                                                                   const std::string&);

std::ifstream open_json(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw IoError(what + " is a directory", {path});
  std::ifstream in(path);
  if (!in) throw IoError("cannot open " + what, {path});
  return in;
}

std::string read_json_format(const std::string& path) {
  const nlohmann::json j = parse_file<nlohmann::json>(path, "JSON file");
  if (!j.is_object()) throw CorruptData("not a JSON object", {path});
  const nlohmann::json f = j.value("format", nlohmann::json());
  return f.is_string() ? f.template get<std::string>() : "";
}

}  // namespace akv
