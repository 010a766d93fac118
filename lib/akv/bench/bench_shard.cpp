#include "akv/bench/bench_shard.h"

#include "akv/bench/attention_bench.h"
#include "akv/bench/policy_bench.h"
#include "akv/bench/quant_bench.h"
#include "akv/core/errors.h"
#include "akv/eval/parts.h"
#include "akv/io/json_file.h"

namespace akv {

std::vector<BenchColumn> bench_columns(const std::string& suite) {
  if (suite == "attention") return attention_columns();
  if (suite == "quant") return quant_columns();
  if (suite == "policy") return policy_columns();
  throw InvalidInput("unknown bench suite (attention, quant, policy)", {"", "suite", suite});
}

BenchReport merge_bench_parts(const std::vector<std::pair<std::string, nlohmann::ordered_json>>& parts) {
  std::vector<std::pair<std::string, nlohmann::json>> plain;
  for (const auto& [file, j] : parts) plain.emplace_back(file, nlohmann::json::parse(j.dump()));
  const std::vector<std::size_t> order = shard_order(plain, "akv-bench-part", {"suite", "params", "cases"});
  const std::string& file0 = parts[order[0]].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[order[0]].second;
  return json_errors_as<InvalidInput>("partial bench report field missing or of the wrong type", {file0}, [&] {
    const std::string suite = first.at("suite").get<std::string>();
    bench_columns(suite);  // a suite merge knows
    BenchEnv env{first.at("commit").get<std::string>(), first.at("cpu").get<std::string>(),
                 json_i32(first.at("threads"))};
    BenchReport rep(suite, env);
    rep.set_params(first.at("params"));
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    static const std::vector<std::string> kRunKeys = {"format", "version", "suite", "params", "shard", "shards",
                                                      "cases", "notes", "rows", "commit", "cpu", "threads"};
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      const std::size_t k = json_uint(j.at("shard"));
      nlohmann::ordered_json info = {{"shard", k}, {"commit", j.at("commit")}, {"cpu", j.at("cpu")},
                                     {"threads", j.at("threads")}};
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (std::find(kRunKeys.begin(), kRunKeys.end(), it.key()) == kRunKeys.end()) info[it.key()] = it.value();
      }
      shards.push_back(std::move(info));
      for (const auto& note : j.at("notes")) {
        const std::string line = note.get<std::string>();
        if (line.rfind("time ~ context^k", 0) == 0) continue;  // refitted over all rows below
        rep.note("shard " + std::to_string(k) + ": " + line);
      }
      for (const auto& row : j.at("rows")) {
        if (!row.is_object() || json_uint_or(row, "shard", 0) != k) {
          throw InvalidInput("a row of another shard", {file, "rows[].shard", row.is_object() && row.contains("shard") ? row["shard"].dump() : "missing"});
        }
        rep.rows().push_back(row);
      }
    }
    rep.set_extra("shards", shards);
    if (suite == "attention") fit_attention_scaling(rep);
    return rep;
  });
}

}  // namespace akv
