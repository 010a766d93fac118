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

}  // namespace akv
