#include "akv/bench/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "akv/attention/decode_attention.h"
#include "akv/attention/kernels.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"
#include "akv/io/json_file.h"
#include "akv/kv/ggml_cache.h"
#include "akv/kv/stored_head.h"
#include "akv/kv/tensor_builder.h"
#include "akv/method/ggml_params.h"
#include "akv/method/params.h"
#include "akv/method/registry.h"
#include "akv/quant/nuq.h"
#include "akv/quant/outliers.h"
#include "akv/quant/pack.h"
#include "akv/tensor/ggml_quant.h"

namespace akv {
namespace {

struct Variant {
  std::string name;
  Isa isa = Isa::generic;
  bool dense = true;
  DenseType type = DenseType::f16;
  int bits_key = 16, bits_value = 16;
  AttentionMode mode = AttentionMode::exact;
  // A ggml cache (ggml-<type> or a spec): K and V rows as blocks of these cache types (names:
  // TurboQuant's layouts depend on head_dim), with ggml / ggml_value their layouts at head_dim 128.
  std::string ggml_key_name, ggml_value_name;
  const GgmlTypeInfo* ggml = nullptr;
  const GgmlTypeInfo* ggml_value = nullptr;
  std::optional<QuantParams> quant;    // a method spec's quantizer (otherwise KIVI at the bench's group and residual)
  bool nuq = false;  // nuq<b>: KVQuant's codes (quant/nuq.h) under codebooks fitted on the bench's own rows
  RotationKind rotate = RotationKind::none;  // a ggml spec's rotation (a quantizer's is in `quant`)
  std::uint64_t rotate_seed = 0;
  // Codes the integer loops read (2 or 4 bits) on keys or values.
  bool int8_reads() const {
    return !dense && !ggml && !nuq && (bits_key == 2 || bits_key == 4 || bits_value == 2 || bits_value == 4);
  }
  std::string label() const { return name + "@" + isa_name(isa) + (mode == AttentionMode::int8 ? "/int8" : ""); }
};

// A method spec (method/registry.h) as a variant: the full cache (f32 rows), a quantizer or preset
// with every flag of its spec (group, residual, axes, rule, outlier channels), or llama.cpp's
// cache types. Eviction and tiered caches are not one layout: `akv bench policy` times them.
Variant spec_variant(const std::string& s) {
  Variant v;
  v.name = s;
  const std::optional<CompressParams> p = resolve_method_spec(s);
  if (!p) {
    v.type = DenseType::f32;
    v.bits_key = v.bits_value = 32;
  } else if (const GgmlCacheParams* g = p->ggml()) {
    if (!g->types.empty()) throw UsageError("per-head types (types=) need a model's heads: not a bench variant", {"", "--variants", s});
    v.ggml_key_name = g->key;
    v.ggml_value_name = g->value;
    v.ggml = &ggml_cache_type(g->key, 128, "", "--variants");
    v.ggml_value = &ggml_cache_type(g->value, 128, "", "--variants");
    v.dense = false;
    v.bits_key = static_cast<int>(8 * v.ggml->bytes / v.ggml->block);  // whole bits (4.5 -> 4)
    v.bits_value = static_cast<int>(8 * v.ggml_value->bytes / v.ggml_value->block);
    v.rotate = p->rotate;
    v.rotate_seed = p->rotate_seed;
  } else if (p->eviction() || p->tiered() || p->pre_rope) {
    throw InvalidInput("bench attention times one stored layout per variant: eviction, tiered and pre-RoPE "
                       "caches are timed by `akv bench policy`", {"", "--variants", s});
  } else if (p->quantized()) {
    v.dense = false;
    v.quant = *p;
    v.bits_key = p->key.bits;
    v.bits_value = p->value.bits;
  }
  return v;
}

Variant parse_variant(const std::string& s) {
  if (s == kFullMethod || find_method(s.substr(0, s.find(':')))) return spec_variant(s);
  Variant v;
  v.name = s;
  auto bits = [&](const std::string& b) {
    int x = 0;
    try {
      x = std::stoi(b);
    } catch (const std::exception&) {
      x = -1;
    }
    if (!is_supported_bits(x)) {
      throw InvalidInput("unknown variant (f32, f16, q<b>, k<b>v<b>, nuq<b>; b in 2, 3, 4, 8; ggml-<type>: q8_0, q4_0, q4_1, "
                         "q5_0, q5_1, iq4_nl; or a method spec: " + std::string(kFullMethod) + ", " +
                         method_list({MethodKind::quantizer, MethodKind::preset, MethodKind::ggml}) + ")",
                         {"", "--variants", s});
    }
    return x;
  };
  if (s.rfind("ggml-", 0) == 0 && s != "ggml-f16") {
    v.ggml_key_name = v.ggml_value_name = s.substr(5);
    v.ggml = v.ggml_value = &ggml_cache_type(s.substr(5), 128, "", "--variants");
    v.dense = false;
    v.bits_key = v.bits_value = static_cast<int>(8 * v.ggml->bytes / v.ggml->block);  // whole bits (4.5 -> 4)
  } else if (s.size() == 4 && s.rfind("nuq", 0) == 0) {
    v.dense = false;
    v.nuq = true;
    v.bits_key = v.bits_value = bits(s.substr(3));
  } else if (s == "f32") {
    v.type = DenseType::f32;
    v.bits_key = v.bits_value = 32;
  } else if (s == "f16") {
  } else if (s.size() >= 2 && s[0] == 'q') {
    v.dense = false;
    v.bits_key = v.bits_value = bits(s.substr(1));
  } else if (s.size() >= 4 && s[0] == 'k' && s.find('v') != std::string::npos) {
    v.dense = false;
    v.bits_key = bits(s.substr(1, s.find('v') - 1));
    v.bits_value = bits(s.substr(s.find('v') + 1));
  } else {
    bits("");
  }
  return v;
}

// Synthetic keys and values [kv_heads][n][d]: normal rows, keys with a few large-offset
// channels (the outlier structure of real keys).
struct Source {
  std::size_t kv = 0, n = 0, d = 0;
  std::vector<float> key, value;
  const float* k(std::size_t h) const { return key.data() + h * n * d; }
  const float* v(std::size_t h) const { return value.data() + h * n * d; }
};

Source make_source(std::size_t kv, std::size_t n, std::size_t d, std::uint64_t seed, int threads) {
  Source s{kv, n, d, std::vector<float>(kv * n * d), std::vector<float>(kv * n * d)};
  parallel_for(2 * kv, threads, [&](std::size_t i) {
    const std::size_t h = i / 2;
    const bool is_key = i % 2 == 0;
    Rng rng(stream_seed(seed, {d, h, is_key ? 0u : 1u}));
    float* p = (is_key ? s.key.data() : s.value.data()) + h * n * d;
    for (std::size_t j = 0; j < n * d; ++j) {
      const double x = rng.normal();
      p[j] = static_cast<float>(is_key && j % d < 4 ? 4.0 + 2.0 * x : x);
    }
  });
  return s;
}

struct Cache {
  std::vector<TensorBuilder> key, value;
  std::vector<HeadView> views;
  std::uint64_t bytes = 0;
};

// The first n rows of each head as variant v stores them (kv/tensor_builder.h: KIVI codes with
// an f16 residual window, dense rows, or ggml blocks).
std::unique_ptr<Cache> build(const Source& s, std::size_t n, const Variant& v,
                             const AttentionBenchOptions& o, int threads) {
  QuantParams p;
  p.residual = o.residual;
  p.key = {v.bits_key, QuantAxis::channel, o.group};
  p.value = {v.bits_value, QuantAxis::token, o.group};
  if (v.quant) p = *v.quant;
  const std::size_t n_out = outlier_count(p.outlier_fraction, s.d);
  auto c = std::make_unique<Cache>();
  for (std::size_t h = 0; h < s.kv; ++h) {
    if (v.ggml) {
      const GgmlTypeInfo& kt = ggml_cache_type(v.ggml_key_name, s.d, "", "--variants");
      const GgmlTypeInfo& vt = ggml_cache_type(v.ggml_value_name, s.d, "", "--variants");
      c->key.emplace_back(s.d, kt, ggml_rotation(v.rotate, v.rotate_seed, kt, s.d, true));
      c->value.emplace_back(s.d, vt, ggml_rotation(v.rotate, v.rotate_seed, vt, s.d, false));
    } else if (v.dense) {
      c->key.emplace_back(s.d, v.type);
      c->value.emplace_back(s.d, v.type);
    } else if (v.nuq) {
      // KVQuant's defaults: sparsity threshold 0.99, the first token in f16; keys per channel. A
      // context too short to fit them on (the sink, and two rows for a key channel's range) is a
      // usage error naming it.
      const auto fit = [&](const float* rows, bool key, int bits) {
        try {
          return std::make_shared<const NuqTable>(
              nuq_table(calibrate_nuq(rows, n, s.d, bits, key, 0.99, 1), 0.99, 1, 0, key ? s.d : 0));
        } catch (const InvalidInput& e) {
          throw UsageError(v.name + " fits its codebooks on the bench's rows of each context: " + e.message(),
                           {"", "--contexts", std::to_string(n)});
        }
      };
      c->key.emplace_back(s.d, fit(s.k(h), true, v.bits_key), false, nullptr);
      c->value.emplace_back(s.d, fit(s.v(h), false, v.bits_value), false, nullptr);
    } else {
      c->key.emplace_back(s.d, p.key, p, n_out, false, nullptr, p.rotation(s.d, true));
      c->value.emplace_back(s.d, p.value, p, 0, false, nullptr, p.rotation(s.d, false));
    }
  }
  std::vector<std::int32_t> pos(n);  // the rows' positions (nuq's sink row is position 0; no RoPE here)
  std::iota(pos.begin(), pos.end(), 0);
  parallel_for(s.kv, threads, [&](std::size_t h) {
    c->key[h].append(s.k(h), s.k(h), pos.data(), n);
    c->value[h].append(s.v(h), s.v(h), pos.data(), n);
  });
  for (std::size_t h = 0; h < s.kv; ++h) {
    c->views.push_back({c->key[h].view(), c->value[h].view()});
    c->bytes += c->key[h].bytes() + c->value[h].bytes();
  }
  return c;
}

std::vector<float> queries(std::size_t n_heads, std::size_t d, std::uint64_t seed) {
  Rng rng(stream_seed(seed, {n_heads, d, 7}));
  std::vector<float> q(n_heads * d);
  for (auto& x : q) x = static_cast<float>(rng.normal());
  return q;
}

// Least-squares slope of log(t) against log(n).
double fitted_exponent(const std::vector<std::pair<double, double>>& pts) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [n, t] : pts) {
    sx += std::log(n);
    sy += std::log(t);
    sxx += std::log(n) * std::log(n);
    sxy += std::log(n) * std::log(t);
  }
  const double m = static_cast<double>(pts.size());
  return (m * sxy - sx * sy) / (m * sxx - sx * sx);
}

