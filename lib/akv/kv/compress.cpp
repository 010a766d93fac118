#include "akv/kv/compress.h"

#include <cmath>
#include <memory>

#include "akv/attention/decode_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/io/file_hash.h"
#include "akv/kv/prompt_plan.h"
#include "akv/kv/runtime.h"
#include "akv/kv/tiered.h"

namespace akv {
double MemoryReport::bits_per_element() const {
  return elements ? 8.0 * static_cast<double>(total.total()) / static_cast<double>(elements) : 0.0;
}

double MemoryReport::ratio() const {
  return total.total() ? static_cast<double>(f16_bytes()) / static_cast<double>(total.total()) : 0.0;
}

namespace {

// A cache's bytes per component and their total.
nlohmann::json bytes_json(const CacheBytes& b) {
  nlohmann::json j = {{"total", b.total()}};
  CacheBytes::components([&](const char* name, auto m) { j[name] = b.*m; });
  return j;
}

// The header (source identity, shape, parameters) and zero byte counts of a cache of `dump`.
MemoryReport empty_report(const std::string& dump_path, const DumpReader& dump, const CompressParams& params,
                          const std::string& source_hash) {
  const DumpMeta& m = dump.meta();
  MemoryReport report;
  report.header.meta = m;
  report.header.params = params;
  report.header.source_path = dump_path;
  report.header.source_hash = source_hash.empty() ? file_hash(dump_path) : source_hash;
  report.header.source_bytes = dump.file_bytes();
  report.elements = 2ull * m.n_layers * m.n_kv_heads * m.n_tokens * m.head_dim;
  report.layers.resize(m.n_layers);
  return report;
}

// Writes the KV heads of layer l and adds their bytes to the report.
void write_layer(CacheWriter& writer, MemoryReport& report, std::size_t l, const std::vector<HeadCache>& heads) {
  for (std::size_t h = 0; h < heads.size(); ++h) {
    writer.write_head(l, h, heads[h]);
    report.layers[l] += heads[h].bytes();
  }
  report.total += report.layers[l];
}

// The tiered cache over a dump: each KV head streams its tokens through a TieredStream; at the
// positions that have queries (the dump's window) the group's query heads attend over the
// cache and their attention drives the importance scores. Before the window, scores only move
// with w_recency (each step then costs O(tokens)).
MemoryReport compress_tiered(const std::string& dump_path, const std::string& out_path,
                             const CompressParams& params, int threads, const ProgressFn& progress,
                             const Shard& shard, const std::string& source_hash) {
  DumpReader dump(dump_path);
  const DumpMeta& m = dump.meta();
  require_windows_hold_tokens(m, dump_path, "compression");
  const TieredParams& t = *params.tiered();
  validate_tiered(t, m.head_dim);
  MemoryReport report = empty_report(dump_path, dump, params, source_hash);
  const auto [lo, hi] = shard.range(m.n_layers);
  CacheWriter writer(out_path, report.header, CachePart{shard.k, shard.n, lo, hi});
  const std::size_t d = m.head_dim, g = m.group_size(), first_q = m.first_query_pos();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor3 key, value, query;  // each layer in the previous one's storage
  for (std::size_t l = lo; l < hi; ++l) {
    dump.read_into(key, l, DumpField::key);
    dump.read_into(value, l, DumpField::value);
    if (m.n_query > 0) dump.read_into(query, l, DumpField::query);
    std::vector<HeadCache> heads(m.n_kv_heads);
    parallel_for(m.n_kv_heads, threads, [&](std::size_t h) {
      TieredStream s(t, d);
      std::vector<float> q(g * d), out(g * d);
      std::vector<std::vector<float>> probs(g);
      std::vector<float*> ptr(g);
      for (std::size_t pos = 0; pos < m.n_tokens; ++pos) {
        s.append(key.row(h, pos), value.row(h, pos));
        if (pos >= first_q && t.w_attn != 0.0) {
          const KvView v = s.view();
          for (std::size_t j = 0; j < g; ++j) {
            std::copy_n(query.row(h * g + j, pos - first_q), d, q.data() + j * d);
            probs[j].resize(v.n);
            ptr[j] = probs[j].data();
          }
          decode_attention({q.data(), g, d, v.segments.data(), 1, scale, out.data(), ptr.data(), kKvSegments});
          for (std::size_t j = 0; j < g; ++j) s.observe(probs[j].data(), 1.0 / static_cast<double>(g));
        }
        if (pos >= first_q || t.w_recency != 0.0) s.end_step();
      }
      heads[h] = s.to_head_cache();
    });
    write_layer(writer, report, l, heads);
    if (progress) progress(l + 1 - lo, hi - lo);
  }
  writer.commit();
  return report;
}

}  // namespace

nlohmann::json MemoryReport::to_json() const {
  nlohmann::json j;
  j["params"] = header.params.to_json();
  j["source"] = {{"path", header.source_path}, {"hash", header.source_hash},
                 {"bytes", header.source_bytes}};
  j["bytes"] = bytes_json(total);
  j["f16_bytes"] = f16_bytes();
  j["elements"] = elements;
  j["bits_per_element"] = bits_per_element();
  j["compression_ratio"] = ratio();
  j["eviction"] = eviction;
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < this->layers.size(); ++l) {
    nlohmann::json row = bytes_json(this->layers[l]);
    row["layer"] = l;
    layers.push_back(row);
  }
  j["layers"] = layers;
  return j;
}

