// A safetensors file (8-byte header length, JSON header, tensor data) loaded as the weights of
// the tiny model's config.json.
#include "akv/model/hf.h"
#include "fuzz_common.h"
#include "hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = akv::fuzz::hf_dir("hf-single", {"config.json"});
  akv::fuzz::write_input("hf-single/model.safetensors", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::fuzz::exercise(akv::load_hf(dir)); });
  return 0;
}