Isa parse_isa(const std::string& s) {
  Isa isa = best_isa();
  if (s == "avx512") {
    isa = Isa::avx512;
  } else if (s == "avx2") {
    isa = Isa::avx2;
  } else if (s == "generic") {
    isa = Isa::generic;
  } else if (s != "best") {
    throw InvalidInput("unknown instruction set (best, avx512, avx2, generic)", {"", "--isa", s});
  }
  if (isa > best_isa()) {
    throw UsageError(fmt::format("not available on this CPU or build (best: {})", isa_name(best_isa())),
                     {"", "--isa", s});
  }
  return isa;
}

// Sets the kernels' instruction set for the scope (restores the previous one).
struct IsaScope {
  Isa saved = active_isa();
  explicit IsaScope(Isa isa) { set_isa(isa); }
  ~IsaScope() { set_isa(saved); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

void check_args(const AttentionBenchOptions& o) {
  auto positive = [](const std::vector<std::size_t>& v, const char* f) {
    if (v.empty() || *std::min_element(v.begin(), v.end()) == 0) throw InvalidInput("values must be >= 1", {"", f});
  };
  positive(o.contexts, "--contexts");
  positive(o.head_dims, "--head-dims");
  positive(o.gqa, "--gqa");
  if (o.kv_heads == 0 || o.group == 0 || o.repeat < 1 || o.warmup < 0) {
    throw InvalidInput("--kv-heads, --group, --repeat must be >= 1", {"", "--kv-heads/--group/--repeat"});
  }
  if (o.variants.empty()) throw UsageError("no variants", {"", "--variants"});
  if (o.isas.empty()) throw UsageError("no instruction sets", {"", "--isa"});
  if (o.attention.empty()) throw UsageError("no attention paths", {"", "--attention"});
  if (o.tile == 0 || o.partition % o.tile != 0 || o.partition == 0) {
    throw UsageError("--partition must be a positive multiple of --tile",
                     {"", "--tile/--partition", std::to_string(o.tile) + "/" + std::to_string(o.partition)});
  }
}

}  // namespace

std::vector<BenchColumn> attention_columns() {
  return {{"head_dim", "D"},          {"context", "context"},     {"gqa", "gqa"},
          {"variant", "cache"},       {"isa", "isa"},             {"attention", "attn"},       {"cache_mb", "cache MB", 1}, {"ms_mean", "ms/token", 3},
          {"ms_stdev", "stdev", 3},   {"ms_min", "min", 3},       {"gbs", "GB/s", 1},
          {"of_stream", "x stream", 2}, {"of_fma", "x fma", 2}, {"speedup_vs_f16", "x f16", 2},
          {"err_vs_f32", "err"},      {"err_vs_exact", "vs exact"}};
}

namespace {

// Every --variants entry once per --isa and --attention path (int8 only where its loops read the
// codes), each checked against every --head-dims.
std::vector<Variant> bench_variants(const AttentionBenchOptions& o) {
  std::vector<Variant> variants;
  std::vector<Isa> isas;
  for (const auto& s : o.isas) isas.push_back(parse_isa(s));
  std::vector<AttentionMode> modes;
  for (const auto& s : o.attention) modes.push_back(parse_attention_mode(s));
  for (const auto& s : o.variants) {
    Variant v = parse_variant(s);
    for (std::size_t d : o.head_dims) {
      if (v.ggml) {
        check_ggml_head_dim(ggml_cache_type(v.ggml_key_name, d, "", "--head-dims (" + s + ")"), d, "", "--head-dims (" + s + ")");
        check_ggml_head_dim(ggml_cache_type(v.ggml_value_name, d, "", "--head-dims (" + s + ")"), d, "", "--head-dims (" + s + ")");
      }
      if (v.quant && outlier_count(v.quant->outlier_fraction, d) >= d) {
        throw InvalidInput("outlier fraction leaves no key channel to quantize at head_dim " + std::to_string(d),
                           {"", "--variants", s});
      }
    }
    for (Isa isa : isas) {
      for (AttentionMode m : modes) {
        if (m == AttentionMode::int8 && !v.int8_reads()) continue;
        v.isa = isa;
        v.mode = m;
        variants.push_back(v);
      }
    }
  }
  return variants;
}

// Kernel check on a small case: fast path vs reference for every variant and shape (int8:
// within 5%, the integer path's rounding on random rows; nuq codes within kNuqAttentionTolerance: the level loops
// read each value in f32 where the reference rounds it to f16; see docs/attention.md).
void check_attention_kernels(const AttentionBenchOptions& o, const std::vector<Variant>& variants, int threads) {
  for (std::size_t d : o.head_dims) {
    const std::size_t n = std::min<std::size_t>(517, *std::max_element(o.contexts.begin(), o.contexts.end()));
    const Source s = make_source(2, n, d, o.seed + 1, threads);
    for (const Variant& v : variants) {
      const auto c = build(s, n, v, o, threads);
      for (std::size_t g : o.gqa) {
        const std::vector<float> q = queries(2 * g, d, o.seed);
        std::vector<float> fast(q.size()), ref(q.size());
        DecodeAttentionArgs a{q.data(), 2 * g, d, c->views.data(), 2, 1.0f / std::sqrt(static_cast<float>(d)), fast.data(), nullptr};
        {
          const IsaScope scope(v.isa);
          decode_attention(a, {threads, o.tile, o.partition, v.mode});
        }
        a.out = ref.data();
        decode_attention_ref(a);
        const bool nuq = std::any_of(c->views.begin(), c->views.end(),
                                     [](const HeadView& h) { return h.key.nuq.table || h.value.nuq.table; });
        check_close(fast, ref, v.mode == AttentionMode::int8 ? 5e-2 : nuq ? kNuqAttentionTolerance : 1e-5,
                    fmt::format("attention {} d={} gqa={}", v.label(), d, g));
      }
    }
  }
}

// The run's stream-read bandwidth (GB/s) and f32 FMA peak (G multiply-adds/s), noted in rep.
struct Peaks {
  double stream_gbs = 0, fma_gmacs = 0;
};

Peaks measure_peaks(BenchReport& rep, const AttentionBenchOptions& o, int threads) {
  const Samples stream = stream_read(o.stream_bytes, threads, 1, std::max(3, o.repeat));
  const double stream_gbs = stream.mean();
  rep.note(fmt::format("stream read ({} MB f32 sum, {} threads): {:.1f} GB/s mean, {:.1f} max", o.stream_bytes >> 20,
                       threads, stream_gbs, *std::max_element(stream.seconds.begin(), stream.seconds.end())));
  rep.note(fmt::format("{} KV heads, residual {} f16 tokens, G = {}; ms/token = one decode step of one layer "
                       "(all query heads); GB/s and ratios from the min sample",
                       o.kv_heads, o.residual, o.group));
  rep.set_extra("stream_read_gbs", stream_gbs);
  rep.set_extra("stream_read_samples_gbs", stream.seconds);
  const Samples fma = fma_peak(threads, 1, std::max(3, o.repeat));
  const double fma_g = fma.mean();
  rep.note(fmt::format("f32 FMA peak ({} threads, this build's vectors): {:.1f} G multiply-adds/s mean; x fma = "
                       "(query heads x tokens x head_dim x 2 multiply-adds) / peak / time",
                       threads, fma_g));
  rep.set_extra("fma_peak_gmacs", fma_g);
  rep.set_extra("fma_peak_samples_gmacs", fma.seconds);
  return {stream_gbs, fma_g};
}

// One (head_dim d, context n, GQA g) case of the timed runs: every variant's cache timed
// (calls per sample so that a sample lasts min_sample_s; variants interleaved), then its row.
class AttentionCase {
 public:
  AttentionCase(const AttentionBenchOptions& o, const std::vector<Variant>& variants,
                const std::vector<std::unique_ptr<Cache>>& caches, std::size_t d, std::size_t n, std::size_t g,
                int threads)
      : o_(o), variants_(variants), caches_(caches), d_(d), n_(n), g_(g), n_heads_(o.kv_heads * g),
        threads_(threads), q_(queries(n_heads_, d, o.seed)) {}

