#include "akv/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <tuple>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/kv/stored_head.h"
#include "akv/quant/pack.h"
#include "akv/model/gguf.h"
#include "akv/model/hf_config.h"
#include "akv/model/llama2c.h"
#include "akv/model/load.h"

namespace akv {
namespace {

namespace fs = std::filesystem;

// One quantized tensor of one head after n tokens (as kv/stored_tensor.h stores it).
double tensor_bytes(const TensorQuant& t, const QuantParams& p, std::size_t d, std::size_t n_out, std::size_t n) {
  const std::size_t q = quantized_rows(n, t, p);
  const std::size_t cols = d - n_out;
  const std::size_t groups = t.axis == QuantAxis::channel ? ceil_div(q, t.group) * cols : q * ceil_div(cols, t.group);
  double b = static_cast<double>(ceil_div(q * cols * static_cast<std::size_t>(t.bits), 8)) + 4.0 * static_cast<double>(groups);
  if (q > 0 && n_out > 0) b += 2.0 * static_cast<double>(q * n_out + n_out);
  return b + 2.0 * static_cast<double>((n - q) * d);
}

// A nuq tensor of one head after n tokens (kv/stored_tensor.h; bytes in NuqRows): the first
// `sink` rows in f16, the others a code per value, a u16 outlier count and, for values, an f32
// offset and range; outliers (f16 value + u16 channel) as KVQuant's sparsity threshold s makes
// them: keys (1 - s) d per row (the calibration's percentiles; the data decides), values the
// 2 (d - 1 - floor(t (d - 1))) beyond a row's own quantiles (t = 1 - (1 - s) / 2); the table
// (2^bits f32 levels; keys 2 f16 thresholds per channel). s and sink: the calibration's when
// read, else KVQuant's 0.99 and 1.
double nuq_tensor_bytes(const QuantParams& p, const NuqCodebooks* books, bool key, std::size_t d, std::size_t n) {
  const int bits = key ? p.key.bits : p.value.bits;
  const double s = books ? books->sparsity : 0.99;
  const std::size_t sink = std::min(n, books ? books->sink : std::size_t{1}), coded = n - sink;
  const double t = 1.0 - (1.0 - s) / 2.0, dd = static_cast<double>(d);
  const double outliers = key ? (1.0 - s) * dd : 2.0 * (dd - 1.0 - std::floor(t * (dd - 1.0)));
  const double per_row = static_cast<double>(packed_size(d, bits)) + 2.0 + (key ? 0.0 : 8.0) + 4.0 * outliers;
  const double table = n > 0 ? 4.0 * static_cast<double>(std::size_t{1} << bits) + (key ? 4.0 * dd : 0.0) : 0.0;
  return table + 2.0 * dd * static_cast<double>(sink) + per_row * static_cast<double>(coded);
}

// Keys and values of one head holding n tokens, quantized (or f16) per p, without eviction.
double head_bytes(const CompressParams& p, std::size_t d, std::size_t n) {
  if (!p.quantized()) return 4.0 * static_cast<double>(d * n);
  if (p.method == Quantizer::nuq) {
    return nuq_tensor_bytes(p, p.codebooks.get(), true, d, n) + nuq_tensor_bytes(p, p.codebooks.get(), false, d, n);
  }
  const std::size_t n_out = outlier_count(p.outlier_fraction, d);
  return tensor_bytes(p.key, p, d, n_out, n) + tensor_bytes(p.value, p, d, 0, n);
}

PlanBytes tiered_bytes(const TieredParams& t, std::size_t d, std::size_t n) {
  const double hot = static_cast<double>(std::min(n, t.hot));
  const double rest = static_cast<double>(n) - hot;
  const double warm = t.warm ? std::min(rest, static_cast<double>(*t.warm)) : rest;
  const double cold = rest - warm;
  auto per_token = [&](int bk, int bv) {
    return static_cast<double>(d * static_cast<std::size_t>(bk + bv)) / 8.0 + 4.0 * static_cast<double>(d) / static_cast<double>(t.block) +
           4.0 * static_cast<double>(ceil_div(d, 32));
  };
  const double f16 = 4.0 * static_cast<double>(d);
  PlanBytes b;
  b.device = hot * f16 + warm * per_token(t.warm_bits_key, t.warm_bits_value);
  b.host = t.cold_bits == 16 ? (cold + warm) * f16 : cold * per_token(t.cold_bits, t.cold_bits);
  return b;
}

}  // namespace

PlanShape read_plan_config(const std::string& path, int weight_dtype_bytes) {
  if (is_gguf(path) || is_llama2c_path(path)) {
    if (weight_dtype_bytes > 0) {
      throw UsageError("a model file's weights are counted as it stores them: --weight-bytes-per-param is for a config.json",
                       {path, "--weight-bytes-per-param", std::to_string(weight_dtype_bytes)});
    }
    PlanShape s;
    if (is_gguf(path)) {
      const Model m = load_model(path);
      static_cast<KvShape&>(s) = m.config();
      s.name = m.config().name;
      s.weight_bytes = m.weights().bytes();
      return s;
    }
    const Llama2cShape l = read_llama2c_shape(path);  // the header alone
    static_cast<KvShape&>(s) = l.config;
    s.name = l.config.name;
    s.weight_bytes = l.weight_bytes;
    return s;
  }
  const HfConfig c = read_hf_config(path);
  PlanShape s;
  s.name = c.name.empty() ? fs::path(c.file).parent_path().filename().string() : c.name;
  s.n_layers = c.num_hidden_layers;
  s.n_heads = c.num_attention_heads;
  s.n_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.layer_window = hf_layer_windows(c);
  const std::size_t dim = c.hidden_size, ffn = c.intermediate_size, vocab = c.vocab_size;
  const std::size_t q = s.n_heads * s.head_dim, kv = s.n_kv_heads * s.head_dim;
  const double per_layer = static_cast<double>(dim * q + 2 * dim * kv + q * dim + 3 * dim * ffn + 2 * dim);
  const double params = static_cast<double>(s.n_layers) * per_layer +
                        static_cast<double>(vocab * dim) * (c.tie_word_embeddings ? 1 : 2) + static_cast<double>(dim);
  int bytes = weight_dtype_bytes;
  if (bytes <= 0) bytes = c.torch_dtype == "float32" ? 4 : 2;
  s.weight_bytes = static_cast<std::uint64_t>(params) * static_cast<std::uint64_t>(bytes);
  return s;
}

std::uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (end == text.c_str() || mult == 0 || !(v > 0) || !std::isfinite(v * mult) || v * mult > 1.8e19) {
    throw InvalidInput("not a byte size (e.g. 16GiB, 80GB, 512MiB, 1e9)", {"", flag, text});
  }
  return static_cast<std::uint64_t>(v * mult);
}

