#include "akv/eval/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <span>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/core/parallel.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"

namespace akv {
namespace {

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// K/V error of head h over all tokens: kept tokens against their reconstruction k, v [n, d],
// others against 0.
void add_kv_errors(const HeadCache& hc, const Tensor3& key, const Tensor3& value, std::size_t h, std::size_t T,
                   std::size_t d, const float* k, const float* v, FidelitySums& s) {
  const std::size_t n = hc.n_kept();
  std::vector<bool> kept(T, hc.kept.empty());
  for (std::size_t i = 0; i < n; ++i) kept[hc.position(i)] = true;
  for (std::size_t t = 0; t < T; ++t) {
    const float* kr = key.row(h, t);
    const float* vr = value.row(h, t);
    for (std::size_t c = 0; c < d; ++c) {
      s.key_norm2 += static_cast<double>(kr[c]) * kr[c];
      s.value_norm2 += static_cast<double>(vr[c]) * vr[c];
      if (!kept[t]) {
        s.key_err2 += static_cast<double>(kr[c]) * kr[c];
        s.value_err2 += static_cast<double>(vr[c]) * vr[c];
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float* kr = key.row(h, hc.position(i));
    const float* vr = value.row(h, hc.position(i));
    for (std::size_t c = 0; c < d; ++c) {
      const double ek = static_cast<double>(kr[c]) - k[i * d + c];
      const double ev = static_cast<double>(vr[c]) - v[i * d + c];
      s.key_err2 += ek * ek;
      s.value_err2 += ev * ev;
    }
  }
}

// The sums of KV head h for the head of each cache (hcs[c], read with ropes[c]): each query head's
// original attention computed once (attention_reference) for every cache. One query head at a
// time, each cache's head rebuilt for it: memory as for one cache (one reference, one rebuilt
// head), the rebuilding repeated per query head of the group.
std::vector<FidelitySums> evaluate_head(const std::vector<const HeadCache*>& hcs, const Tensor3& key,
                                        const Tensor3& value, const Tensor3& query, std::size_t h, const DumpMeta& m,
                                        const std::vector<const RopeContext*>& ropes) {
  const std::size_t d = m.head_dim, T = m.n_tokens, g = m.group_size();
  std::vector<std::size_t> all(T), qpos(m.n_query);
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::iota(qpos.begin(), qpos.end(), m.first_query_pos());
  std::vector<FidelitySums> out(hcs.size());
  std::vector<float> k, v;
  std::vector<std::size_t> pos;
  for (std::size_t qh = h * g; qh < (h + 1) * g; ++qh) {
    const AttentionInput o{query.row(qh, 0), key.row(h, 0), value.row(h, 0), m.n_query, T, d, qpos.data(), all.data()};
    AttentionReference ref = attention_reference(o);
    for (std::size_t c = 0; c < hcs.size(); ++c) {
      const HeadCache& hc = *hcs[c];
      FidelitySums& s = out[c];
      const std::size_t n = hc.n_kept();
      k.resize(n * d);
      v.resize(n * d);
      reconstruct_head(hc, *ropes[c], k.data(), v.data());
      if (qh == h * g) {
        s.heads = 1;
        add_kv_errors(hc, key, value, h, T, d, k.data(), v.data(), s);
      }
      pos.resize(n);
      for (std::size_t i = 0; i < n; ++i) pos[i] = hc.position(i);
      const AttentionInput ci{query.row(qh, 0), k.data(), v.data(), m.n_query, n, d, qpos.data(), pos.data()};
      const AttentionFidelity f = attention_fidelity(ref, o, ci);
      s.attn.out_err2 += f.out_err2;
      s.attn.out_norm2 += f.out_norm2;
      s.attn.kl += f.kl;
      s.attn.evicted_mass += f.evicted_mass;
      for (int r = 0; r < 3; ++r) s.attn.recall[r] += f.recall[r];
      s.attn.queries += f.queries;
    }
  }
  return out;
}

std::string sci(double v) { return fmt::format("{:.3e}", v); }

nlohmann::json metrics_json(const FidelityMetrics& m) {
  return {{"key_rel_mse", m.key_rel_mse},     {"value_rel_mse", m.value_rel_mse},
          {"attn_rel_err", m.attn_rel_err},   {"kl", m.kl},
          {"evicted_mass", m.evicted_mass},   {"retained_mass", m.retained_mass},
          {"recall_at_1", m.recall[0]},
          {"recall_at_8", m.recall[1]},       {"recall_at_32", m.recall[2]}};
}

}  // namespace

FidelitySums& FidelitySums::operator+=(const FidelitySums& o) {
  key_err2 += o.key_err2;
  key_norm2 += o.key_norm2;
  value_err2 += o.value_err2;
  value_norm2 += o.value_norm2;
  attn.out_err2 += o.attn.out_err2;
  attn.out_norm2 += o.attn.out_norm2;
  attn.kl += o.attn.kl;
  attn.evicted_mass += o.attn.evicted_mass;
  for (int r = 0; r < 3; ++r) attn.recall[r] += o.attn.recall[r];
  attn.queries += o.attn.queries;
  heads += o.heads;
  return *this;
}

FidelityMetrics metrics(const FidelitySums& s) {
  FidelityMetrics m;
  m.key_rel_mse = ratio(s.key_err2, s.key_norm2);
  m.value_rel_mse = ratio(s.value_err2, s.value_norm2);
  m.attn_rel_err = std::sqrt(ratio(s.attn.out_err2, s.attn.out_norm2));
  const double q = static_cast<double>(s.attn.queries);
  m.kl = ratio(s.attn.kl, q);
  m.evicted_mass = ratio(s.attn.evicted_mass, q);
  m.retained_mass = 1.0 - m.evicted_mass;
  for (int r = 0; r < 3; ++r) m.recall[r] = ratio(s.attn.recall[r], q);
  return m;
}

double FidelityReport::needle_survival() const {
  if (needles.empty() || heads.empty()) return 0.0;
  const double pairs = static_cast<double>(heads.size() * heads[0].size());
  double s = 0;
  for (std::size_t k : needle_kept) s += static_cast<double>(k) / pairs;
  return s / static_cast<double>(needles.size());
}

FidelitySums FidelityReport::layer_sums(std::size_t l) const {
  FidelitySums s;
  for (const auto& h : heads[l]) s += h;
  return s;
}

FidelitySums FidelityReport::total() const {
  FidelitySums s;
  for (std::size_t l = 0; l < heads.size(); ++l) s += layer_sums(l);
  return s;
}

nlohmann::json FidelityReport::to_json() const {
  nlohmann::json j;
  j["format"] = "akv-fidelity";
  j["version"] = 1;
  j["dump"] = dump_path;
  j["cache"] = cache_path;
  j["memory"] = memory.to_json();
  j["memory"].erase("layers");
  j["overall"] = metrics_json(metrics(total()));
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < heads.size(); ++l) {
    nlohmann::json row = metrics_json(metrics(layer_sums(l)));
    row["layer"] = l;
    nlohmann::json hs = nlohmann::json::array();
    for (std::size_t h = 0; h < heads[l].size(); ++h) {
      nlohmann::json hj = metrics_json(metrics(heads[l][h]));
      hj["kv_head"] = h;
      hs.push_back(hj);
    }
    row["heads"] = hs;
    layers.push_back(row);
  }
  j["layers"] = layers;
  if (!needles.empty()) {
    nlohmann::json nj = nlohmann::json::array();
    const double pairs = static_cast<double>(heads.size() * (heads.empty() ? 0 : heads[0].size()));
    for (std::size_t i = 0; i < needles.size(); ++i) {
      nj.push_back({{"position", needles[i]}, {"kept_fraction", static_cast<double>(needle_kept[i]) / pairs}});
    }
    j["needles"] = nj;
    j["overall"]["needle_survival"] = needle_survival();
  }
  return j;
}

std::string FidelityReport::to_csv() const {
  std::string out =
      "layer,kv_head,key_rel_mse,value_rel_mse,attn_rel_err,kl,evicted_mass,recall_at_1,"
      "recall_at_8,recall_at_32\n";
  for (std::size_t l = 0; l < heads.size(); ++l) {
    for (std::size_t h = 0; h < heads[l].size(); ++h) {
      const FidelityMetrics m = metrics(heads[l][h]);
      out += fmt::format("{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g}\n", l, h,
                         m.key_rel_mse, m.value_rel_mse, m.attn_rel_err, m.kl, m.evicted_mass,
                         m.recall[0], m.recall[1], m.recall[2]);
    }
  }
  return out;
}

std::string FidelityReport::to_table(bool per_head) const {
  const auto& p = memory.header.params;
  std::string out = fmt::format(
      "cache {} ({}): {} bytes, {:.3f} bits/element, {:.2f}x smaller than f16\n", cache_path,
      describe(p), memory.total.total(),
      memory.bits_per_element(), memory.ratio());
  out += fmt::format("{:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>7}\n", "layer", "head",
                     "key_mse", "value_mse", "attn_err", "kl", "top1", "top8", "top32");
  auto line = [&](const std::string& l, const std::string& h, const FidelityMetrics& m) {
    out += fmt::format("{:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>7.4f} {:>7.4f} {:>7.4f}\n", l, h,
                       sci(m.key_rel_mse), sci(m.value_rel_mse), sci(m.attn_rel_err), sci(m.kl),
                       m.recall[0], m.recall[1], m.recall[2]);
  };
  for (std::size_t l = 0; l < heads.size(); ++l) {
    if (per_head) {
      for (std::size_t h = 0; h < heads[l].size(); ++h) {
        line(std::to_string(l), std::to_string(h), metrics(heads[l][h]));
      }
    }
    line(std::to_string(l), "all", metrics(layer_sums(l)));
  }
  line("all", "all", metrics(total()));
  const FidelityMetrics all = metrics(total());
  if (all.evicted_mass > 1e-9) out += fmt::format("retained attention mass: {:.4f}\n", all.retained_mass);
  if (!needles.empty() && all.evicted_mass > 1e-9) {
    out += fmt::format("needles kept (mean over needles of layer/head pairs keeping them): {:.4f}\n",
                       needle_survival());
  }
  return out;
}

FidelityReport evaluate_cache(const std::string& dump_path, const std::string& cache_path,
                              int threads, bool verify_hash, const ProgressFn& progress, const Shard& shard) {
  return std::move(evaluate_caches(dump_path, {cache_path}, threads, verify_hash, progress, shard).front());
}

std::vector<FidelityReport> evaluate_caches(const std::string& dump_path, const std::vector<std::string>& cache_paths,
                                            int threads, bool verify_hash, const ProgressFn& progress,
                                            const Shard& shard) {
  DumpReader dump(dump_path);
  const DumpMeta& m = dump.meta();
  require_windows_hold_tokens(m, dump_path, "fidelity evaluation");
  std::vector<std::unique_ptr<CacheReader>> caches;
  std::vector<CacheRope> ropes;
  std::vector<FidelityReport> reports(cache_paths.size());
  const std::string dump_hash = verify_hash && !cache_paths.empty() ? file_hash(dump_path) : "";
  for (std::size_t c = 0; c < cache_paths.size(); ++c) {
    const std::string& cache_path = cache_paths[c];
    const CacheReader& cache = *caches.emplace_back(std::make_unique<CacheReader>(cache_path));
    if (verify_hash) {
      check_cache_matches_dump(cache, dump, dump_hash);
    } else if (cache.meta().n_layers != m.n_layers || cache.meta().n_kv_heads != m.n_kv_heads ||
               cache.meta().head_dim != m.head_dim || cache.meta().n_tokens != m.n_tokens) {
      throw InvalidInput("cache was made from a dump of another shape",
                         {cache_path, "source_path", cache.header().source_path});
    }
    FidelityReport& r = reports[c];
    r.dump_path = dump_path;
    r.cache_path = cache_path;
    r.memory = cache_memory(cache);
    r.heads.assign(m.n_layers, std::vector<FidelitySums>(m.n_kv_heads));
    if (dump.needles()) {
      r.needles = *dump.needles();
      r.needle_kept.assign(r.needles.size(), 0);
    }
    ropes.push_back(cache_rope(cache, m));
  }
  std::vector<const RopeContext*> contexts;
  for (const CacheRope& cr : ropes) contexts.push_back(&cr.context);
  const auto [lo, hi] = shard.range(m.n_layers);
  Tensor3 key, value, query;  // each layer in the previous one's storage
  for (std::size_t l = lo; l < hi; ++l) {
    dump.read_into(key, l, DumpField::key);
    dump.read_into(value, l, DumpField::value);
    dump.read_into(query, l, DumpField::query);
    // heads[h][c]: HDF5 reads stay on this thread.
    std::vector<std::vector<HeadCache>> heads(m.n_kv_heads, std::vector<HeadCache>(caches.size()));
    for (std::size_t h = 0; h < m.n_kv_heads; ++h) {
      for (std::size_t c = 0; c < caches.size(); ++c) heads[h][c] = caches[c]->read_head(l, h);
    }
    parallel_for(m.n_kv_heads, threads, [&](std::size_t h) {
      std::vector<const HeadCache*> hcs;
      for (const HeadCache& hc : heads[h]) hcs.push_back(&hc);
      const std::vector<FidelitySums> sums = evaluate_head(hcs, key, value, query, h, m, contexts);
      for (std::size_t c = 0; c < caches.size(); ++c) reports[c].heads[l][h] = sums[c];
    });
    for (std::size_t c = 0; c < caches.size(); ++c) {
      FidelityReport& r = reports[c];
      for (std::size_t i = 0; i < r.needles.size(); ++i) {
        for (std::size_t h = 0; h < m.n_kv_heads; ++h) {
          const HeadCache& hc = heads[h][c];
          const bool kept = hc.kept.empty() || std::binary_search(hc.kept.begin(), hc.kept.end(), r.needles[i]);
          r.needle_kept[i] += kept ? 1 : 0;
        }
      }
    }
    if (progress) progress(l + 1 - lo, hi - lo);
  }
  return reports;
}

namespace {

constexpr const char* kFidelityPart = "akv-fidelity-part";

nlohmann::json sums_json(const FidelitySums& s) {
  const AttentionFidelity& a = s.attn;
  return {{"key_err2", s.key_err2}, {"key_norm2", s.key_norm2}, {"value_err2", s.value_err2},
          {"value_norm2", s.value_norm2}, {"heads", s.heads}, {"out_err2", a.out_err2}, {"out_norm2", a.out_norm2},
          {"kl", a.kl}, {"evicted_mass", a.evicted_mass}, {"recall", {a.recall[0], a.recall[1], a.recall[2]}},
          {"queries", a.queries}};
}

FidelitySums sums_from(const nlohmann::json& j) {
  FidelitySums s;
  s.key_err2 = j.at("key_err2").get<double>();
  s.key_norm2 = j.at("key_norm2").get<double>();
  s.value_err2 = j.at("value_err2").get<double>();
  s.value_norm2 = j.at("value_norm2").get<double>();
  s.heads = json_uint(j.at("heads"));
  AttentionFidelity& a = s.attn;
  a.out_err2 = j.at("out_err2").get<double>();
  a.out_norm2 = j.at("out_norm2").get<double>();
  a.kl = j.at("kl").get<double>();
  a.evicted_mass = j.at("evicted_mass").get<double>();
  for (std::size_t k = 0; k < 3; ++k) a.recall[k] = j.at("recall").at(k).get<double>();
  a.queries = json_uint(j.at("queries"));
  return s;
}

}  // namespace

nlohmann::json fidelity_part_json(const FidelityReport& r, const Shard& shard) {
  const auto [lo, hi] = shard.range(r.heads.size());
  const nlohmann::json layers = json_map(std::span(r.heads).subspan(lo, hi - lo), [](const auto& heads) {
    return json_map(heads, [](const FidelitySums& s) { return sums_json(s); });
  });
  return {{"format", kFidelityPart}, {"version", 1}, {"shard", shard.k}, {"shards", shard.n},
          {"first_layer", lo}, {"n_layers", r.heads.size()},
          {"dump", {{"path", r.dump_path}, {"hash", file_hash(r.dump_path)}}},
          {"cache", {{"path", r.cache_path}, {"hash", file_hash(r.cache_path)}}},
          {"needles", r.needles}, {"needle_kept", r.needle_kept}, {"kernels", kernel_arithmetic()}, {"layers", layers}};
}

FidelityReport merge_fidelity_parts(const std::vector<std::pair<std::string, nlohmann::json>>& parts) {
  const std::vector<std::size_t> order = shard_order(parts, kFidelityPart, {"dump", "cache", "n_layers", "needles", "kernels"});
  const std::string& file0 = parts[0].first;  // not bound: clang before 16 cannot capture bindings
  const auto& first = parts[0].second;
  FidelityReport r;
  json_errors_as<InvalidInput>("partial report field missing or of the wrong type", {file0}, [&] {
    r.dump_path = first.at("dump").at("path").get<std::string>();
    r.cache_path = first.at("cache").at("path").get<std::string>();
    r.needles = json_i32s(first.at("needles"));
    r.needle_kept.assign(r.needles.size(), 0);
    for (std::size_t i : order) {
      const auto& [file, j] = parts[i];
      check_follows(file, j, "first_layer", "layers", r.heads.size());
      for (const nlohmann::json& row : j.at("layers")) {
        std::vector<FidelitySums> heads;
        for (const nlohmann::json& h : row) heads.push_back(sums_from(h));
        r.heads.push_back(std::move(heads));
      }
      const auto kept = json_uints(j.at("needle_kept"));
      if (kept.size() != r.needles.size()) throw InvalidInput("needle counts do not match the needles", {file, "needle_kept", std::to_string(kept.size())});
      for (std::size_t i2 = 0; i2 < kept.size(); ++i2) r.needle_kept[i2] += kept[i2];
    }
    if (r.heads.size() != json_uint(first.at("n_layers"))) {
      throw InvalidInput("parts hold " + std::to_string(r.heads.size()) + " layers", {file0, "n_layers", first.at("n_layers").dump()});
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(r.cache_path, ec)) {  // a FIFO or a device would be read forever
      throw InvalidInput("the cache a part names is not a regular file", {file0, "cache.path", r.cache_path});
    }
    if (file_hash(r.cache_path) != first.at("cache").at("hash").get<std::string>()) {
      throw InvalidInput("cache changed since the shards read it", {r.cache_path, "hash", file_hash(r.cache_path)});
    }
  });
  const CacheReader cache(r.cache_path);
  const std::string shape = "(" + std::to_string(cache.meta().n_layers) + " layers of " +
                            std::to_string(cache.meta().n_kv_heads) + " KV heads)";
  if (r.heads.size() != cache.meta().n_layers) {
    throw InvalidInput("parts disagree with the cache's shape " + shape, {file0, "n_layers", std::to_string(r.heads.size())});
  }
  for (std::size_t l = 0; l < r.heads.size(); ++l) {
    if (r.heads[l].size() != cache.meta().n_kv_heads) {
      throw InvalidInput("parts disagree with the cache's shape " + shape,
                         {file0, "layers[" + std::to_string(l) + "]", std::to_string(r.heads[l].size()) + " heads"});
    }
  }
  r.memory = cache_memory(cache);
  return r;
}

}  // namespace akv
