#include "akv/eval/parts.h"

#include "akv/core/errors.h"
#include "akv/io/json_file.h"

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
      set.add(file, part_count(j, "shard", file), part_count(j, "shards", file));
    }
  });
  return set.order();
}

std::uint64_t part_count(const nlohmann::json& j, const char* key, const std::string& file) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned()) throw InvalidInput("a count that is not a non-negative integer", {file, key, excerpt(v.dump(), 40)});
  return json_uint(v);
}

void check_follows(const std::string& file, const nlohmann::json& j, const char* field, const char* items,
                   std::size_t next) {
  check_follows(file, field, items, part_count(j, field, file), next);
}

}  // namespace akv