  void run(BenchReport& rep, const Peaks& peaks) {
    std::vector<float> out(q_.size());
    auto call = [&](std::size_t i) { call_into(i, variants_[i].mode, out); };
    std::vector<int> inner(caches_.size(), 1);
    std::vector<Samples> samples(caches_.size());
    for (std::size_t i = 0; i < caches_.size(); ++i) {
      for (int w = 0; w < o_.warmup; ++w) call(i);
      const double t = time_once([&] { call(i); });
      inner[i] = static_cast<int>(std::clamp(std::ceil(o_.min_sample_s / std::max(t, 1e-9)), 1.0, 10000.0));
    }
    for (int r = 0; r < o_.repeat; ++r) {
      for (std::size_t i = 0; i < caches_.size(); ++i) {
        const double t = time_once([&] {
          for (int k = 0; k < inner[i]; ++k) call(i);
        });
        samples[i].seconds.push_back(t / inner[i]);
      }
    }
    std::map<Isa, double> f16_min;  // the baseline of each instruction set
    for (std::size_t i = 0; i < caches_.size(); ++i) {
      if (variants_[i].name == "f16") f16_min[variants_[i].isa] = samples[i].min();
    }
    // Outputs for the error columns: each variant once, int8 rows also through the exact path.
    outs_.assign(caches_.size(), std::vector<float>(q_.size()));
    for (std::size_t i = 0; i < caches_.size(); ++i) {
      call_into(i, variants_[i].mode, outs_[i]);
      if (variants_[i].name == "f32") f32_row_[variants_[i].isa] = i;
    }
    for (std::size_t i = 0; i < caches_.size(); ++i) {
      const auto base = f16_min.find(variants_[i].isa);
      rep.add(row(i, samples[i], inner[i], peaks, base != f16_min.end() ? std::optional(base->second) : std::nullopt),
              samples[i]);
    }
  }

