#include "akv/bench/decode_bench.h"

#include <fmt/format.h>

#include <chrono>

#include "akv/core/errors.h"
#include "akv/policy/kv_runtime.h"

namespace akv {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DecodeBenchResult bench_decode(const Model& model,
                               const std::vector<std::vector<std::int32_t>>& seqs,
                               const std::vector<PplMethod>& given, std::size_t prompt, int repeats) {
  const ModelConfig& c = model.config();
  std::vector<PplMethod> methods = given;
  if (methods.empty() || methods[0].params) methods.insert(methods.begin(), PplMethod{"full", std::nullopt});
  DecodeBenchResult res;
  res.prompt = prompt;
  res.sequences = seqs.size();
  res.repeats = repeats;
  for (const auto& s : seqs) {
    if (prompt < 1 || prompt >= s.size()) {
      throw InvalidInput("prompt must be shorter than every sequence", {"", "--prefill", std::to_string(prompt)});
    }
    res.decoded += s.size() - prompt;
  }
  const KvGeometry g{c.kv_shape(), c.seq_len};
  std::vector<PrefillResult> pre;
  double best_prefill = 1e300;
  for (int r = 0; r < repeats; ++r) {
    pre.clear();
    const double t0 = now();
    for (const auto& s : seqs) pre.push_back(model.prefill({s.begin(), s.begin() + static_cast<std::ptrdiff_t>(prompt)}, false));
    best_prefill = std::min(best_prefill, now() - t0);
  }
  res.prefill_tokens_per_s = static_cast<double>(prompt * seqs.size()) / best_prefill;
  std::vector<double> best(methods.size(), 1e300);
  std::vector<std::uint64_t> bytes(methods.size(), 0);
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t mi = 0; mi < methods.size(); ++mi) {
      double t = 0;
      bytes[mi] = 0;
      for (std::size_t si = 0; si < seqs.size(); ++si) {
        auto cache = make_kv_policy(methods[mi].params, g, 1);
        cache->ingest_prompt({&pre[si].query, &pre[si].key, &pre[si].key_pre_rope, &pre[si].value, prompt});
        const double t0 = now();
        for (std::size_t pos = prompt; pos < seqs[si].size(); ++pos) model.decode(seqs[si][pos], pos, *cache);
        t += now() - t0;
        bytes[mi] += cache->bytes();
      }
      best[mi] = std::min(best[mi], t);
    }
  }
  for (std::size_t mi = 0; mi < methods.size(); ++mi) {
    DecodeBenchRow row;
    row.spec = methods[mi].spec;
    row.description = methods[mi].params ? describe(*methods[mi].params) : "f32 K/V (reference)";
    row.decode_tokens_per_s = static_cast<double>(res.decoded) / best[mi];
    row.ratio_to_full = best[mi] / best[0];
    row.bytes = bytes[mi] / seqs.size();
    res.rows.push_back(row);
  }
  return res;
}

nlohmann::json DecodeBenchResult::to_json() const {
  nlohmann::json j = {{"format", "akv-bench-decode"}, {"version", 1}, {"prompt", prompt},
                      {"decoded_tokens", decoded}, {"sequences", sequences}, {"repeats", repeats},
                      {"prefill_tokens_per_s", prefill_tokens_per_s}};
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& r : rows) {
    rows_j.push_back({{"method", r.spec}, {"description", r.description},
                      {"decode_tokens_per_s", r.decode_tokens_per_s},
                      {"time_per_token_vs_full", r.ratio_to_full}, {"cache_bytes", r.bytes}});
  }
  j["methods"] = rows_j;
  return j;
}

std::string DecodeBenchResult::to_table() const {
  std::string out = fmt::format(
      "{} sequences, prompt {} tokens, {} decoded tokens per method, best of {}; prefill {:.0f} tokens/s\n",
      sequences, prompt, decoded, repeats, prefill_tokens_per_s);
  out += fmt::format("{:<36} {:>14} {:>12} {:>12}  {}\n", "method", "decode tok/s", "x full time",
                     "cache bytes", "description");
  for (const auto& r : rows) {
    out += fmt::format("{:<36} {:>14.0f} {:>12.2f} {:>12}  {}\n", r.spec, r.decode_tokens_per_s,
                       r.ratio_to_full, r.bytes, r.description);
  }
  return out;
}

}  // namespace akv
