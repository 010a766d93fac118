#pragma once
// akv's JSON side files (budgets, calibration): read whole, with their "format" string and
// integer "version" checked before any field is used.
#include <string>

#include <nlohmann/json.hpp>

namespace akv {

// IoError when the file cannot be opened, CorruptData when it is not a JSON object, InvalidInput
// naming the field when the format or version differs. `what` names the file kind in messages
// ("budgets", "calibration").
nlohmann::json read_json_file(const std::string& path, const std::string& what, const std::string& format,
                              int version);
// The same, keeping the file's key order.
nlohmann::ordered_json read_ordered_json_file(const std::string& path, const std::string& what,
                                              const std::string& format, int version);
// The "format" string of a JSON file ("" when it has none); IoError / CorruptData as above.
std::string read_json_format(const std::string& path);

}  // namespace akv
