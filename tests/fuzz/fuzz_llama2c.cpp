// llama2.c checkpoints (.bin: 7 int32 header fields, then f32 weights): the header alone (akv plan)
// and the whole model.
#include "akv/model/llama2c.h"
#include "fuzz_common.h"
#include "hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = akv::fuzz::write_input("model.bin", data, size);
  akv::fuzz::expect_akv_errors([&] { (void)akv::read_llama2c_shape(path); });  // akv plan's header-only read
  akv::fuzz::expect_akv_errors([&] { akv::fuzz::exercise(akv::load_llama2c(path)); });
  return 0;
}
