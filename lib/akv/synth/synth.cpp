#include "akv/synth/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <type_traits>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/core/rng.h"

namespace akv {
namespace {

// Random-stream purposes (part of the file format's reproducibility: do not renumber).
enum Stream : std::uint64_t { kKinds = 1, kNeedles = 2, kHead = 3 };

constexpr double kSinkKeyNorm = 16.0;     // size of the sink direction in sink keys
constexpr double kQueryNoise = 0.3;       // per-channel std of the unstructured query part
constexpr double kOutlierQueryStd = 0.05; // queries barely read the outlier channels
constexpr double kNeedleKeyBoost = 2.5;   // extra std of needle keys in retrieval heads

struct ChannelPlan {
  std::vector<double> mean;          // [head_dim] pre-RoPE mean (non-zero on outlier channels)
  std::vector<double> scale;         // [head_dim] pre-RoPE std
  std::vector<bool> outlier_dim;     // [head_dim] dims of pairs that hold an outlier channel
  std::vector<double> sink_dir;      // [head_dim] unit vector on the two lowest-frequency pairs
  std::vector<bool> reserved;        // [head_dim] outlier or sink dims: content lives elsewhere
};

ChannelPlan plan_channels(const SynthOptions& o, Rng& rng) {
  const std::size_t d = o.head_dim, half = d / 2;
  const std::size_t n_out = o.outlier_channels ? o.outlier_channels : std::max<std::size_t>(1, d / 32);
  ChannelPlan p{std::vector<double>(d, 0.0), std::vector<double>(d), std::vector<bool>(d, false),
                std::vector<double>(d, 0.0), std::vector<bool>(d, false)};
  for (std::size_t c = 0; c < d; ++c) p.scale[c] = std::exp(0.25 * rng.normal());
  // Outliers live in low-frequency pairs (the last quarter of pairs, or more if needed), where
  // RoPE turns slowly, so they stay large-magnitude channels after RoPE as in real keys.
  const std::size_t pool = std::min(half - 2, std::max(n_out, half / 4));
  std::vector<std::size_t> cand(pool);
  std::iota(cand.begin(), cand.end(), half - 2 - pool);
  for (std::size_t i = 0; i < n_out; ++i) {
    std::size_t j = i + rng.below(pool - i);
    std::swap(cand[i], cand[j]);
    std::size_t a, b;
    rope_pair_dims(o.rope_layout, d, cand[i], a, b);
    std::size_t ch = rng.below(2) ? a : b;
    double sign = rng.below(2) ? 1.0 : -1.0;
    p.mean[ch] = sign * rng.uniform(6.0, 12.0);
    p.scale[ch] *= rng.uniform(2.0, 4.0);
    p.outlier_dim[a] = p.outlier_dim[b] = true;
  }
  // The sink direction uses the two lowest-frequency pairs, kept free of outliers.
  double norm2 = 0.0;
  for (std::size_t i = half - 2; i < half; ++i) {
    std::size_t a, b;
    rope_pair_dims(o.rope_layout, d, i, a, b);
    p.sink_dir[a] = rng.normal();
    p.sink_dir[b] = rng.normal();
    norm2 += p.sink_dir[a] * p.sink_dir[a] + p.sink_dir[b] * p.sink_dir[b];
  }
  for (double& v : p.sink_dir) v /= std::sqrt(norm2);
  for (std::size_t c = 0; c < d; ++c) p.reserved[c] = p.outlier_dim[c] || p.sink_dir[c] != 0.0;
  return p;
}

void fill_normal(float* x, std::size_t n, Rng& rng) {
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rng.normal());
}

// Adds to q a component with logit `level` on the (post-RoPE) key k, reading only dims outside
// `skip`: q += level * sqrt(d) * u / |u|^2 with u = k restricted to the kept dims.
void target_key(float* q, const float* k, const std::vector<bool>& skip, double level) {
  const std::size_t d = skip.size();
  double norm2 = 0.0;
  for (std::size_t c = 0; c < d; ++c) {
    if (!skip[c]) norm2 += static_cast<double>(k[c]) * k[c];
  }
  if (norm2 <= 0.0) return;
  const double s = level * std::sqrt(static_cast<double>(d)) / norm2;
  for (std::size_t c = 0; c < d; ++c) {
    if (!skip[c]) q[c] += static_cast<float>(s * k[c]);
  }
}

void synth_gaussian_head(const SynthOptions& o, std::size_t first_q, const RopeTable& rope,
                         Rng& rng, SynthHead& h) {
  const std::size_t t = o.n_tokens, d = o.head_dim;
  fill_normal(h.key_pre_rope.data(), h.key_pre_rope.size(), rng);
  fill_normal(h.value.data(), h.value.size(), rng);
  fill_normal(h.query.data(), h.query.size(), rng);
  std::copy_n(h.key_pre_rope.data(), t * d, h.key.data());
  apply_rope(h.key.data(), t, 0, o.rope_layout, rope);
  for (std::size_t r = 0; r < h.query.dim0(); ++r) {
    apply_rope(h.query.row(r, 0), o.window, first_q, o.rope_layout, rope);
  }
}

// parse_synth_profile's inverse.
std::string synth_profile_name(SynthProfile p) {
  switch (p) {
    case SynthProfile::mixed: return "mixed";
    case SynthProfile::local: return "local";
    case SynthProfile::retrieval: return "retrieval";
    case SynthProfile::diffuse: return "diffuse";
    case SynthProfile::gaussian: return "gaussian";
  }
  return "?";
}

}  // namespace

