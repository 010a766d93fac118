// `akv merge` parts (evaluate's perplexity, passkey and ruler parts, bench and bench decode parts): one
// input is read as the CLI reads a part, merged alone and as two parts (itself twice), and every
// merged report is rendered as merge renders it (table, CSV, JSON). The fidelity and calibration
// merges are left out: they open the dump and cache files a part names.
#include "akv/bench/bench_shard.h"
#include "akv/bench/decode_bench.h"
#include "akv/eval/model_parts.h"
#include "akv/io/json_file.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = akv::fuzz::write_input("part.json", data, size);
  akv::fuzz::expect_akv_errors([&] {
    const nlohmann::json j = akv::read_json_file(path, "partial output", akv::read_json_format(path), 1);
    const std::vector<std::pair<std::string, nlohmann::json>> one{{path, j}}, two{{path, j}, {path + "2", j}};
    for (const auto* parts : {&one, &two}) {
      akv::fuzz::expect_akv_errors([&] {
        const akv::PplReport r = akv::merge_ppl_parts(*parts);
        (void)r.to_table(), (void)r.to_csv(), (void)r.to_json().dump();
      });
      akv::fuzz::expect_akv_errors([&] {
        const akv::PasskeyReport r = akv::merge_passkey_parts(*parts);
        (void)r.to_table(), (void)r.to_json().dump();
      });
      akv::fuzz::expect_akv_errors([&] {
        const akv::RulerReport r = akv::merge_ruler_parts(*parts);
        (void)r.to_table(), (void)r.to_csv(), (void)r.to_json().dump();
      });
      akv::fuzz::expect_akv_errors([&] {
        const akv::DecodeBenchResult r = akv::merge_decode_parts(*parts);
        (void)r.to_table(), (void)r.to_json().dump();
      });
    }
  });
  akv::fuzz::expect_akv_errors([&] {
    const nlohmann::ordered_json j =
        akv::read_ordered_json_file(path, "partial output", akv::read_json_format(path), 1);
    const akv::BenchReport r = akv::merge_bench_parts({{path, j}});
    (void)r.to_table(akv::bench_columns(r.suite())), (void)r.to_csv(), (void)r.to_json().dump();
  });
  return 0;
}
