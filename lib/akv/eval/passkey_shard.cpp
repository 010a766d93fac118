#include "akv/eval/passkey_shard.h"

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/eval/parts.h"
#include "akv/io/json_file.h"

namespace akv {

constexpr const char* kPasskeyPart = "akv-passkey-part";

nlohmann::json passkey_part_json(const PasskeyReport& r, const Shard& s, const PplRun& run) {
  const nlohmann::json outcomes =
      json_map(r.outcomes, [](const auto& row) { return json_map(row, [](char ok) { return static_cast<int>(ok); }); });
  nlohmann::json j = {{"format", kPasskeyPart}, {"version", 1}, {"shard", s.k}, {"shards", s.n},
                      {"first_prompt", r.first_prompt}, {"total_prompts", r.total_prompts}, {"inputs", run.inputs},
                      {"params", run.params}, {"mode", r.mode}, {"specs", r.specs}, {"descriptions", r.descriptions},
                      {"lengths", r.lengths}, {"depths", r.depths}, {"trials", r.trials}, {"outcomes", outcomes},
                      {"query_agnostic", r.query_agnostic},
                      // exact doubles: the merge sums them as the whole run does
                      {"key_logprob", r.key_logprob}, {"kv_bytes", r.kv_bytes}, {"bits", r.bits},
                      {"peak_kv_bytes", r.peak_kv_bytes}};
  return j;
}

PasskeyReport merge_passkey_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order =
      shard_order(parts, kPasskeyPart, {"inputs", "params", "specs", "lengths", "depths", "trials", "total_prompts"});
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  PasskeyReport r;
  json_errors_as<InvalidInput>("partial report field missing or of the wrong type", {file0}, [&] {
    r.mode = first.at("mode").get<std::string>();
    if (r.mode != "token" && r.mode != "text") throw InvalidInput("unknown passkey mode (token, text)", {file0, "mode", excerpt(r.mode, 40)});
    read_method_lists(file0, first, r.specs, r.descriptions);
    for (const char* key : {"trials", "total_prompts"}) {
      if (!first.at(key).is_number_unsigned()) throw InvalidInput("a count that is not a non-negative integer", {file0, key, excerpt(first.at(key).dump(), 40)});
    }
    for (const nlohmann::json& l : first.at("lengths")) {
      if (!l.is_number_unsigned()) throw InvalidInput("a length that is not a non-negative integer", {file0, "lengths", excerpt(l.dump(), 40)});
    }
    r.lengths = json_uints(first.at("lengths"));
    r.depths = read_depths(file0, first);
    r.trials = json_uint(first.at("trials"));
    r.query_agnostic = first.at("query_agnostic").get<bool>();
    r.total_prompts = json_uint(first.at("total_prompts"));
    const std::size_t grid = checked_product({r.trials, r.lengths.size(), r.depths.size()}, {file0, "trials"});
    if (r.total_prompts != grid) {
      throw InvalidInput("total prompts differ from trials x lengths x depths (" + std::to_string(grid) + ")",
                         {file0, "total_prompts", std::to_string(r.total_prompts)});
    }
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_prompt", "prompts", r.outcomes.size());
      for (const nlohmann::json& line : j.at("outcomes")) {
        std::vector<char> row;
        for (const nlohmann::json& ok : line) {
          const int v = json_i32(ok);
          if (v != 0 && v != 1) throw InvalidInput("an outcome other than 0 or 1", {file, "outcomes", ok.dump()});
          row.push_back(static_cast<char>(v));
        }
        if (row.size() != r.specs.size()) throw InvalidInput("a prompt without every method", {file, "outcomes", line.dump()});
        r.outcomes.push_back(std::move(row));
      }
      read_method_rows(file, j, "key_logprob", r.specs.size(), r.outcomes.size(), r.key_logprob);
      read_method_rows(file, j, "kv_bytes", r.specs.size(), r.outcomes.size(), r.kv_bytes);
      read_method_rows(file, j, "bits", r.specs.size(), r.outcomes.size(), r.bits);
      read_method_rows(file, j, "peak_kv_bytes", r.specs.size(), r.outcomes.size(), r.peak_kv_bytes);
    }
  });
  check_parts_hold(file0, "total_prompts", "prompts", r.outcomes.size(), r.total_prompts);
  r.tally();
  return r;
}

}  // namespace akv
