#include "akv/eval/perplexity.h"

#include <fmt/format.h>

#include <cmath>
#include <mutex>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/policy/kv_runtime.h"

namespace akv {
namespace {

// log-softmax of f32 logits in f64.
std::vector<double> log_probs(const float* x, std::size_t n) {
  std::vector<double> out(n);
  log_softmax(x, n, out.data());
  return out;
}

std::size_t argmax(const std::vector<double>& x) {
  return static_cast<std::size_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

void record(MemoryTrace& t, const KvPolicy& cache, std::size_t tokens) {
  t.tokens.push_back(tokens);
  t.bytes.push_back(cache.bytes());
  if (const auto tb = cache.tier_bytes()) {
    t.hot.push_back(tb->hot);
    t.warm.push_back(tb->warm);
    t.cold.push_back(tb->cold);
    t.hot_tokens.push_back(tb->hot_tokens);
    t.warm_tokens.push_back(tb->warm_tokens);
    t.cold_tokens.push_back(tb->cold_tokens);
  }
}

}  // namespace

PplSums& PplSums::operator+=(const PplSums& o) {
  nll += o.nll;
  kl += o.kl;
  top1 += o.top1;
  tokens += o.tokens;
  bytes += o.bytes;
  host_bytes += o.host_bytes;
  f16_bytes += o.f16_bytes;
  return *this;
}

double PplSums::ppl() const { return tokens ? std::exp(nll / static_cast<double>(tokens)) : 0.0; }

PplSums PplReport::total(std::size_t method) const {
  PplSums s;
  for (const auto& seq : sequences) s += seq[method];
  return s;
}

PplReport evaluate_perplexity(const Model& model,
                              const std::vector<std::vector<std::int32_t>>& all,
                              const PplOptions& o, const ProgressFn& progress) {
  const ModelConfig& c = model.config();
  std::vector<PplMethod> methods = o.methods;
  if (methods.empty() || methods[0].params) methods.insert(methods.begin(), PplMethod{"full", std::nullopt});
  const std::size_t n_seq = o.max_sequences ? std::min(o.max_sequences, all.size()) : all.size();
  PplReport r;
  for (const auto& m : methods) {
    r.specs.push_back(m.spec);
    r.descriptions.push_back(m.params ? describe(*m.params) : "f32 K/V (reference)");
  }
  r.sequences.assign(n_seq, std::vector<PplSums>(methods.size()));
  r.prompt_tokens.assign(n_seq, 0);
  r.traces.assign(methods.size(), {});
  const KvGeometry g{c.kv_shape(), c.seq_len};
  std::size_t done = 0;
  std::mutex progress_mutex;
  parallel_for(n_seq, o.threads, [&](std::size_t si) {
    const std::vector<std::int32_t>& seq = all[si];
    const std::size_t n = seq.size();
    const std::size_t P = o.prefill ? *o.prefill : n / 2;
    if (P < 1 || P >= n) {
      throw InvalidInput("prefill must leave at least one token to predict (sequence " +
                             std::to_string(si) + " has " + std::to_string(n) + " tokens)",
                         {"", "--prefill", std::to_string(P)});
    }
    r.prompt_tokens[si] = P;
    const std::vector<std::int32_t> prompt(seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(P));
    const PrefillResult pre = model.prefill(prompt, false);
    const PromptKv pkv{&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P};
    const std::vector<double> first = log_probs(pre.logits.row(0).data(), c.vocab_size);
    std::vector<std::vector<double>> ref;  // full-cache log-probabilities per predicted token
    for (std::size_t mi = 0; mi < methods.size(); ++mi) {
      auto cache = make_kv_policy(methods[mi].params, g, 1);
      cache->ingest_prompt(pkv);
      PplSums& s = r.sequences[si][mi];
      const std::size_t stride = (n - P + MemoryTrace::kMaxTracePoints - 1) / MemoryTrace::kMaxTracePoints;
      for (std::size_t pos = P - 1; pos + 1 < n; ++pos) {
        std::vector<double> lp;
        if (pos == P - 1) {
          lp = first;
        } else {
          const std::vector<float> logits = model.decode(seq[pos], pos, *cache);
          lp = log_probs(logits.data(), logits.size());
        }
        const std::size_t k = pos - (P - 1);
        s.nll -= lp[static_cast<std::size_t>(seq[pos + 1])];
        s.tokens += 1;
        if (mi == 0) {
          ref.push_back(lp);
        } else {
          double kl = 0;
          for (std::size_t j = 0; j < lp.size(); ++j) kl += std::exp(ref[k][j]) * (ref[k][j] - lp[j]);
          s.kl += std::max(0.0, kl);
        }
        s.top1 += argmax(lp) == argmax(ref[k]) ? 1 : 0;
        if (si == 0 && (k % stride == 0 || pos + 2 == n)) record(r.traces[mi], *cache, pos + 1);
      }
      s.bytes = cache->bytes();
      if (const auto tb = cache->tier_bytes()) s.host_bytes = tb->cold;
      s.f16_bytes = 2ull * 2 * c.n_layers * c.n_kv_heads * c.head_dim * (n - 1);
    }
    if (progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      progress(++done, n_seq);
    }
  });
  return r;
}

std::vector<std::vector<std::int32_t>> perplexity_chunks(std::vector<std::int32_t> tokens, std::size_t n_ctx,
                                                         std::int32_t bos, std::size_t max_chunks) {
  if (n_ctx < 4) throw InvalidInput("context must be at least 4 tokens", {"", "--ctx", std::to_string(n_ctx)});
  std::size_t n = tokens.size() / n_ctx;
  if (n == 0) {
    throw InvalidInput("text shorter than one chunk of " + std::to_string(n_ctx) + " tokens",
                       {"", "--text", std::to_string(tokens.size()) + " tokens"});
  }
  if (max_chunks) n = std::min(n, max_chunks);
  std::vector<std::vector<std::int32_t>> chunks(n);
  for (std::size_t i = 0; i < n; ++i) {
    chunks[i].assign(tokens.begin() + static_cast<std::ptrdiff_t>(i * n_ctx),
                     tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * n_ctx));
    if (bos >= 0) chunks[i][0] = bos;
  }
  return chunks;
}

nlohmann::json MemoryTrace::to_json() const {
  nlohmann::json j = {{"sequence", 0}, {"tokens", tokens}, {"bytes", bytes}};
  if (!hot.empty()) {
    j["hot_bytes"] = hot;
    j["warm_bytes"] = warm;
    j["cold_bytes"] = cold;
    j["hot_tokens"] = hot_tokens;
    j["warm_tokens"] = warm_tokens;
    j["cold_tokens"] = cold_tokens;
  }
  return j;
}

nlohmann::json PplReport::to_json() const {
  nlohmann::json j;
  j["format"] = "akv-perplexity";
  j["version"] = 1;
  j["sequences"] = sequences.size();
  const PplSums full = total(0);
  nlohmann::json ms = nlohmann::json::array();
  for (std::size_t m = 0; m < specs.size(); ++m) {
    const PplSums s = total(m);
    const double tokens = static_cast<double>(s.tokens);
    ms.push_back({{"method", specs[m]},
                  {"description", descriptions[m]},
                  {"tokens", s.tokens},
                  {"ppl", s.ppl()},
                  {"mean_nll", s.nll / tokens},
                  {"ppl_delta", s.ppl() - full.ppl()},
                  {"kl", s.kl / tokens},
                  {"top1_agreement", static_cast<double>(s.top1) / tokens},
                  {"cache_bytes", s.bytes},
                  {"device_bytes", s.bytes - s.host_bytes},
                  {"host_bytes", s.host_bytes},
                  {"f16_bytes", s.f16_bytes},
                  {"bits_per_element", 16.0 * static_cast<double>(s.bytes) / static_cast<double>(s.f16_bytes)},
                  {"memory_trace", m < traces.size() ? traces[m].to_json() : nlohmann::json(nullptr)}});
  }
  j["methods"] = ms;
  return j;
}

std::string PplReport::to_csv() const {
  std::string out = "sequence,prompt_tokens,method,tokens,ppl,mean_nll,kl,top1_agreement,cache_bytes,host_bytes,f16_bytes\n";
  for (std::size_t si = 0; si < sequences.size(); ++si) {
    for (std::size_t m = 0; m < specs.size(); ++m) {
      const PplSums& s = sequences[si][m];
      const double t = static_cast<double>(s.tokens);
      out += fmt::format("{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{},{},{}\n", si, prompt_tokens[si], specs[m],
                         s.tokens, s.ppl(), s.nll / t, s.kl / t, static_cast<double>(s.top1) / t, s.bytes,
                         s.host_bytes, s.f16_bytes);
    }
  }
  return out;
}

std::string PplReport::to_table() const {
  const PplSums full = total(0);
  std::string out = fmt::format("{} sequences, {} predicted tokens per method (continuation after the prompt)\n",
                                sequences.size(), full.tokens);
  out += fmt::format("{:<28} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>8}  {}\n", "method", "bytes",
                     "host", "bits/el", "ppl", "ppl delta", "kl", "top1", "description");
  for (std::size_t m = 0; m < specs.size(); ++m) {
    const PplSums s = total(m);
    const double t = static_cast<double>(s.tokens);
    out += fmt::format("{:<28} {:>10} {:>10} {:>8.3f} {:>10.4f} {:>+10.4f} {:>10.3e} {:>8.4f}  {}\n", specs[m],
                       s.bytes / sequences.size(), s.host_bytes / sequences.size(),
                       16.0 * static_cast<double>(s.bytes) / static_cast<double>(s.f16_bytes), s.ppl(),
                       s.ppl() - full.ppl(), s.kl / t, static_cast<double>(s.top1) / t, descriptions[m]);
  }
  return out;
}

}  // namespace akv
