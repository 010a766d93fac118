#include "akv/eval/parts.h"

#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/params.h"

namespace akv {

std::vector<std::size_t> shard_order(const std::vector<std::pair<std::string, nlohmann::json>>& parts,
                                     const std::string& format, std::initializer_list<const char*> same) {
  if (parts.empty()) throw UsageError("merge needs partial outputs", {"", "PARTS"});
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  ShardSet set;
  json_errors_as<InvalidInput>("partial output field missing or of the wrong type", {file0}, [&] {
    for (const auto& [file, j] : parts) {
      if (!j.is_object() || j.value("format", std::string()) != format) {
        throw InvalidInput("not a partial output of this kind (expected format " + format + ")",
                           {file, "format", j.is_object() && j.contains("format") ? j["format"].dump() : "missing"});
      }
      for (const char* key : same) {
        if (j.at(key) != first.at(key)) {
          throw InvalidInput(std::string("part of another run: ") + key + " differ from " + file0 + "'s",
                             {file, key, j.at(key).dump()});
        }
      }
      set.add(file, json_uint(j.at("shard")), json_uint(j.at("shards")));
    }
  });
  return set.order();
}

void read_method_lists(const std::string& file, const nlohmann::json& j, std::vector<std::string>& specs,
                       std::vector<std::string>& descriptions) {
  specs = j.at("specs").get<std::vector<std::string>>();
  descriptions = j.at("descriptions").get<std::vector<std::string>>();
  if (specs.empty() || specs[0] != kFullMethod) {
    throw InvalidInput("the methods must start with the full cache", {file, "specs", excerpt(j.at("specs").dump(), 60)});
  }
  if (descriptions.size() != specs.size()) {
    throw InvalidInput("one description per method (" + std::to_string(specs.size()) + ")",
                       {file, "descriptions", std::to_string(descriptions.size()) + " entries"});
  }
}

void check_follows(const std::string& file, const nlohmann::json& j, const char* field, const char* items,
                   std::size_t next) {
  check_follows(file, field, items, json_uint(j.at(field)), next);
}

void check_parts_hold(const std::string& file, const char* field, const char* items, std::size_t held,
                      std::size_t total) {
  if (held != total) {
    throw InvalidInput("parts hold " + std::to_string(held) + " " + items + ", the run " + std::to_string(total),
                       {file, field, std::to_string(total)});
  }
}

std::vector<double> read_depths(const std::string& file, const nlohmann::json& j) {
  std::vector<double> depths = j.at("depths").get<std::vector<double>>();
  for (double d : depths) {
    if (!(d >= 0.0 && d <= 1.0)) throw InvalidInput("a depth outside [0, 1]", {file, "depths", format_number(d)});
  }
  return depths;
}

namespace {

template <typename T, typename Read>
void read_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
               std::size_t items, std::vector<std::vector<T>>& rows, const Read& read) {
  const nlohmann::json& all = j.at(key);
  if (!all.is_array()) throw InvalidInput("not an array of rows", {file, key, excerpt(all.dump(), 40)});
  for (const nlohmann::json& line : all) {
    std::vector<T> row = read(line);
    if (row.size() != methods) throw InvalidInput("a row without every method", {file, key, excerpt(line.dump(), 40)});
    rows.push_back(std::move(row));
  }
  if (rows.size() != items) {
    throw InvalidInput("rows and items of different counts (" + std::to_string(items) + " items)",
                       {file, key, std::to_string(rows.size())});
  }
}

}  // namespace

void read_method_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
                      std::size_t items, std::vector<std::vector<double>>& rows) {
  read_rows(file, j, key, methods, items, rows, [](const nlohmann::json& l) { return l.get<std::vector<double>>(); });
}

void read_method_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
                      std::size_t items, std::vector<std::vector<std::uint64_t>>& rows) {
  read_rows(file, j, key, methods, items, rows, [](const nlohmann::json& l) { return json_uints(l); });
}

}  // namespace akv
