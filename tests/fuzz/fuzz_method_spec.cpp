// Method specs as given to -m / --methods ("kivi-4", "adakv:budget=0.2:quant=kivi"): parsing,
// the registry's checks, resolution into parameters and their JSON round trip (how a cache
// records them). An input with a newline is `akv compress --method SPEC FLAGS...`: the part
// before it is the spec, the part after it the command line's flags (written as a spec whose name
// is ignored), joined by join_method_spec.
#include <string>

#include "akv/method/params.h"
#include "akv/method/registry.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  akv::fuzz::expect_akv_errors([&] {
    const std::size_t nl = input.find('\n');
    akv::CompressRequest r;
    if (nl == std::string::npos) {
      r = akv::parse_method_spec(input);
    } else {
      r = akv::parse_method_spec(input.substr(nl + 1));
      r.method = input.substr(0, nl);
      akv::join_method_spec(r);
    }
    akv::check_request(r);
    const akv::CompressParams p = akv::resolve_params(r);
    akv::validate_params(akv::CompressParams::from_json(p.to_json(), "spec"), "spec");
  });
  return 0;
}
