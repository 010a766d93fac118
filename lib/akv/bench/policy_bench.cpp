#include "akv/bench/policy_bench.h"
#include "akv/method/registry.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "akv/attention/decode_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"
#include "akv/kv/attend.h"
#include "akv/kv/runtime.h"
#include "akv/method/params.h"
#include "akv/quant/nuq.h"

namespace akv {
namespace {

Tensor3 normal3(std::size_t a, std::size_t b, std::size_t c, std::uint64_t seed, int threads) {
  Tensor3 t(a, b, c);
  parallel_for(a, threads, [&](std::size_t i) {
    Rng rng(stream_seed(seed, {i}));
    float* p = t.row(i, 0);
    for (std::size_t j = 0; j < b * c; ++j) p[j] = static_cast<float>(rng.normal());
  });
  return t;
}

struct Prompt {
  std::vector<Tensor3> q, k, v;
  std::size_t n = 0;
  PromptKv kv() const { return {&q, &k, &k, &v, n}; }
};

Prompt make_prompt(const PolicyBenchOptions& o, std::size_t n, int threads) {
  Prompt p;
  p.n = n;
  for (std::size_t l = 0; l < o.layers; ++l) {
    p.q.push_back(normal3(o.heads, n, o.head_dim, stream_seed(o.seed, {l, 0, n}), threads));
    p.k.push_back(normal3(o.kv_heads, n, o.head_dim, stream_seed(o.seed, {l, 1, n}), threads));
    p.v.push_back(normal3(o.kv_heads, n, o.head_dim, stream_seed(o.seed, {l, 2, n}), threads));
  }
  return p;
}

// One decode step's attention for layer l through the policy's views (kv/attend.h).
void attend(KvPolicy& cache, const PolicyBenchOptions& o, std::size_t l, const float* q, float* out,
            int threads, bool reference = false) {
  attend_layer(cache, l, q, o.heads, o.kv_heads, o.head_dim, out, threads, reference);
}

// KVQuant's codebooks at p's bits (sparsity 0.99, the first row in f16) fitted on a synthetic
// prompt of the bench's shape (another seed than the timed prompts'): per layer, the keys per
// channel over [kv_heads * head_dim] and the values per row and KV head, as akv calibrate fits
// a dump's rows.
std::shared_ptr<const NuqCodebooks> fit_codebooks(const PolicyBenchOptions& o, const CompressParams& p, int threads) {
  constexpr std::size_t kRows = 512;
  PolicyBenchOptions fo = o;
  fo.seed = stream_seed(o.seed, {23});
  const Prompt fit = make_prompt(fo, kRows, threads);
  auto books = std::make_shared<NuqCodebooks>();
  const std::size_t d = o.head_dim, C = o.kv_heads * d;
  std::vector<float> key(kRows * C), value(kRows * C);
  for (std::size_t l = 0; l < o.layers; ++l) {
    for (std::size_t t = 0; t < kRows; ++t) {
      for (std::size_t h = 0; h < o.kv_heads; ++h) {
        std::copy_n(fit.k[l].row(h, t), d, key.begin() + static_cast<std::ptrdiff_t>(t * C + h * d));
        std::copy_n(fit.v[l].row(h, t), d, value.begin() + static_cast<std::ptrdiff_t>(t * C + h * d));
      }
    }
    books->key.push_back(calibrate_nuq(key.data(), kRows, C, p.key.bits, true, books->sparsity, books->sink));
    books->value.push_back(
        calibrate_nuq(value.data(), kRows, C, p.value.bits, false, books->sparsity, books->sink, nullptr, d));
  }
  return books;
}

KvGeometry geometry(const PolicyBenchOptions& o, std::size_t n) {
  KvGeometry g;
  g.n_layers = o.layers;
  g.n_heads = o.heads;
  g.n_kv_heads = o.kv_heads;
  g.head_dim = o.head_dim;
  g.max_positions = n + static_cast<std::size_t>(o.warmup + o.repeat) + 1;
  return g;
}

}  // namespace

std::vector<PplMethod> policy_methods(const std::vector<std::string>& specs) {
  std::vector<PplMethod> methods;
  for (const std::string& spec : specs) methods.push_back({spec, resolve_method_spec_for_bytes(spec)});
  return methods;
}

std::vector<BenchColumn> policy_columns() {
  return {{"context", "context"},         {"method", "method"},         {"policy_us", "policy us", 1},
          {"attention_us", "attention us", 1}, {"total_us", "total us", 1}, {"stdev_us", "stdev", 1},
          {"vs_baseline", "x base", 2},   {"cache_mb", "cache MB", 1},  {"host_mb", "of which host", 1},
          {"rows", "rows/head", 0}};
}

BenchReport bench_policy(const PolicyBenchOptions& o) {
  if (o.methods.empty() || o.contexts.empty() || o.layers == 0 || o.kv_heads == 0 || o.head_dim == 0 ||
      o.heads % o.kv_heads != 0 || o.repeat < 1 || o.warmup < 0) {
    throw UsageError("methods and contexts must be given; heads a multiple of kv-heads; --repeat >= 1",
                     {"", "--methods/--contexts/--heads/--kv-heads"});
  }
  const int threads = resolve_threads(o.threads);
  std::vector<std::optional<CompressParams>> params;
  std::string fitted;
  for (PplMethod& m : policy_methods(o.methods)) {
    if (m.params && m.params->method == Quantizer::nuq && m.params->codebook_file.empty()) {
      m.params->codebooks = fit_codebooks(o, *m.params, threads);
      fitted += (fitted.empty() ? "" : ", ") + m.spec;
    }
    params.push_back(std::move(m.params));
  }
  BenchReport rep("policy", bench_env(threads));
  rep.set_params({{"methods", o.methods}, {"contexts", o.contexts}, {"layers", o.layers}, {"heads", o.heads},
                  {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim}, {"warmup", o.warmup}, {"repeat", o.repeat},
                  {"seed", o.seed}});
  const auto [first_case, end_case] =
      o.shard ? o.shard->range(o.contexts.size()) : std::pair<std::size_t, std::size_t>{0, o.contexts.size()};
  if (o.shard) rep.set_shard(*o.shard, o.contexts.size());
  rep.note(fmt::format("{} layers, {} q / {} KV heads, head_dim {}; per decode step (all layers): policy = "
                       "append + observe + end_step, attention = fused decode attention; {} warmup + {} "
                       "timed steps after a synthetic prompt; baseline = {}",
                       o.layers, o.heads, o.kv_heads, o.head_dim, o.warmup, o.repeat, o.methods.front()));
  if (!fitted.empty()) {
    rep.note(fmt::format("{}: KVQuant's codebooks (sparsity 0.99, the first row in f16) fitted on a 512-token "
                         "synthetic prompt of this shape (no calibration= given)", fitted));
  }

  // Kernel check: the fused attention over each policy's views equals the reference.
  {
    const Prompt p = make_prompt(o, 300, threads);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto cache = make_kv_policy(params[i], geometry(o, 300), threads);
      cache->ingest_prompt(p.kv());
      std::vector<float> fast(o.heads * o.head_dim), ref(fast.size());
      const Tensor3 q = normal3(1, o.heads, o.head_dim, o.seed + 5, 1);
      attend(*cache, o, 0, q.data(), ref.data(), threads, true);
      attend(*cache, o, 0, q.data(), fast.data(), threads);
      const bool nuq = params[i] && params[i]->method == Quantizer::nuq;
      check_close(fast, ref, nuq ? kNuqAttentionTolerance : 1e-5, "attention over " + o.methods[i]);
    }
  }

