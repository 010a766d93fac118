// model.safetensors.index.json naming the shards of the tiny model (a.safetensors,
// b.safetensors): weight maps with missing, duplicate, foreign or non-string entries.
#include "akv/model/hf.h"
#include "fuzz_common.h"
#include "hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir =
      akv::fuzz::hf_dir("hf-sharded", {"config.json", "a.safetensors", "b.safetensors"});
  akv::fuzz::write_input("hf-sharded/model.safetensors.index.json", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::fuzz::exercise(akv::load_hf(dir)); });
  return 0;
}
