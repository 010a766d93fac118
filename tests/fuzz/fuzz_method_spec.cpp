// Method specs as given to -m / --methods ("kivi-4", "adakv:budget=0.2:quant=kivi"): parsing,
// the registry's checks, resolution into parameters and their JSON round trip (how a cache
// records them).
#include <string>

#include "akv/method/params.h"
#include "akv/method/registry.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  akv::fuzz::expect_akv_errors([&] {
    const akv::CompressRequest r = akv::parse_method_spec(spec);
    akv::check_request(r);
    const akv::CompressParams p = akv::resolve_params(r);
    akv::validate_params(akv::CompressParams::from_json(p.to_json(), "spec"), "spec");
  });
  return 0;
}