  for (std::size_t c = first_case; c < end_case; ++c) {
    const std::size_t n = o.contexts[c];
    const Prompt p = make_prompt(o, n, threads);
    const std::size_t steps = static_cast<std::size_t>(o.warmup + o.repeat);
    const std::size_t hd = o.head_dim;
    // Decoded tokens: random q, k, v per step and layer (the same for every method).
    const Tensor3 dq = normal3(o.layers, steps, o.heads * hd, o.seed + 11, threads);
    const Tensor3 dk = normal3(o.layers, steps, o.kv_heads * hd, o.seed + 12, threads);
    const Tensor3 dv = normal3(o.layers, steps, o.kv_heads * hd, o.seed + 13, threads);
    double base_us = 0.0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto cache = make_kv_policy(params[i], geometry(o, n), threads);
      cache->ingest_prompt(p.kv());
      std::vector<float> out(o.heads * hd);
      Samples total, pol, att;
      for (std::size_t s = 0; s < steps; ++s) {
        double tp = 0.0, ta = 0.0;
        for (std::size_t l = 0; l < o.layers; ++l) {
          tp += time_once([&] { cache->append(l, dk.row(l, s), dk.row(l, s), dv.row(l, s), n + s); });
          // attend() includes observe(); its time is attention + observe.
          ta += time_once([&] { attend(*cache, o, l, dq.row(l, s), out.data(), threads); });
        }
        tp += time_once([&] { cache->end_step(); });
        if (s >= static_cast<std::size_t>(o.warmup)) {
          pol.seconds.push_back(tp);
          att.seconds.push_back(ta);
          total.seconds.push_back(tp + ta);
        }
      }
      if (i == 0) base_us = total.mean() * 1e6;
      const std::optional<TierBytes> tiers = cache->tier_bytes();
      const std::uint64_t host = tiers ? tiers->cold : 0;
      rep.add({{"context", n}, {"method", o.methods[i]}, {"layers", o.layers}, {"heads", o.heads},
               {"kv_heads", o.kv_heads}, {"head_dim", hd}, {"steps", o.repeat},
               {"policy_us", pol.mean() * 1e6}, {"attention_us", att.mean() * 1e6},
               {"total_us", total.mean() * 1e6}, {"stdev_us", total.stdev() * 1e6},
               {"vs_baseline", total.mean() * 1e6 / base_us}, {"cache_bytes", cache->bytes()},
               {"cache_mb", static_cast<double>(cache->bytes()) / 1e6}, {"host_bytes", host},
               {"host_mb", static_cast<double>(host) / 1e6}, {"rows", cache->view(0, 0).n},
               {"policy_samples_s", pol.seconds}},
              total);
    }
  }
  return rep;
}

}  // namespace akv
