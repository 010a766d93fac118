#include "akv/bench/decode_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>

#include "akv/core/errors.h"
#include "akv/eval/kvzap_prefill.h"
#include "akv/eval/lanes.h"
#include "akv/eval/parts.h"
#include "akv/io/json_file.h"
#include "akv/kv/runtime.h"

namespace akv {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DecodeBenchResult bench_decode(const Model& model,
                               const std::vector<std::vector<std::int32_t>>& seqs,
                               const std::vector<PplMethod>& given, std::size_t prompt, int repeats,
                               const std::optional<Shard>& shard, std::size_t batch, int threads, bool full) {
  batch = std::max<std::size_t>(batch, 1);
  const ModelConfig& c = model.config();
  std::vector<PplMethod> methods;
  if (full) methods.push_back(PplMethod{kFullMethod, std::nullopt});
  std::vector<PplMethod> others;
  for (const auto& m : given) {
    if (m.params) others.push_back(m);
  }
  const auto [lo, hi] = shard ? shard->range(others.size()) : std::pair<std::size_t, std::size_t>{0, others.size()};
  methods.insert(methods.end(), others.begin() + static_cast<std::ptrdiff_t>(lo),
                 others.begin() + static_cast<std::ptrdiff_t>(hi));
  DecodeBenchResult res;
  res.prompt = prompt;
  res.sequences = seqs.size();
  res.repeats = repeats;
  res.shard = shard;
  res.batch = batch;
  res.threads = threads;
  for (const auto& s : seqs) {
    if (prompt < 1 || prompt >= s.size()) {
      throw InvalidInput("prompt must be shorter than every sequence", {"", "--prefill", std::to_string(prompt)});
    }
    res.decoded += s.size() - prompt;
  }
  std::size_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.size());
  std::vector<std::optional<CompressParams>> params;
  for (const PplMethod& m : methods) params.push_back(m.params);
  const KvGeometry g = run_geometry(c, longest, params);
  // Each repeat prefills every sequence once; the caches that take the prompt a layer at a time
  // are filled as the prefill finishes each layer (inside its timing: a real prefill writes its
  // cache), and the prefill keeps its layers only for the other methods' caches.
  std::vector<PrefillResult> pre(seqs.size());
  // kvzap methods score each prompt from its attention inputs (per sequence, kept to its ingest).
  const KvzapPrefill zaps(params, c);
  std::vector<std::vector<TokenScores>> zap(seqs.size());
  std::vector<std::vector<std::unique_ptr<KvPolicy>>> caches(methods.size());  // [method][sequence]
  // The prompts' last queries are kept as far as some method's cache reads them.
  std::size_t query_rows = 0;
  for (const PplMethod& m : methods) query_rows = std::max(query_rows, prompt_query_rows(m.params, prompt));
  double best_prefill = 1e300;
  std::vector<double> best(methods.size(), 1e300);
  std::vector<std::uint64_t> bytes(methods.size(), 0);
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now();
    for (std::size_t si = 0; si < seqs.size(); ++si) {
      bool keep = false;
      for (std::size_t mi = 0; mi < methods.size(); ++mi) {
        caches[mi].resize(seqs.size());
        caches[mi][si] = make_kv_policy(methods[mi].params, g, 1);
        keep = keep || !caches[mi][si]->takes_prompt_layers();
      }
      zap[si] = zaps.fresh();
      const LayerKvFn on_layer = [&](std::size_t l, const Tensor3& q, const Tensor3& k, const Tensor3& kp, const Tensor3& v) {
        for (std::size_t mi = 0; mi < methods.size(); ++mi) {
          KvPolicy& cache = *caches[mi][si];
          if (cache.takes_prompt_layers()) cache.ingest_prompt_layer(l, {&k, &kp, &v, &q, zaps.layer_of(mi, zap[si], l)});
        }
        return keep;
      };
      pre[si] = model.prefill({seqs[si].begin(), seqs[si].begin() + static_cast<std::ptrdiff_t>(prompt)}, false, threads,
                              query_rows, zaps.input_fn(zap[si]), on_layer);
    }
    best_prefill = std::min(best_prefill, now() - t0);
    for (std::size_t mi = 0; mi < methods.size(); ++mi) {
      double t = 0;
      bytes[mi] = 0;
      for (std::size_t si = 0; si < seqs.size(); ++si) {
        KvPolicy& cache = *caches[mi][si];
        if (!cache.takes_prompt_layers()) {
          cache.ingest_prompt({&pre[si].query, &pre[si].key, &pre[si].key_pre_rope, &pre[si].value, prompt, zaps.of(mi, zap[si])});
        }
      }
      for (std::size_t b0 = 0; b0 < seqs.size(); b0 += batch) {
        const std::size_t nb = std::min(batch, seqs.size() - b0);
        std::vector<DecodeLane> lanes;
        for (std::size_t i = 0; i < nb; ++i) {
          const auto& seq = seqs[b0 + i];
          lanes.push_back({caches[mi][b0 + i].get(), prompt, seq.size() - prompt, seq.data() + prompt, nullptr});
        }
        const double t1 = now();
        // One step of every unfinished sequence a call (the tokens are known; one at a time, as
        // decode runs them).
        run_lanes(model, lanes, 1, {}, [](const std::vector<LaneRows>&, const RowMatrix&) {}, threads,
                  AttentionMode::exact);
        t += now() - t1;
        for (std::size_t i = 0; i < nb; ++i) bytes[mi] += caches[mi][b0 + i]->bytes();
      }
      best[mi] = std::min(best[mi], t);
      caches[mi].clear();  // a method's caches are done once decoded
    }
    pre.assign(seqs.size(), PrefillResult{});
  }
  res.prefill_tokens_per_s = static_cast<double>(prompt * seqs.size()) / best_prefill;
  for (std::size_t mi = 0; mi < methods.size(); ++mi) {
    DecodeBenchRow row;
    row.spec = methods[mi].spec;
    row.description = methods[mi].params ? describe(*methods[mi].params) : "f32 K/V (reference)";
    row.decode_tokens_per_s = static_cast<double>(res.decoded) / best[mi];
    row.ratio_to_full = full ? best[mi] / best[0] : NAN;
    row.bytes = bytes[mi] / seqs.size();
    row.shard = shard ? shard->k : 0;
    res.rows.push_back(row);
  }
  return res;
}

