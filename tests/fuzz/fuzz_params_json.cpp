// The method parameters a cache records in its `params` attribute (JSON text), as the cache
// reader parses and checks them.
#include <string>

#include <nlohmann/json.hpp>

#include "akv/method/params.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  akv::fuzz::expect_akv_errors([&] {
    const akv::CompressParams p = akv::CompressParams::from_json(j, "params");
    akv::validate_params(p, "params");
    akv::describe(p);
  });
  return 0;
}