namespace {

// Device and host bytes of one KV head holding n tokens under p.
PlanBytes one_head(const CompressParams& p, std::size_t head_dim, std::size_t n) {
  if (p.tiered()) return tiered_bytes(*p.tiered(), head_dim, n);
  if (p.ggml()) {  // ggml blocks per key and value row (head_dim a multiple of the block)
    const GgmlTypeInfo& k = ggml_cache_type(parse_head_type(p.ggml()->key, "", "k").name, head_dim, "", "k");
    const GgmlTypeInfo& v = ggml_cache_type(parse_head_type(p.ggml()->value, "", "v").name, head_dim, "", "v");
    check_ggml_head_dim(k, head_dim, "", "ggml k=" + p.ggml()->key + ": head_dim");
    check_ggml_head_dim(v, head_dim, "", "ggml v=" + p.ggml()->value + ": head_dim");
    return {static_cast<double>(n * (head_dim / k.block * k.bytes + head_dim / v.block * v.bytes)), 0.0};
  }
  std::size_t kept = n;
  double index = 0;
  if (p.eviction()) {
    const EvictionParams& e = *p.eviction();
    kept = e.budget_tokens ? std::min(n, *e.budget_tokens)
                           : static_cast<std::size_t>(std::ceil(e.budget_fraction.value_or(1.0) * static_cast<double>(n)));
    kept = std::min(kept, n);
    index = 4.0 * static_cast<double>(kept);  // token positions
  }
  return {head_bytes(p, head_dim, kept) + index, 0.0};
}

}  // namespace