SynthProfile parse_synth_profile(const std::string& s) {
  for (auto p : {SynthProfile::mixed, SynthProfile::local, SynthProfile::retrieval,
                 SynthProfile::diffuse, SynthProfile::gaussian}) {
    if (s == synth_profile_name(p)) return p;
  }
  throw InvalidInput("unknown synth profile (expected mixed, local, retrieval, diffuse, gaussian)",
                   {"", "--profile", s});
}

std::string head_kind_name(HeadKind k) {
  switch (k) {
    case HeadKind::local: return "local";
    case HeadKind::retrieval: return "retrieval";
    case HeadKind::diffuse: return "diffuse";
    case HeadKind::gaussian: return "gaussian";
  }
  return "?";
}

void SynthOptions::validate() const {
  // A value outside its flag's range is invalid input (exit 2); two flags that cannot hold
  // together are a usage error (exit 1), as everywhere in akv (README, exit codes).
  auto text = [](auto value) {
    if constexpr (std::is_floating_point_v<decltype(value)>) {
      return format_number(value);
    } else {
      return std::to_string(value);
    }
  };
  auto bad = [&](const std::string& what, const std::string& flag, auto value) {
    throw InvalidInput(what, {"", flag, text(value)});
  };
  auto conflict = [&](const std::string& what, const std::string& flag, auto value) {
    throw UsageError(what, {"", flag, text(value)});
  };
  if (n_layers < 1) bad("need at least one layer", "--layers", n_layers);
  if (n_kv_heads < 1) bad("need at least one kv head", "--kv-heads", n_kv_heads);
  if (n_heads < 1) bad("need at least one head", "--heads", n_heads);
  if (n_heads % n_kv_heads != 0) {
    conflict("--heads must be a positive multiple of --kv-heads (" + std::to_string(n_kv_heads) +
                 ")",
             "--heads", n_heads);
  }
  if (head_dim < 8 || head_dim % 2 != 0) bad("--head-dim must be even and >= 8", "--head-dim",
                                             head_dim);
  if (n_tokens < 1) bad("need at least one token", "--tokens", n_tokens);
  if (window < 1) bad("--window must be at least 1", "--window", window);
  if (window > n_tokens) {
    conflict("--window must be between 1 and --tokens (" + std::to_string(n_tokens) + ")",
             "--window", window);
  }
  if (sinks >= n_tokens) conflict("--sinks must be smaller than --tokens", "--sinks", sinks);
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    bad("--rope-theta must be finite and > 1", "--rope-theta", rope_theta);
  }
  if (outlier_channels > head_dim / 4) {
    conflict("--outlier-channels must be at most head_dim / 4", "--outlier-channels",
             outlier_channels);
  }
  if (write.gzip < 0 || write.gzip > 9) bad("--gzip must be 0..9", "--gzip", write.gzip);
  if (threads < 0) bad("--threads must be >= 0", "--threads", threads);
}

