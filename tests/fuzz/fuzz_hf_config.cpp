// config.json of a Hugging Face model: read_hf_config alone, then the whole loader with the tiny
// model's weights (shapes from the fuzzed config must be checked before anything is allocated).
#include "akv/model/hf.h"
#include "akv/model/hf_config.h"
#include "fuzz_common.h"
#include "hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = akv::fuzz::hf_dir("hf-config", {"model.safetensors"});
  const std::string path = akv::fuzz::write_input("hf-config/config.json", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::read_hf_config(path); });
  akv::fuzz::expect_akv_errors([&] { akv::fuzz::exercise(akv::load_hf(dir)); });
  return 0;
}