MemoryReport compress_dump(const std::string& dump_path, const std::string& out_path,
                           const CompressParams& params, int threads, const ProgressFn& progress,
                           const Shard& shard, const std::string& source_hash) {
  if (params.tiered()) return compress_tiered(dump_path, out_path, params, threads, progress, shard, source_hash);
  if (params.eviction() && params.eviction()->every > 0) {
    throw UsageError("decode-time compression (every=, target=) runs in the model's decode loop: akv evaluate --model",
                     {"", "--every", std::to_string(params.eviction()->every)});
  }
  if (params.eviction() && params.eviction()->decoding) {
    throw UsageError("decoding=on evicts while the model decodes: akv evaluate --model", {"", "--decoding", "on"});
  }
  DumpReader dump(dump_path);
  const DumpMeta& m = dump.meta();
  require_windows_hold_tokens(m, dump_path, "compression");
  if (const GgmlCacheParams* g = params.ggml()) {
    if (g->types.empty()) {  // per-head types: checked head by head by the cache
      check_ggml_head_dim(ggml_cache_type(g->key, m.head_dim, dump_path, "head_dim (ggml k=" + g->key + ")"), m.head_dim, dump_path, "head_dim (ggml k=" + g->key + ")");
      check_ggml_head_dim(ggml_cache_type(g->value, m.head_dim, dump_path, "head_dim (ggml v=" + g->value + ")"), m.head_dim, dump_path, "head_dim (ggml v=" + g->value + ")");
    }
  } else {
    validate_params(params, "");
    if (params.pre_rope && !m.rope_variant.empty()) {
      throw InvalidInput("--pre-rope re-applies plain RoPE after dequantization; this model's RoPE differs",
                         {dump_path, "rope_variant", m.rope_variant});
    }
    if (params.pre_rope && !dump.has_key_pre_rope()) {
      throw InvalidInput("keys quantized before RoPE (--pre-rope, nuq) need key_pre_rope in every layer of the dump",
                         {dump_path, "/layers/*/key_pre_rope", "missing"});
    }
    if (params.quantized() && outlier_count(params.outlier_fraction, m.head_dim) >= m.head_dim) {
      throw InvalidInput("outlier fraction leaves no key channel to quantize",
                         {"", "--outlier-fraction", format_number(params.outlier_fraction)});
    }
  }
  MemoryReport report = empty_report(dump_path, dump, params, source_hash);
  // Eviction first (a scoring pass over keys and queries), then one pass over K/V through the
  // method's own cache.
  const std::size_t phases = params.eviction() ? 2 : 1;
  // CriticalKV reads W_o (a budgets file may bring it too): whenever the dump has it.
  const bool out_proj = (params.eviction() && params.eviction()->critical) || dump.has_out_proj();
  const std::optional<TokenScores> given = params.eviction() ? dump_given_scores(dump, *params.eviction()) : std::nullopt;
  const PromptPlan plan = plan_prompt(
      m,
      dump_layer_source(dump),
      params, threads,
      [&](std::size_t done, std::size_t total) {
        if (progress) progress(done, phases * total);
      },
      given ? &*given : nullptr, out_proj ? dump_out_proj(dump) : OutProjSource{});
  report.header.params = plan.params;
  if (plan.eviction) report.eviction = plan.eviction->summary_json();
  const std::unique_ptr<KvPolicy> cache = make_stored_cache(plan.params, m.kv_shape(), threads);
  const auto [lo, hi] = shard.range(m.n_layers);
  CacheWriter writer(out_path, report.header, CachePart{shard.k, shard.n, lo, hi});
  Tensor3 key, value, pre;  // one layer at a time, each read into the previous layer's storage
  const bool read_pre = params.pre_rope && !params.ggml();
  for (std::size_t l = lo; l < hi; ++l) {
    dump.read_into(key, l, DumpField::key);
    dump.read_into(value, l, DumpField::value);
    if (read_pre) dump.read_into(pre, l, DumpField::key_pre_rope);
    cache->ingest_layer(l, {&key, read_pre ? &pre : nullptr, &value}, plan);
    std::vector<HeadCache> heads(m.n_kv_heads);
    for (std::size_t h = 0; h < m.n_kv_heads; ++h) heads[h] = cache->take_head(l, h);
    write_layer(writer, report, l, heads);
    if (progress) progress((phases - 1) * m.n_layers + l + 1 - lo, phases * m.n_layers - lo - (m.n_layers - hi));
  }
  writer.commit();
  return report;
}