PlanBytes plan_bytes(const PlanShape& s, const PlanMethod& m, std::size_t n) {
  // Every layer local (Mistral): within the window the method holds every layer; past it the
  // window's rows (only none and f32 run there).
  if (s.windowed_run(n)) {
    PlanShape globals = s;
    globals.kv_shape() = s.global_shape();
    const GgmlCacheParams* g = m.params ? m.params->ggml() : nullptr;
    const std::size_t heads = globals.n_layers * s.n_kv_heads;
    if (m.params && ((!m.params->head_bits.empty() && m.params->head_bits.size() != heads) ||
                     (g && !g->head_types.empty() && g->head_types.size() != heads))) {
      throw std::logic_error("plan_bytes: per-head bits or types must be read for the global layers (KvShape::global_shape)");
    }
    PlanBytes b = globals.n_layers ? plan_bytes(globals, m, n) : PlanBytes{};
    const std::size_t local_rows = s.cached_rows(n) - globals.n_layers * n;
    b.device += static_cast<double>(local_rows * s.n_kv_heads * s.head_dim * 2 * (m.params ? 2 : 4));
    return b;
  }
  // Heads differ only by their per-head bits: each distinct choice is costed once (a model of
  // thousands of layers x heads would otherwise cost every head at every step of the search),
  // and the sum still runs head by head in order.
  // (A ggml cache's boundary layers store f16, and per-head types differ: their heads are costed
  // apart.)
  std::map<std::tuple<int, int, bool, std::string, std::string>, PlanBytes> cost;
  auto head = [&](std::size_t l, std::size_t h) -> PlanBytes {
    if (!m.params) return {8.0 * static_cast<double>(s.head_dim * n), 0.0};
    const auto& bits = m.params->head_bits;
    const std::pair<int, int> b = bits.empty() ? std::pair<int, int>{0, 0} : bits.at(l * s.n_kv_heads + h);
    const GgmlCacheParams* g = m.params->ggml();
    const bool boundary = g && g->boundary_layer(l, s.n_layers);
    const bool typed = g && !g->head_types.empty();
    const auto key = std::make_tuple(b.first, b.second, boundary, typed ? g->head_types.at(l * s.n_kv_heads + h).first : "",
                                     typed ? g->head_types.at(l * s.n_kv_heads + h).second : "");
    const auto it = cost.find(key);
    if (it != cost.end()) return it->second;
    CompressParams p = m.params->for_head(l, h, s.n_kv_heads);
    if (boundary) {
      GgmlCacheParams f16 = *g;
      f16.key = f16.value = GgmlCacheParams::f16_name();
      f16.boundary = 0;
      f16.types.clear();
      f16.head_types.clear();
      p.mode = f16;
    }
    return cost[key] = one_head(p, s.head_dim, n);
  };
  PlanBytes total;
  for (std::size_t l = 0; l < s.n_layers; ++l) {
    for (std::size_t h = 0; h < s.n_kv_heads; ++h) {
      const PlanBytes b = head(l, h);
      total.device += b.device;
      total.host += b.host;
    }
  }
  return total;
}

