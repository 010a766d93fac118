// akv dumps (HDF5): the committed fixture dump, edited by h5_mutator, opened and read completely
// the way compress/calibrate/info do (every dataset of every layer, tokens, needles, statistics).
#include <fuzzer/FuzzedDataProvider.h>

#include "akv/io/dump.h"
#include "akv/io/inspect.h"
#include "fuzz_common.h"
#include "h5_mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const std::string path = akv::fuzz::work_dir() + "/dump.h5";
  akv::fuzz::mutate_h5_copy(akv::fuzz::fixtures_dir() + "/dump.h5", path, fdp);
  akv::fuzz::expect_akv_errors([&] {
    const akv::DumpReader dump(path);
    for (std::size_t l = 0; l < dump.meta().n_layers; ++l) {
      for (auto f : {akv::DumpField::key, akv::DumpField::value, akv::DumpField::query,
                     akv::DumpField::key_pre_rope}) {
        if (dump.layer(l).field(f).present) dump.read(l, f);
      }
    }
  });
  akv::fuzz::expect_akv_errors([&] { akv::inspect_file(path, true); });
  return 0;
}