MemoryReport merge_cache_parts(const std::vector<std::string>& paths, const std::string& out_path) {
  if (paths.empty()) throw UsageError("merge needs partial caches", {"", "PARTS"});
  std::vector<std::unique_ptr<CacheReader>> parts;
  for (const std::string& p : paths) parts.push_back(std::make_unique<CacheReader>(p, true));
  const CacheReader& first = *parts[0];
  const std::string params0 = first.header().params.to_json().dump();
  ShardSet set;
  for (const auto& r : parts) {
    const CachePart& cp = r->part();
    if (!cp.partial()) throw InvalidInput("not a partial cache", {r->path(), "format", kCacheFormat});
    if (r->header().params.to_json().dump() != params0) {
      throw InvalidInput("part of another run: params differ from " + first.path() + "'s", {r->path(), "params"});
    }
    if (r->header().source_hash != first.header().source_hash || r->header().source_path != first.header().source_path) {
      throw InvalidInput("part of another run: source differs from " + first.path() + "'s", {r->path(), "source_hash", r->header().source_hash});
    }
    set.add(r->path(), cp.shard, cp.shards);
  }
  std::vector<const CacheReader*> by_shard;
  std::size_t next = 0;
  for (const std::size_t i : set.order()) {
    const CacheReader* r = parts[i].get();
    check_follows(r->path(), "first_layer", "layers", r->part().first_layer, next);
    next = r->part().end_layer;
    by_shard.push_back(r);
  }
  if (next != first.meta().n_layers) throw InvalidInput("parts end before the last layer", {"", "end_layer", std::to_string(next)});
  CacheWriter writer(out_path, first.header());
  for (const CacheReader* r : by_shard) {
    for (std::size_t l = r->part().first_layer; l < r->part().end_layer; ++l) {
      for (std::size_t h = 0; h < first.meta().n_kv_heads; ++h) writer.write_head(l, h, r->read_head(l, h));
    }
  }
  writer.commit();
  return cache_memory(CacheReader(out_path));
}

