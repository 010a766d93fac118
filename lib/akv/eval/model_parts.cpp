#include "akv/eval/model_parts.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <type_traits>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/params.h"

namespace akv {
namespace {

constexpr const char* kPerplexityPart = "akv-perplexity-part";
constexpr const char* kPasskeyPart = "akv-passkey-part";
constexpr const char* kRulerPart = "akv-ruler-part";

// A part's "specs" and "descriptions": the full cache first, one description per method;
// InvalidInput naming the file and field otherwise (reports index one list by the other).
void read_method_lists(const std::string& file, const nlohmann::json& j, std::vector<std::string>& specs,
                       std::vector<std::string>& descriptions) {
  specs = j.at("specs").get<std::vector<std::string>>();
  descriptions = j.at("descriptions").get<std::vector<std::string>>();
  if (specs.empty() || specs[0] != kFullMethod) {
    throw InvalidInput("the methods must start with the full cache", {file, "specs", excerpt(j.at("specs").dump(), 60)});
  }
  if (descriptions.size() != specs.size()) {
    throw InvalidInput("one description per method (" + std::to_string(specs.size()) + ")",
                       {file, "descriptions", std::to_string(descriptions.size()) + " entries"});
  }
}

// The parts' items (sequences, prompts, samples) against the run's total (the first part's
// j[field]): InvalidInput "parts hold N items, the run M" naming the file and field otherwise.
void check_parts_hold(const std::string& file, const char* field, const char* items, std::size_t held,
                      std::size_t total) {
  if (held != total) {
    throw InvalidInput("parts hold " + std::to_string(held) + " " + items + ", the run " + std::to_string(total),
                       {file, field, std::to_string(total)});
  }
}

// A part's "depths": numbers in [0, 1]; InvalidInput naming the file and the value otherwise.
std::vector<double> read_depths(const std::string& file, const nlohmann::json& j) {
  std::vector<double> depths = j.at("depths").get<std::vector<double>>();
  for (double d : depths) {
    if (!(d >= 0.0 && d <= 1.0)) throw InvalidInput("a depth outside [0, 1]", {file, "depths", format_number(d)});
  }
  return depths;
}

// Appends part `file`'s per-item rows at j[key] (one value per method; items = prompts, samples)
// to `rows`, which must then hold `items` rows (the items read so far); integer rows take
// non-negative integers only. InvalidInput naming the file and field otherwise.
template <typename T>
void read_method_rows(const std::string& file, const nlohmann::json& j, const char* key, std::size_t methods,
                      std::size_t items, std::vector<std::vector<T>>& rows) {
  const nlohmann::json& all = j.at(key);
  if (!all.is_array()) throw InvalidInput("not an array of rows", {file, key, excerpt(all.dump(), 40)});
  for (const nlohmann::json& line : all) {
    std::vector<T> row;
    if constexpr (std::is_same_v<T, double>) row = line.get<std::vector<double>>();
    else row = json_uints(line);
    if (row.size() != methods) throw InvalidInput("a row without every method", {file, key, excerpt(line.dump(), 40)});
    rows.push_back(std::move(row));
  }
  if (rows.size() != items) {
    throw InvalidInput("rows and items of different counts (" + std::to_string(items) + " items)",
                       {file, key, std::to_string(rows.size())});
  }
}

nlohmann::json sums_json(const PplSums& s) {
  nlohmann::json j;
  PplSums::fields([&](const char* name, auto m) { j[name] = s.*m; });
  return j;
}

PplSums sums_from(const nlohmann::json& j, const std::string& file) {
  PplSums s;
  PplSums::fields([&](const char* name, auto m) {
    if constexpr (std::is_same_v<std::decay_t<decltype(s.*m)>, double>) s.*m = j.at(name).get<double>();
    else s.*m = part_count(j, name, file);
  });
  // A sequence's sums as evaluate writes them: at least one prediction, top-1 hits among them,
  // a finite non-negative NLL, a finite KL (tiny negative values come from rounding).
  if (s.tokens == 0) throw InvalidInput("a sequence with no predicted token", {file, "tokens", "0"});
  if (s.top1 > s.tokens) throw InvalidInput("more top-1 hits than tokens (" + std::to_string(s.tokens) + ")", {file, "top1", std::to_string(s.top1)});
  if (!std::isfinite(s.nll) || s.nll < 0) throw InvalidInput("NLL sum not a finite non-negative number", {file, "nll", format_number(s.nll)});
  if (!std::isfinite(s.kl)) throw InvalidInput("KL sum not finite", {file, "kl", format_number(s.kl)});
  return s;
}

nlohmann::json trace_json(const MemoryTrace& t) {
  nlohmann::json j = {{"tokens", t.tokens}, {"bytes", t.bytes}};
  MemoryTrace::tier_columns([&](const char* name, const char*, auto m) { j[name] = t.column(m); });
  return j;
}

MemoryTrace trace_from(const nlohmann::json& j, const std::string& file) {
  MemoryTrace t;
  t.tokens = json_uints(j.at("tokens"));
  t.bytes = json_uints(j.at("bytes"));
  t.tiers.resize(j.at("hot").size());  // each column as long as the first
  MemoryTrace::tier_columns([&](const char* name, const char*, auto m) {
    const std::vector<std::uint64_t> c = json_uints(j.at(name));
    if (c.size() != t.tiers.size()) throw InvalidInput("tier columns of different lengths", {file, name, std::to_string(c.size())});
    for (std::size_t i = 0; i < c.size(); ++i) t.tiers[i].*m = c[i];
  });
  return t;
}

}  // namespace

nlohmann::json ppl_part_json(const PplReport& r, const Shard& s, std::size_t first, std::size_t total, const PplRun& run) {
  const nlohmann::json seqs = json_map(r.sequences, [](const auto& seq) {
    return json_map(seq, [](const PplSums& m) { return sums_json(m); });
  });
  nlohmann::json traces = nlohmann::json::array();
  if (first == 0 && !r.sequences.empty()) {  // the run's sequence 0 (a shard may hold none)
    traces = json_map(r.traces, [](const MemoryTrace& t) { return trace_json(t); });
  }
  nlohmann::json part = {{"format", kPerplexityPart}, {"version", 1}, {"shard", s.k}, {"shards", s.n},
                         {"first_sequence", first}, {"total_sequences", total}, {"inputs", run.inputs},
                         {"params", run.params}, {"specs", r.specs}, {"descriptions", r.descriptions},
                         {"attention", attention_mode_name(r.attention)}, {"prompt_tokens", r.prompt_tokens},
                         {"sequences", seqs}, {"memory_traces", traces}};
  if (r.prefill_mode != PrefillMode::exact) part["prefill_mode"] = prefill_mode_name(r.prefill_mode);
  return part;
}

PplReport merge_ppl_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order = shard_order(parts, kPerplexityPart, {"inputs", "params", "specs", "attention", "total_sequences"});
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  PplReport r;
  std::size_t total = 0;
  json_errors_as<InvalidInput>("partial report field missing or of the wrong type", {file0}, [&] {
    total = part_count(first, "total_sequences", file0);
    read_method_lists(file0, first, r.specs, r.descriptions);
    const std::string attention = first.at("attention").get<std::string>();
    if (attention != "exact" && attention != "int8") {
      throw InvalidInput("unknown attention path (exact, int8)", {file0, "attention", attention});
    }
    r.attention = parse_attention_mode(attention);
    const std::string prefill = first.value("prefill_mode", "exact");
    for (const auto& [file, j] : parts) {
      if (j.value("prefill_mode", "exact") != prefill) {
        throw InvalidInput("part of another run: prefill_mode differs from " + file0 + "'s",
                           {file, "prefill_mode", j.value("prefill_mode", "exact")});
      }
    }
    r.prefill_mode = parse_prefill_mode(prefill);
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_sequence", "sequences", r.sequences.size());
      for (const nlohmann::json& row : j.at("sequences")) {
        std::vector<PplSums> seq;
        for (const nlohmann::json& m : row) seq.push_back(sums_from(m, file));
        if (seq.size() != r.specs.size()) throw InvalidInput("a sequence without every method", {file, "sequences", std::to_string(seq.size())});
        r.sequences.push_back(std::move(seq));
      }
      const auto prompts = json_uints(j.at("prompt_tokens"));
      r.prompt_tokens.insert(r.prompt_tokens.end(), prompts.begin(), prompts.end());
      if (r.traces.empty()) {
        for (const nlohmann::json& t : j.at("memory_traces")) r.traces.push_back(trace_from(t, file));
        if (!r.traces.empty() && r.traces.size() != r.specs.size()) {
          throw InvalidInput("one memory trace per method (" + std::to_string(r.specs.size()) + ")",
                             {file, "memory_traces", std::to_string(r.traces.size()) + " entries"});
        }
      }
    }
  });
  check_parts_hold(file0, "total_sequences", "sequences", r.sequences.size(), total);
  check_parts_hold(file0, "total_sequences", "sequences", r.prompt_tokens.size(), total);
  return r;
}

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
    for (const nlohmann::json& l : first.at("lengths")) {
      if (!l.is_number_unsigned()) throw InvalidInput("a length that is not a non-negative integer", {file0, "lengths", excerpt(l.dump(), 40)});
    }
    r.lengths = json_uints(first.at("lengths"));
    r.depths = read_depths(file0, first);
    r.trials = part_count(first, "trials", file0);
    r.query_agnostic = first.at("query_agnostic").get<bool>();
    r.total_prompts = part_count(first, "total_prompts", file0);
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
    r.samples = part_count(first, "samples", file0);
    r.prefix = first.at("answer_prefix").get<std::string>();
    parse_answer_prefix(r.prefix);
    r.query_aware = first.at("query_aware").get<bool>();
    r.total_samples = part_count(first, "total_samples", file0);
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
