#include "akv/eval/shard.h"

#include <map>

#include "akv/core/errors.h"
#include "akv/io/json_file.h"

namespace akv {

std::vector<std::size_t> shard_order(const std::vector<std::pair<std::string, nlohmann::json>>& parts,
                                     const std::string& format, std::initializer_list<const char*> same) {
  if (parts.empty()) throw UsageError("merge needs partial outputs", {"", "PARTS"});
  const auto& [file0, first] = parts[0];
  std::map<std::size_t, std::size_t> given;  // shard -> index into parts (n may be any number a file claims)
  std::size_t n = 0;
  try {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const auto& [file, j] = parts[i];
      if (!j.is_object() || j.value("format", std::string()) != format) {
        throw InvalidInput("not a partial output of this kind (expected format " + format + ")",
                           {file, "format", j.is_object() && j.contains("format") ? j["format"].dump() : "missing"});
      }
      const std::size_t k = json_uint(j.at("shard")), shards = json_uint(j.at("shards"));
      if (i == 0) n = shards;
      if (shards != n) {
        throw InvalidInput("parts of different shard counts (" + file0 + ": " + std::to_string(n) + ")",
                           {file, "shards", std::to_string(shards)});
      }
      if (k < 1 || k > n) throw InvalidInput("shard outside 1.." + std::to_string(n), {file, "shard", std::to_string(k)});
      for (const char* key : same) {
        if (j.at(key) != first.at(key)) {
          throw InvalidInput(std::string("part of another run: ") + key + " differ from " + file0 + "'s",
                             {file, key, j.at(key).dump()});
        }
      }
      if (const auto [it, added] = given.emplace(k, i); !added) {
        throw InvalidInput("shard given twice (also " + parts[it->second].first + ")", {file, "shard", std::to_string(k)});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(std::string("partial output field missing or of the wrong type: ") + e.what(), {file0});
  }
  std::size_t k = 1;  // the first shard not given; parts are distinct shards of 1..n
  for (auto it = given.begin(); it != given.end() && it->first == k; ++it) ++k;
  if (k <= n) throw InvalidInput("shard missing", {"", "shard", std::to_string(k) + "/" + std::to_string(n)});
  std::vector<std::size_t> order;
  for (const auto& [shard, i] : given) order.push_back(i);
  return order;
}

void read_method_lists(const std::string& file, const nlohmann::json& j, std::vector<std::string>& specs,
                       std::vector<std::string>& descriptions) {
  specs = j.at("specs").get<std::vector<std::string>>();
  descriptions = j.at("descriptions").get<std::vector<std::string>>();
  if (specs.empty() || specs[0] != "full") {
    throw InvalidInput("the methods must start with the full cache", {file, "specs", excerpt(j.at("specs").dump(), 60)});
  }
  if (descriptions.size() != specs.size()) {
    throw InvalidInput("one description per method (" + std::to_string(specs.size()) + ")",
                       {file, "descriptions", std::to_string(descriptions.size()) + " entries"});
  }
}

void check_follows(const std::string& file, const nlohmann::json& j, const char* field, const char* items,
                   std::size_t next) {
  if (json_uint(j.at(field)) != next) {
    throw InvalidInput(std::string(items) + " do not follow the previous shard's (" + std::to_string(next) + ")",
                       {file, field, j.at(field).dump()});
  }
}

}  // namespace akv