PlanReport plan(const PlanShape& s, const std::vector<PlanMethod>& methods, std::uint64_t memory,
                std::uint64_t context, std::optional<std::uint64_t> host_memory) {
  if (s.weight_bytes >= memory) {
    throw InvalidInput("the weights alone (" + format_number(static_cast<double>(s.weight_bytes) / 1e9) +
                           " GB) do not fit in the memory budget",
                       {"", "--memory", std::to_string(memory)});
  }
  if (context == 0) throw InvalidInput("context must be >= 1", {"", "--context", "0"});
  PlanReport r;
  r.shape = s;
  r.memory = memory;
  r.context = context;
  r.host_memory = host_memory;
  const double free = static_cast<double>(memory - s.weight_bytes);
  for (const PlanMethod& m : methods) {
    PlanRow row;
    row.spec = m.spec;
    row.description = m.params ? describe(*m.params) : "f32 K/V";
    auto fits = [&](std::uint64_t n, std::uint64_t batch) {
      const PlanBytes b = plan_bytes(s, m, n);
      return static_cast<double>(batch) * b.device <= free &&
             (!host_memory || static_cast<double>(batch) * b.host <= static_cast<double>(*host_memory));
    };
    const PlanBytes at = plan_bytes(s, m, context);
    row.device_per_token = at.device / static_cast<double>(context);
    row.host_per_token = at.host / static_cast<double>(context);
    constexpr std::uint64_t kLimit = std::uint64_t{1} << 40;
    if (fits(kLimit, 1)) {
      row.max_context = std::nullopt;
    } else {
      std::uint64_t lo = 0, hi = kLimit;  // fits(lo), !fits(hi)
      while (hi - lo > 1) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        (fits(mid, 1) ? lo : hi) = mid;
      }
      row.max_context = lo;
    }
    std::uint64_t batch = at.device > 0 ? static_cast<std::uint64_t>(free / at.device) : 0;
    if (host_memory && at.host > 0) batch = std::min(batch, static_cast<std::uint64_t>(static_cast<double>(*host_memory) / at.host));
    row.max_batch = batch;
    r.rows.push_back(row);
  }
  return r;
}

nlohmann::json PlanReport::to_json() const {
  nlohmann::json j = {{"format", "akv-plan"},
                      {"version", 1},
                      {"model", shape.name},
                      {"layers", shape.n_layers},
                      {"heads", shape.n_heads},
                      {"kv_heads", shape.n_kv_heads},
                      {"head_dim", shape.head_dim},
                      {"weight_bytes", shape.weight_bytes},
                      {"memory_bytes", memory},
                      {"context", context}};
  j["host_memory_bytes"] = host_memory ? nlohmann::json(*host_memory) : nlohmann::json();
  if (!shape.layer_window.empty()) j["layer_window"] = shape.layer_window;  // Gemma 2/3: 0 = global
  nlohmann::json rows_j = nlohmann::json::array();
  for (const PlanRow& r : rows) {
    rows_j.push_back({{"method", r.spec},
                      {"description", r.description},
                      {"device_bytes_per_token", r.device_per_token},
                      {"host_bytes_per_token", r.host_per_token},
                      {"max_context", r.max_context ? nlohmann::json(*r.max_context) : nlohmann::json()},
                      {"max_batch_at_context", r.max_batch}});
  }
  j["methods"] = rows_j;
  return j;
}

std::string PlanReport::to_table() const {
  std::string out = fmt::format(
      "{}: {} layers, {} q / {} KV heads, head_dim {}; weights {:.2f} GB; memory {:.2f} GB ({:.2f} GB for "
      "the KV cache){}\n",
      shape.name.empty() ? "model" : shape.name, shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim,
      static_cast<double>(shape.weight_bytes) / 1e9, static_cast<double>(memory) / 1e9,
      static_cast<double>(memory - shape.weight_bytes) / 1e9,
      host_memory ? fmt::format("; host {:.2f} GB", static_cast<double>(*host_memory) / 1e9) : std::string());
  if (shape.all_local()) {
    out += fmt::format("every layer attends within a sliding window of {} tokens: costed without windows up to it, as the "
                       "windows' f16 rows past it (where only none and f32 run)\n",
                       shape.smallest_window());
  } else if (shape.windowed()) {
    out += fmt::format("{} of the {} layers attend within a sliding window of {} tokens: their f16 rows are counted, the "
                       "methods cost the other {}\n",
                       shape.n_layers - shape.global_layers(), shape.n_layers,
                       *std::max_element(shape.layer_window.begin(), shape.layer_window.end()), shape.global_layers());
  }
  out += fmt::format("{:<36} {:>12} {:>12} {:>14} {:>12}  {}\n", "method", "device B/tok", "host B/tok",
                     "max context", fmt::format("batch@{}", context), "description");
  for (const PlanRow& r : rows) {
    out += fmt::format("{:<36} {:>12.0f} {:>12.0f} {:>14} {:>12}  {}\n", r.spec, r.device_per_token,
                       r.host_per_token, r.max_context ? std::to_string(*r.max_context) : "unbounded",
                       r.max_batch, r.description);
  }
  return out;
}

}  // namespace akv