SynthPlan make_synth_plan(const SynthOptions& o) {
  SynthPlan plan;
  plan.kinds.resize(o.n_layers);
  for (std::size_t l = 0; l < o.n_layers; ++l) {
    auto& kinds = plan.kinds[l];
    const std::size_t h = o.n_kv_heads;
    switch (o.profile) {
      case SynthProfile::mixed: {
        const std::size_t n_ret = h >= 2 ? std::max<std::size_t>(1, h / 4) : 0;
        const std::size_t n_diff = h >= 3 ? std::max<std::size_t>(1, h / 4) : 0;
        kinds.assign(h, HeadKind::local);
        std::fill_n(kinds.begin(), n_ret, HeadKind::retrieval);
        std::fill_n(kinds.begin() + static_cast<std::ptrdiff_t>(n_ret), n_diff, HeadKind::diffuse);
        Rng rng(stream_seed(o.seed, {kKinds, l}));
        for (std::size_t i = h; i > 1; --i) std::swap(kinds[i - 1], kinds[rng.below(i)]);
        break;
      }
      case SynthProfile::local: kinds.assign(h, HeadKind::local); break;
      case SynthProfile::retrieval: kinds.assign(h, HeadKind::retrieval); break;
      case SynthProfile::diffuse: kinds.assign(h, HeadKind::diffuse); break;
      case SynthProfile::gaussian: kinds.assign(h, HeadKind::gaussian); break;
    }
  }
  // Needles: one per stratum of the far context, away from the sinks and the recent window.
  const std::size_t lo = o.sinks + 8;
  const std::size_t recent = o.window + 64;
  if (o.profile != SynthProfile::gaussian && o.n_tokens > lo + recent) {
    const std::size_t span = o.n_tokens - recent - lo;
    const std::size_t n = std::min(o.needles, span / 2);
    Rng rng(stream_seed(o.seed, {kNeedles}));
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t a = lo + span * i / n, b = lo + span * (i + 1) / n;
      plan.needles.push_back(static_cast<std::int32_t>(a + rng.below(b - a)));
    }
  }
  return plan;
}

SynthHead synth_kv_head(const SynthOptions& o, const SynthPlan& plan, std::size_t layer,
                        std::size_t kv_head, const RopeTable& rope) {
  const std::size_t t_len = o.n_tokens, d = o.head_dim, g_size = o.n_heads / o.n_kv_heads;
  const std::size_t first_q = t_len - o.window;
  const double log_t = std::log(static_cast<double>(t_len));
  const HeadKind kind = plan.kinds.at(layer).at(kv_head);
  SynthHead h{Tensor3(1, t_len, d), Tensor3(1, t_len, d), Tensor3(1, t_len, d),
              Tensor3(g_size, o.window, d)};
  Rng rng(stream_seed(o.seed, {kHead, layer, kv_head}));
  if (kind == HeadKind::gaussian) {
    synth_gaussian_head(o, first_q, rope, rng, h);
    return h;
  }
  const ChannelPlan ch = plan_channels(o, rng);

  // Local heads share a component c between all their keys and queries: after RoPE the q.k
  // product of that part is sum_i |c_i|^2 cos((p - t) theta_i), large for recent tokens.
  std::vector<double> shared(d, 0.0);  // [head_dim]
  double shared_norm2 = 0.0;
  if (kind == HeadKind::local) {
    for (std::size_t c = 0; c < d; ++c) {
      if (ch.reserved[c]) continue;
      shared[c] = rng.normal();
      shared_norm2 += shared[c] * shared[c];
    }
  }

  // Keys (pre-RoPE) and values. In retrieval heads the needle keys are salient (larger norm
  // outside the outlier and sink dims), so a query can single them out at any head_dim.
  const std::size_t n_sinks = std::min(o.sinks, t_len);
  std::vector<bool> is_needle(t_len, false);
  if (kind == HeadKind::retrieval) {
    for (auto n : plan.needles) is_needle[static_cast<std::size_t>(n)] = true;
  }
  for (std::size_t t = 0; t < t_len; ++t) {
    float* k = h.key_pre_rope.row(0, t);
    for (std::size_t c = 0; c < d; ++c) {
      k[c] = static_cast<float>(ch.mean[c] + ch.scale[c] * rng.normal() + shared[c]);
    }
    const double v_scale = std::exp(0.25 * rng.normal()) * (t < n_sinks ? 0.2 : 1.0);
    float* v = h.value.row(0, t);
    for (std::size_t c = 0; c < d; ++c) v[c] = static_cast<float>(v_scale * rng.normal());
    if (is_needle[t]) {
      for (std::size_t c = 0; c < d; ++c) {
        if (!ch.reserved[c]) k[c] += static_cast<float>(kNeedleKeyBoost * rng.normal());
      }
    }
    if (t < n_sinks) {  // sink keys carry a large component along the sink direction
      const double beta = kSinkKeyNorm / (1.0 + 0.5 * static_cast<double>(t));
      for (std::size_t c = 0; c < d; ++c) k[c] += static_cast<float>(beta * ch.sink_dir[c]);
    }
  }
  std::copy_n(h.key_pre_rope.data(), t_len * d, h.key.data());
  apply_rope(h.key.data(), t_len, 0, o.rope_layout, rope);

  // Queries of the window positions, one set per query head of the group.
  for (std::size_t r = 0; r < g_size; ++r) {
    double lambda = 0.0, sink_level = 0.0, diffuse_scale = 0.0;
    std::vector<std::pair<std::size_t, double>> targets;  // (needle position, logit level)
    switch (kind) {
      case HeadKind::local: {
        const double peak = rng.uniform(8.0, 12.0) + 0.6 * log_t;
        lambda = peak * std::sqrt(static_cast<double>(d)) / shared_norm2;
        sink_level = peak + rng.uniform(-2.0, 0.5);
        break;
      }
      case HeadKind::retrieval: {
        const double level = rng.uniform(12.0, 15.0) + 0.5 * log_t;
        sink_level = level + rng.uniform(-6.0, -3.0);
        if (!plan.needles.empty()) {
          const std::size_t n = std::min<std::size_t>(1 + rng.below(3), plan.needles.size());
          std::vector<std::size_t> idx(plan.needles.size());
          std::iota(idx.begin(), idx.end(), 0);
          for (std::size_t i = 0; i < n; ++i) {
            std::swap(idx[i], idx[i + rng.below(idx.size() - i)]);
            targets.emplace_back(static_cast<std::size_t>(plan.needles[idx[i]]),
                                 level + rng.uniform(-1.0, 1.0));
          }
        }
        break;
      }
      case HeadKind::diffuse:
        diffuse_scale = rng.uniform(0.6, 1.2);
        sink_level = rng.uniform(0.3, 0.6) * log_t;
        break;
      case HeadKind::gaussian: break;
    }
    for (std::size_t j = 0; j < o.window; ++j) {
      float* q = h.query.row(r, j);
      for (std::size_t c = 0; c < d; ++c) {
        const double noise = ch.outlier_dim[c] ? kOutlierQueryStd : kQueryNoise;
        const double base = kind == HeadKind::diffuse && !ch.outlier_dim[c] ? diffuse_scale
                                                                             : noise;
        q[c] = static_cast<float>(base * rng.normal() + lambda * shared[c]);
      }
      apply_rope(q, 1, first_q + j, o.rope_layout, rope);
      // Post-RoPE components: the sink direction (sink keys barely rotate: lowest frequency).
      const double s = sink_level * std::sqrt(static_cast<double>(d)) / kSinkKeyNorm;
      for (std::size_t c = 0; c < d; ++c) q[c] += static_cast<float>(s * ch.sink_dir[c]);
      for (const auto& [pos, level] : targets) {
        target_key(q, h.key.row(0, pos), ch.reserved, level);
      }
    }
  }
  return h;
}