MemoryReport cache_memory(const CacheReader& cache) {
  const DumpMeta& m = cache.meta();
  MemoryReport report;
  report.header = cache.header();
  report.elements = 2ull * m.n_layers * m.n_kv_heads * m.n_tokens * m.head_dim;
  report.layers.resize(m.n_layers);
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    for (std::size_t h = 0; h < m.n_kv_heads; ++h) report.layers[l] += cache.stored_bytes(l, h);
    report.total += report.layers[l];
  }
  return report;
}

void check_cache_matches_dump(const CacheReader& cache, const DumpReader& dump, const std::string& dump_hash) {
  const DumpMeta& a = cache.meta();
  const DumpMeta& b = dump.meta();
  if (a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.n_heads != b.n_heads ||
      a.head_dim != b.head_dim || a.n_tokens != b.n_tokens) {
    throw InvalidInput("cache was made from a dump of another shape",
                       {cache.path(), "source_path", cache.header().source_path + " (given " +
                                                         dump.path() + ")"});
  }
  const std::string hash = dump_hash.empty() ? file_hash(dump.path()) : dump_hash;
  if (hash != cache.header().source_hash) {
    throw InvalidInput("cache was made from another dump (content hash " +
                           cache.header().source_hash + ", " + dump.path() + " has " + hash + ")",
                       {cache.path(), "source_hash", cache.header().source_hash});
  }
}

void decompress_cache(const std::string& cache_path, const std::string& out_path,
                      const std::string& source_path, DType dtype, int threads,
                      const ProgressFn& progress) {
  CacheReader cache(cache_path);
  const std::string src = source_path.empty() ? cache.header().source_path : source_path;
  DumpReader dump(src);
  check_cache_matches_dump(cache, dump);
  const DumpMeta& m = dump.meta();
  DumpWriteOptions wo;
  wo.dtype = dtype;
  wo.head_kinds = !dump.layer(0).head_kinds.empty();
  DumpWriter writer(out_path, m, wo);
  const CacheRope cr = cache_rope(cache, m);
  const RopeContext& rope = cr.context;
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    Tensor3 key(m.n_kv_heads, m.n_tokens, m.head_dim), value = key;
    std::vector<HeadCache> heads(m.n_kv_heads);  // HDF5 reads stay on this thread
    for (std::size_t h = 0; h < m.n_kv_heads; ++h) heads[h] = cache.read_head(l, h);
    parallel_for(m.n_kv_heads, threads, [&](std::size_t h) {
      const HeadCache& hc = heads[h];
      const std::size_t n = hc.n_kept(), d = m.head_dim;
      std::vector<float> k(n * d), v(n * d);
      reconstruct_head(hc, rope, k.data(), v.data());
      for (std::size_t i = 0; i < n; ++i) {
        std::copy_n(k.data() + i * d, d, key.row(h, hc.position(i)));
        std::copy_n(v.data() + i * d, d, value.row(h, hc.position(i)));
      }
    });
    writer.write(l, DumpField::key, 0, key);
    writer.write(l, DumpField::value, 0, value);
    writer.write(l, DumpField::query, 0, dump.read(l, DumpField::query));
    if (wo.head_kinds) writer.write_head_kinds(l, dump.layer(l).head_kinds);
    if (progress) progress(l + 1, m.n_layers);
  }
  if (dump.tokens()) writer.write_tokens(*dump.tokens());
  if (dump.needles()) writer.write_needles(*dump.needles());
  writer.write_root_attr("decompressed_from", cache_path);
  writer.commit();
}

}  // namespace akv