nlohmann::json DecodeBenchResult::to_json() const {
  const bool part = shard.has_value();
  nlohmann::json j = {{"format", part ? "akv-bench-decode-part" : "akv-bench-decode"}, {"version", 1}, {"prompt", prompt},
                      {"decoded_tokens", decoded}, {"sequences", sequences}, {"repeats", repeats},
                      {"prefill_tokens_per_s", prefill_tokens_per_s}, {"batch", batch}, {"threads", threads}};
  if (part) {
    j["shard"] = shard->k;
    j["shards"] = shard->n;
  }
  if (!inputs.is_null()) j["inputs"] = inputs;
  if (!params.is_null()) j["params"] = params;
  if (!shard_prefill_tokens_per_s.empty()) j["shard_prefill_tokens_per_s"] = shard_prefill_tokens_per_s;
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& r : rows) {
    rows_j.push_back({{"method", r.spec}, {"description", r.description},
                      {"decode_tokens_per_s", r.decode_tokens_per_s},
                      {"time_per_token_vs_full", std::isnan(r.ratio_to_full) ? nlohmann::json(nullptr) : nlohmann::json(r.ratio_to_full)},
                      {"cache_bytes", r.bytes}});
    if (r.shard) rows_j.back()["shard"] = r.shard;
  }
  j["methods"] = rows_j;
  return j;
}

std::string DecodeBenchResult::to_table() const {
  std::string out = fmt::format(
      "{} sequences ({} at a time, {} threads), prompt {} tokens, {} decoded tokens per method, best of {}; "
      "prefill {:.0f} tokens/s\n",
      sequences, batch, threads, prompt, decoded, repeats, prefill_tokens_per_s);
  const bool sharded = std::any_of(rows.begin(), rows.end(), [](const DecodeBenchRow& r) { return r.shard != 0; });
  if (sharded) out += "shards time their methods against their own full cache (x full time); shard 1's prefill above\n";
  std::size_t width = 36;  // the method column: the longest spec
  for (const auto& r : rows) width = std::max(width, r.spec.size());
  out += fmt::format("{:<{}} {:>14} {:>12} {:>12}{}  {}\n", "method", width, "decode tok/s", "x full time",
                     "cache bytes", sharded ? "  shard" : "", "description");
  for (const auto& r : rows) {
    out += fmt::format("{:<{}} {:>14.0f} {:>12} {:>12}{}  {}\n", r.spec, width, r.decode_tokens_per_s,
                       std::isnan(r.ratio_to_full) ? "-" : fmt::format("{:.2f}", r.ratio_to_full), r.bytes, sharded ? fmt::format(" {:>6}", r.shard) : "", r.description);
  }
  return out;
}

DecodeBenchResult merge_decode_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order =
      shard_order(parts, "akv-bench-decode-part", {"inputs", "params", "prompt", "decoded_tokens", "sequences", "repeats"});
  const std::string& file0 = parts[order[0]].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[order[0]].second;
  DecodeBenchResult res;
  json_errors_as<InvalidInput>("partial decode bench field missing or of the wrong type", {file0}, [&] {
    res.prompt = json_uint(first.at("prompt"));
    res.decoded = json_uint(first.at("decoded_tokens"));
    res.sequences = json_uint(first.at("sequences"));
    res.repeats = json_i32(first.at("repeats"));
    res.batch = json_uint_or(first, "batch", 1);
    res.threads = first.contains("threads") ? json_i32(first.at("threads")) : 1;
    res.prefill_tokens_per_s = first.at("prefill_tokens_per_s").get<double>();
    res.inputs = first.at("inputs");
    res.params = first.at("params");
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      res.shard_prefill_tokens_per_s.push_back(j.at("prefill_tokens_per_s").get<double>());
      for (const auto& m : j.at("methods")) {
        DecodeBenchRow r;
        r.spec = m.at("method").get<std::string>();
        r.description = m.at("description").get<std::string>();
        r.decode_tokens_per_s = m.at("decode_tokens_per_s").get<double>();
        const nlohmann::json& ratio = m.at("time_per_token_vs_full");
        r.ratio_to_full = ratio.is_null() ? NAN : ratio.get<double>();
        r.bytes = json_uint(m.at("cache_bytes"));
        r.shard = json_uint(m.at("shard"));
        if (r.shard != json_uint(j.at("shard"))) throw InvalidInput("a row of another shard", {file, "methods[].shard", std::to_string(r.shard)});
        res.rows.push_back(std::move(r));
      }
    }
  });
  return res;
}

}  // namespace akv