 private:
  void call_into(std::size_t i, AttentionMode m, std::vector<float>& dst) const {
    const IsaScope scope(variants_[i].isa);
    decode_attention({q_.data(), n_heads_, d_, caches_[i]->views.data(), o_.kv_heads,
                      1.0f / std::sqrt(static_cast<float>(d_)), dst.data(), nullptr},
                     {threads_, o_.tile, o_.partition, m});
  }

  // Variant i's row; f16_min: the f16 cache's best time on its instruction set, when timed.
  nlohmann::ordered_json row(std::size_t i, const Samples& samples, int inner, const Peaks& peaks,
                             std::optional<double> f16_min) const {
    const Variant& v = variants_[i];
    const double tmin = samples.min();
    const double gbs = static_cast<double>(caches_[i]->bytes) / 1e9 / tmin;
    nlohmann::ordered_json row = {{"head_dim", d_},
                                  {"context", n_},
                                  {"gqa", g_},
                                  {"kv_heads", o_.kv_heads},
                                  {"variant", v.name},
                                  {"isa", isa_name(v.isa)},
                                  {"attention", attention_mode_name(v.mode)},
                                  {"bits_key", v.bits_key},
                                  {"bits_value", v.bits_value},
                                  {"residual", v.dense ? 0 : o_.residual},
                                  {"group", o_.group},
                                  {"tile", o_.tile},
                                  {"partition", o_.partition},
                                  {"calls_per_sample", inner},
                                  {"cache_bytes", caches_[i]->bytes},
                                  {"cache_mb", static_cast<double>(caches_[i]->bytes) / 1e6},
                                  {"ms_mean", samples.mean() * 1e3},
                                  {"ms_stdev", samples.stdev() * 1e3},
                                  {"ms_min", tmin * 1e3},
                                  {"gbs", gbs},
                                  {"stream_read_gbs", peaks.stream_gbs},
                                  {"of_stream", gbs / peaks.stream_gbs}};
    // Keys and values: one multiply-add per element and query head.
    const double macs = 2.0 * static_cast<double>(n_heads_ * n_ * d_);
    row["fma_bound_ms"] = macs / (peaks.fma_gmacs * 1e9) * 1e3;
    row["of_fma"] = macs / (peaks.fma_gmacs * 1e9) / tmin;
    row["speedup_vs_f16"] = f16_min ? nlohmann::ordered_json(*f16_min / tmin) : nlohmann::ordered_json();
    const auto f32 = f32_row_.find(v.isa);
    row["err_vs_f32"] = f32 != f32_row_.end() ? nlohmann::ordered_json(relative_error(outs_[i], outs_[f32->second]))
                                              : nlohmann::ordered_json();
    row["err_vs_exact"] = v.mode == AttentionMode::int8 ? relative_error(outs_[i], exact_output(i)) : 0.0;
    return row;
  }

