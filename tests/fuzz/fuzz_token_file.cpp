// Token files for --tokens: one sequence of integer ids per line.
#include "akv/io/token_file.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = akv::fuzz::write_input("tokens.txt", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::read_token_file(path); });
  return 0;
}
