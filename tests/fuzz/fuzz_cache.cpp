// akv caches (HDF5): one of the committed fixture caches (quantized v1, evicted v1, tiered v2,
// ggml blocks v3 and per-head types v3, rotated v4, TurboQuant rows v4 with and without QJL, fp8
// v5, nuq v6),
// edited by h5_mutator, opened, described (akv info) and every head read and rebuilt the way
// decompress and evaluate --cache do.
#include <fuzzer/FuzzedDataProvider.h>

#include <memory>
#include <vector>

#include "akv/io/dump.h"
#include "akv/kv/cache_file.h"
#include "akv/kv/compress.h"
#include "akv/kv/inspect_cache.h"
#include "fuzz_common.h"
#include "h5_mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  // The template from one byte b: b % 7 among the first seven for b < 196 (as when they were the
  // only ones, so the kept regression inputs still edit the cache they were found on), the rest
  // of b's range among the later four.
  static const char* kFirst[] = {"cache-v1-kivi.h5", "cache-v1-evict.h5",      "cache-v2-tiered.h5",
                                 "cache-v3-ggml.h5", "cache-v4-rotate.h5",     "cache-v4-turboquant.h5",
                                 "cache-v5-fp8.h5"};
  static const char* kLater[] = {"cache-v3-types.h5", "cache-v3-joint-types.h5", "cache-v4-turboquant-qjl.h5",
                                 "cache-v6-nuq.h5"};
  const std::uint8_t b = fdp.ConsumeIntegral<std::uint8_t>();
  const std::string tmpl = akv::fuzz::fixtures_dir() + "/" + (b < 196 ? kFirst[b % 7] : kLater[(b - 196) % 4]);
  const std::string path = akv::fuzz::work_dir() + "/cache.h5";
  akv::fuzz::mutate_h5_copy(tmpl, path, fdp);
  akv::fuzz::expect_akv_errors([&] {
    const akv::CacheReader cache(path);
    const akv::DumpMeta& m = cache.meta();
    std::unique_ptr<akv::RopeTable> table;
    if (cache.header().params.pre_rope) {
      // As decompress: pre-RoPE keys are rotated with the source dump's positions.
      const akv::DumpReader dump(akv::fuzz::fixtures_dir() + "/dump.h5");
      akv::check_cache_matches_dump(cache, dump);
      table = std::make_unique<akv::RopeTable>(m.head_dim, m.rope_theta, 0, m.n_tokens);
    }
    for (std::size_t l = 0; l < m.n_layers; ++l) {
      for (std::size_t h = 0; h < m.n_kv_heads; ++h) {
        const akv::HeadCache hc = cache.read_head(l, h);
        cache.stored_bytes(l, h);
        std::vector<float> k(hc.n_kept() * m.head_dim), v(k.size());
        akv::reconstruct_head(hc, {m.rope_layout, table.get()}, k.data(), v.data());
      }
    }
  });
  akv::fuzz::expect_akv_errors([&] { akv::inspect_cache(path); });
  return 0;
}
