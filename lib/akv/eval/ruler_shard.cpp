#include "akv/eval/ruler_shard.h"

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/eval/parts.h"
#include "akv/io/json_file.h"

namespace akv {

constexpr const char* kRulerPart = "akv-ruler-part";

nlohmann::json ruler_part_json(const RulerReport& r, const Shard& s, const PplRun& run) {
  const nlohmann::json ratios = json_map(r.ratios, [](const auto& x) { return x ? nlohmann::json(*x) : nlohmann::json(); });
  return {{"format", kRulerPart},       {"version", 1},
          {"shard", s.k},                {"shards", s.n},
          {"first_sample", r.first_sample}, {"total_samples", r.total_samples},
          {"inputs", run.inputs},        {"params", run.params},
          {"specs", r.specs},            {"descriptions", r.descriptions},
          {"bases", r.bases},            {"ratios", ratios},
          {"tasks", r.tasks},            {"lengths", r.lengths},        {"depths", r.depths},
          {"samples", r.samples},        {"answer_prefix", r.prefix},
          {"query_aware", r.query_aware}, {"scores", r.score},  // exact doubles: k / n of each sample
          {"prompt_tokens", r.prompt_tokens}, {"kv_bytes", r.kv_bytes}, {"peak_kv_bytes", r.peak_kv_bytes}};
}

RulerReport merge_ruler_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order =
      shard_order(parts, kRulerPart,
                  {"inputs", "params", "specs", "bases", "ratios", "tasks", "lengths", "depths", "samples",
                   "answer_prefix", "query_aware", "total_samples"});
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  RulerReport r;
  json_errors_as<InvalidInput>("partial report field missing or of the wrong type", {file0}, [&] {
    read_method_lists(file0, first, r.specs, r.descriptions);
    r.bases = first.at("bases").get<std::vector<std::string>>();
    for (const nlohmann::json& x : first.at("ratios")) {
      r.ratios.push_back(x.is_null() ? std::nullopt : std::optional<double>(x.get<double>()));
    }
    if (r.bases.size() != r.specs.size() || r.ratios.size() != r.specs.size()) {
      throw InvalidInput("one base and one ratio per method", {file0, "bases", std::to_string(r.bases.size())});
    }
    r.tasks = first.at("tasks").get<std::vector<std::string>>();
    for (const std::string& t : r.tasks) ruler_task(t);
    r.lengths = json_uints(first.at("lengths"));
    r.depths = read_depths(file0, first);
    r.samples = json_uint(first.at("samples"));
    r.prefix = first.at("answer_prefix").get<std::string>();
    parse_answer_prefix(r.prefix);
    r.query_aware = first.at("query_aware").get<bool>();
    r.total_samples = json_uint(first.at("total_samples"));
    const std::size_t grid =
        checked_product({r.tasks.size(), r.lengths.size(), std::max<std::size_t>(r.depths.size(), 1), r.samples}, {file0, "samples"});
    if (r.total_samples != grid) {
      throw InvalidInput("total samples differ from tasks x lengths x depths x samples (" + std::to_string(grid) + ")",
                         {file0, "total_samples", std::to_string(r.total_samples)});
    }
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_sample", "samples", r.score.size());
      const auto scores = j.at("scores").get<std::vector<std::vector<double>>>();
      const auto tokens = json_uints(j.at("prompt_tokens"));
      if (tokens.size() != scores.size()) {
        throw InvalidInput("prompt lengths and scores of different sample counts", {file, "prompt_tokens", std::to_string(tokens.size())});
      }
      for (const auto& row : scores) {
        if (row.size() != r.specs.size()) throw InvalidInput("a sample without every method", {file, "scores", std::to_string(row.size())});
        for (double v : row) {
          if (!(v >= 0.0 && v <= 1.0)) throw InvalidInput("a score outside [0, 1]", {file, "scores", format_number(v)});
        }
        r.score.push_back(row);
      }
      read_method_rows(file, j, "kv_bytes", r.specs.size(), r.score.size(), r.kv_bytes);
      read_method_rows(file, j, "peak_kv_bytes", r.specs.size(), r.score.size(), r.peak_kv_bytes);
      r.prompt_tokens.insert(r.prompt_tokens.end(), tokens.begin(), tokens.end());
    }
  });
  check_parts_hold(file0, "total_samples", "samples", r.score.size(), r.total_samples);
  return r;
}

}  // namespace akv