  // The exact output of variant i's cache and instruction set: its exact row's when that was
  // timed, else one exact call.
  std::vector<float> exact_output(std::size_t i) const {
    const Variant& v = variants_[i];
    for (std::size_t j = 0; j < caches_.size(); ++j) {
      const Variant& e = variants_[j];
      if (e.mode == AttentionMode::exact && e.name == v.name && e.isa == v.isa) return outs_[j];
    }
    std::vector<float> exact(q_.size());
    call_into(i, AttentionMode::exact, exact);
    return exact;
  }

  const AttentionBenchOptions& o_;
  const std::vector<Variant>& variants_;
  const std::vector<std::unique_ptr<Cache>>& caches_;
  std::size_t d_, n_, g_, n_heads_;
  int threads_;
  std::vector<float> q_;
  std::vector<std::vector<float>> outs_;
  std::map<Isa, std::size_t> f32_row_;
};

}  // namespace

BenchReport bench_attention(const AttentionBenchOptions& o) {
  check_args(o);
  const int threads = resolve_threads(o.threads);
  const std::vector<Variant> variants = bench_variants(o);
  BenchReport rep("attention", bench_env(threads));
  rep.set_params({{"contexts", o.contexts}, {"head_dims", o.head_dims}, {"gqa", o.gqa}, {"kv_heads", o.kv_heads},
                  {"residual", o.residual}, {"group", o.group}, {"variants", o.variants}, {"isas", o.isas}, {"attention", o.attention},
                  {"tile", o.tile}, {"partition", o.partition}, {"warmup", o.warmup}, {"repeat", o.repeat},
                  {"min_sample_s", o.min_sample_s}, {"seed", o.seed}, {"stream_bytes", o.stream_bytes}});
  check_attention_kernels(o, variants, threads);
  const Peaks peaks = measure_peaks(rep, o, threads);

  std::vector<std::size_t> contexts = o.contexts;
  std::sort(contexts.begin(), contexts.end());
  const std::size_t n_cases = o.head_dims.size() * contexts.size();
  const auto [first_case, end_case] = o.shard ? o.shard->range(n_cases) : std::pair<std::size_t, std::size_t>{0, n_cases};
  if (o.shard) rep.set_shard(*o.shard, n_cases);
  for (std::size_t di = 0; di < o.head_dims.size(); ++di) {
    const std::size_t d = o.head_dims[di];
    const std::size_t lo = std::clamp(first_case, di * contexts.size(), (di + 1) * contexts.size()) - di * contexts.size();
    const std::size_t hi = std::clamp(end_case, di * contexts.size(), (di + 1) * contexts.size()) - di * contexts.size();
    if (lo == hi) continue;
    const Source s = make_source(o.kv_heads, contexts[hi - 1], d, o.seed, threads);
    for (std::size_t ci = lo; ci < hi; ++ci) {
      const std::size_t n = contexts[ci];
      std::vector<std::unique_ptr<Cache>> caches;
      for (const Variant& v : variants) caches.push_back(build(s, n, v, o, threads));
      for (std::size_t g : o.gqa) AttentionCase(o, variants, caches, d, n, g, threads).run(rep, peaks);
    }
  }
  fit_attention_scaling(rep);
  return rep;
}

void fit_attention_scaling(BenchReport& rep) {
  std::map<std::tuple<std::size_t, std::size_t, std::string>, std::vector<std::pair<double, double>>> curves;
  for (const auto& row : rep.rows()) {
    const std::uint64_t n = json_uint(row.at("context"));  // merged parts' rows: integers only
    if (n < 4096) continue;
    curves[{json_uint(row.at("head_dim")), json_uint(row.at("gqa")),
            row.at("variant").get<std::string>() + "@" + row.at("isa").get<std::string>() +
                (row.value("attention", "exact") == "int8" ? "/int8" : "")}]
        .push_back({static_cast<double>(n), row.at("min_s").get<double>()});
  }
  nlohmann::ordered_json scaling = nlohmann::ordered_json::array();
  std::string fits;
  for (const auto& [key, pts] : curves) {
    if (pts.size() < 2) continue;
    const double e = fitted_exponent(pts);
    scaling.push_back({{"head_dim", std::get<0>(key)}, {"gqa", std::get<1>(key)}, {"variant", std::get<2>(key)},
                       {"contexts", pts.size()}, {"exponent", e}});
    fits += fmt::format(" D{}/gqa{}/{} {:.2f};", std::get<0>(key), std::get<1>(key), std::get<2>(key), e);
  }
  if (!fits.empty()) rep.note("time ~ context^k over contexts >= 4096, fitted k:" + fits);
  rep.set_extra("scaling", scaling);
}

}  // namespace akv
