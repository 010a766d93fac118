// GGUF files: header, metadata, tensor infos (GgufFile), then load_gguf and a 2-token prefill;
// the file's tokenizer (its metadata arrays through GgufFile's typed readers) encoding a text.
#include "akv/model/gguf.h"
#include "akv/model/tokenizer.h"
#include "fuzz_common.h"
#include "hf_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = akv::fuzz::write_input("model.gguf", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::fuzz::exercise(akv::load_gguf(path)); });
  akv::fuzz::expect_akv_errors([&] { (void)akv::Tokenizer::from_gguf(path).encode("Hello world, 12 tokens\n"); });
  return 0;
}