SynthSummary write_synth_dump(const std::string& path, const SynthOptions& o,
                              const ProgressFn& progress) {
  o.validate();
  SynthSummary summary;
  summary.plan = make_synth_plan(o);
  DumpMeta meta;
  meta.kv_shape() = o.kv_shape();
  meta.model = o.model;
  meta.n_tokens = o.n_tokens;
  meta.n_query = o.window;
  DumpWriteOptions wo = o.write;
  wo.head_kinds = true;
  DumpWriter writer(path, meta, wo);
  writer.write_root_attr("synth_profile", synth_profile_name(o.profile));
  writer.write_root_attr("synth_seed", static_cast<std::int64_t>(o.seed));

  const RopeTable rope(o.head_dim, o.rope_theta, 0, o.n_tokens);
  const int threads = resolve_threads(o.threads);
  const std::size_t g_size = o.n_heads / o.n_kv_heads;
  const std::size_t total = o.n_layers * o.n_kv_heads;
  std::size_t done = 0;
  for (std::size_t l = 0; l < o.n_layers; ++l) {
    std::vector<std::string> kinds;
    for (HeadKind k : summary.plan.kinds[l]) kinds.push_back(head_kind_name(k));
    writer.write_head_kinds(l, kinds);
    // Heads in batches of `threads`: generated in parallel, written in order.
    for (std::size_t g0 = 0; g0 < o.n_kv_heads; g0 += static_cast<std::size_t>(threads)) {
      const std::size_t n = std::min<std::size_t>(threads, o.n_kv_heads - g0);
      std::vector<SynthHead> batch(n);
      parallel_for(n, threads, [&](std::size_t i) {
        batch[i] = synth_kv_head(o, summary.plan, l, g0 + i, rope);
      });
      for (std::size_t i = 0; i < n; ++i) {
        writer.write(l, DumpField::key, g0 + i, batch[i].key);
        writer.write(l, DumpField::value, g0 + i, batch[i].value);
        if (wo.key_pre_rope) writer.write(l, DumpField::key_pre_rope, g0 + i,
                                          batch[i].key_pre_rope);
        writer.write(l, DumpField::query, (g0 + i) * g_size, batch[i].query);
        summary.elements += batch[i].key.size() * (wo.key_pre_rope ? 3 : 2) +
                            batch[i].query.size();
        if (progress) progress(++done, total);
      }
    }
  }
  if (!summary.plan.needles.empty()) writer.write_needles(summary.plan.needles);
  writer.commit();
  std::error_code ec;
  summary.bytes_on_disk = std::filesystem::file_size(path, ec);
  return summary;
}

}  // namespace akv
