#pragma once
// akv's JSON side files (budgets, calibration): read whole, with their "format" string and
// integer "version" checked before any field is used; and the one JSON parser every reader of
// JSON (side files, parts, tokenizer.json, config.json, safetensors headers, cache params) uses.
#include <fstream>
#include <cstdint>
#include <climits>
#include <istream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"

namespace akv {

// The deepest nesting of arrays and objects any JSON input may have. Deeper values would be
// printed and compared recursively (nlohmann's dump and ==) and overflow the stack; akv's own
// files and the model files it reads nest fewer than 10 levels.
inline constexpr int kMaxJsonDepth = 64;

// Parses JSON from `in` or `text`. CorruptData naming `file` when it is not JSON ("<what> is not
// JSON") or nests deeper than kMaxJsonDepth. Json: nlohmann::json or nlohmann::ordered_json.
template <typename Json = nlohmann::json>
Json parse_json(std::istream& in, const std::string& file, const std::string& what);
template <typename Json = nlohmann::json>
Json parse_json(const std::string& text, const std::string& file, const std::string& what);

// Integers from untrusted JSON. nlohmann's get<integer>() casts a float, which is undefined
// behaviour outside the target type's range (2^70 or -2.0 read as size_t); these take integer
// values only and check the range, and throw the JSON library's type_error otherwise (readers
// already turn it into InvalidInput naming the file).
template <typename Json>
std::uint64_t json_uint(const Json& v) {
  if (!v.is_number_unsigned()) throw Json::type_error::create(302, "a non-negative integer is required", &v);
  return v.template get<std::uint64_t>();
}
template <typename Json>
std::int64_t json_int(const Json& v, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.template get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
      v.template get<std::int64_t>() < lo || v.template get<std::int64_t>() > hi) {
    throw Json::type_error::create(302, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] is required", &v);
  }
  return v.template get<std::int64_t>();
}
template <typename Json>
std::vector<std::uint64_t> json_uints(const Json& v) {
  if (!v.is_array()) throw Json::type_error::create(302, "an array is required", &v);
  std::vector<std::uint64_t> out;
  for (const auto& x : v) out.push_back(json_uint(x));
  return out;
}
template <typename Json>
std::int32_t json_i32(const Json& v) {
  return static_cast<std::int32_t>(json_int(v, INT32_MIN, INT32_MAX));
}
template <typename Json>
std::vector<std::int32_t> json_i32s(const Json& v) {
  if (!v.is_array()) throw Json::type_error::create(302, "an array is required", &v);
  std::vector<std::int32_t> out;
  for (const auto& x : v) out.push_back(json_i32(x));
  return out;
}
// v as T: std::size_t, int and std::vector<int> through the checked readers above, anything else
// by nlohmann's get (field tables read every member this way).
template <typename T, typename Json>
T json_as(const Json& v) {
  if constexpr (std::is_same_v<T, std::size_t>) return json_uint(v);
  else if constexpr (std::is_same_v<T, int>) return json_i32(v);
  else if constexpr (std::is_same_v<T, std::vector<int>>) return json_i32s(v);
  else return v.template get<T>();
}
// An integer field of an object, `fallback` when absent.
template <typename Json>
std::uint64_t json_uint_or(const Json& j, const char* key, std::uint64_t fallback) {
  return j.contains(key) ? json_uint(j.at(key)) : fallback;
}

// [fn(x) for each x of items] and a table [[cell(0, 0), cell(0, 1), ...], ...] of rows x cols,
// as JSON arrays (reports and parts write their lists and grids so).
template <typename Items, typename Fn>
nlohmann::json json_map(const Items& items, Fn&& fn) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& x : items) out.push_back(fn(x));
  return out;
}
template <typename Cell>
nlohmann::json json_grid(std::size_t rows, std::size_t cols, Cell&& cell) {
  nlohmann::json grid = nlohmann::json::array();
  for (std::size_t r = 0; r < rows; ++r) {
    nlohmann::json row = nlohmann::json::array();
    for (std::size_t c = 0; c < cols; ++c) row.push_back(cell(r, c));
    grid.push_back(std::move(row));
  }
  return grid;
}

// A JSON document as akv writes it (two-space indent, a final newline). Bytes that are not UTF-8
// in its strings (a file name or a GGUF string from a Latin-1 system) become U+FFFD instead of
// ending the run: JSON text is UTF-8.
template <typename Json>
std::string json_text(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// fn()'s result; a field that fn() finds missing or of the wrong type (nlohmann's exceptions)
// becomes E("<what>: <the JSON library's message>", where), so that every JSON reader names its
// file the same way.
template <typename E, typename Fn>
auto json_errors_as(const std::string& what, const Where& where, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const nlohmann::json::exception& e) {
    throw E(what + ": " + e.what(), where);
  }
}

// Opens a JSON file for reading: IoError naming `path` when it is a directory ("<what> is a
// directory") or cannot be opened ("cannot open <what>").
std::ifstream open_json(const std::string& path, const std::string& what);

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
