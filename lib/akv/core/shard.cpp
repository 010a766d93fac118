#include "akv/core/shard.h"

#include "akv/core/errors.h"

namespace akv {

Shard parse_shard(const std::string& text, const std::string& flag) {
  const auto slash = text.find('/');
  auto number = [&](const std::string& s) -> long long {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(s);
  };
  const long long k = slash == std::string::npos ? -1 : number(text.substr(0, slash));
  const long long n = slash == std::string::npos ? -1 : number(text.substr(slash + 1));
  if (k < 1 || n < 1 || k > n || n > 100000) {
    throw InvalidInput("shard must be K/N with 1 <= K <= N <= 100000", {"", flag, text});
  }
  return {static_cast<std::size_t>(k), static_cast<std::size_t>(n)};
}

void ShardSet::add(const std::string& file, std::size_t shard, std::size_t shards) {
  if (given_.empty()) {
    file0_ = file;
    n_ = shards;
  }
  if (shards != n_) {
    throw InvalidInput("parts of different shard counts (" + file0_ + ": " + std::to_string(n_) + ")",
                       {file, "shards", std::to_string(shards)});
  }
  if (shard < 1 || shard > n_) throw InvalidInput("shard outside 1.." + std::to_string(n_), {file, "shard", std::to_string(shard)});
  const std::size_t index = given_.size();
  if (const auto [it, added] = given_.emplace(shard, std::make_pair(index, file)); !added) {
    throw InvalidInput("shard given twice (also " + it->second.second + ")", {file, "shard", std::to_string(shard)});
  }
}

std::vector<std::size_t> ShardSet::order() const {
  std::size_t k = 1;  // the first shard not given; parts are distinct shards of 1..n
  for (auto it = given_.begin(); it != given_.end() && it->first == k; ++it) ++k;
  if (k <= n_) throw InvalidInput("shard missing", {"", "shard", std::to_string(k) + "/" + std::to_string(n_)});
  std::vector<std::size_t> order;
  for (const auto& [shard, part] : given_) order.push_back(part.first);
  return order;
}

void check_follows(const std::string& file, const char* field, const char* items, std::size_t first,
                   std::size_t next) {
  if (first != next) {
    throw InvalidInput(std::string(items) + " do not follow the previous shard's (" + std::to_string(next) + ")",
                       {file, field, std::to_string(first)});
  }
}

}  // namespace akv
