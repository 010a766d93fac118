// Budgets files (akv allocate's JSON, --budgets) read against the fixture dump's shape.
#include "akv/alloc/budgets_file.h"
#include "akv/io/dump.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const akv::DumpMeta meta = akv::DumpReader(akv::fuzz::fixtures_dir() + "/dump.h5").meta();
  const std::string path = akv::fuzz::write_input("budgets.json", data, size);
  akv::fuzz::expect_akv_errors([&] { akv::read_budgets(path, meta); });
  akv::fuzz::expect_akv_errors([&] { akv::budgets_method(path); });
  return 0;
}
