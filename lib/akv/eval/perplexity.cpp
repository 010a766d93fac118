#include "akv/eval/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/eval/prompt_lanes.h"
#include "akv/eval/token_metrics.h"
#include "akv/kv/runtime.h"

namespace akv {
namespace {

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
  r.attention = o.attention;
  for (const auto& m : methods) {
    r.specs.push_back(m.spec);
    r.descriptions.push_back(m.params ? describe(*m.params) : "f32 K/V (reference)");
  }
  r.sequences.assign(n_seq, std::vector<PplSums>(methods.size()));
  r.traces.assign(methods.size(), {});
  std::vector<std::optional<CompressParams>> params;
  for (const auto& m : methods) params.push_back(m.params);
  std::vector<std::size_t> prompt(n_seq);
  for (std::size_t si = 0; si < n_seq; ++si) {  // every sequence checked before any work
    const std::size_t n = all[si].size();
    prompt[si] = o.prefill ? *o.prefill : n / 2;
    if (prompt[si] < 1 || prompt[si] >= n) {
      throw InvalidInput("prefill must leave at least one token to predict (sequence " + std::to_string(si) +
                             " has " + std::to_string(n) + " tokens)",
                         {"", "--prefill", std::to_string(prompt[si])});
    }
  }
  r.prompt_tokens = prompt;
  std::size_t longest = 0;
  for (std::size_t si = 0; si < n_seq; ++si) longest = std::max(longest, all[si].size());
  const std::size_t n_methods = methods.size(), batch = resolve_batch(o.batch, n_seq, n_methods, c, longest);
  for (std::size_t b0 = 0; b0 < n_seq; b0 += batch) {
    const std::size_t nb = std::min(batch, n_seq - b0);
    std::vector<std::vector<std::int32_t>> prompts(nb);
    for (std::size_t i = 0; i < nb; ++i) {
      const std::vector<std::int32_t>& seq = all[b0 + i];
      prompts[i].assign(seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(prompt[b0 + i]));
    }
    // Lane i * n_methods + m: sequence b0 + i through method m (m = 0: the full cache); first[i]:
    // prompt i's last logits, step 0 of each of its lanes.
    PromptLanes start = prefill_lanes(model, prompts, params, longest, o.threads);
    std::vector<std::unique_ptr<KvPolicy>>& caches = start.caches;
    const std::vector<std::vector<float>>& first = start.last_logits;
    // Step t predicts token P + t of each sequence (P its prompt length) from position P - 1 + t;
    // step 0 from the prompt's logits, then `block` steps per model call (each lane's tokens
    // are known). A sequence leaves the batch after its last token.
    bool local = true;
    for (const auto& cache : caches) local = local && cache->layer_local();
    const std::size_t block = local ? resolve_token_block(o.token_block, caches.size(), c.vocab_size) : 1;
    // Sequence 0's cache bytes after each token of a call, per method (the memory trace).
    std::vector<std::vector<std::uint64_t>> bytes_after(n_methods, std::vector<std::uint64_t>(block));
    RowMatrix logits;  // [rows of the call, vocab], one buffer for all calls
    for (std::size_t t0 = 0;;) {
      std::vector<std::size_t> active, steps, row0;  // per active sequence
      std::vector<Model::Lane> lanes;
      std::size_t rows = 0;
      for (std::size_t i = 0; i < nb; ++i) {
        const std::size_t si = b0 + i, left = all[si].size() - prompt[si];  // steps t < left
        if (t0 >= left) continue;
        const std::size_t n = t0 == 0 ? 1 : std::min(block, left - t0), pos = prompt[si] - 1 + t0;
        active.push_back(i);
        steps.push_back(n);
        row0.push_back(rows);
        rows += n * n_methods;
        for (std::size_t m = 0; m < n_methods; ++m) {
          KvPolicy* cache = caches[i * n_methods + m].get();
          lanes.push_back({cache, all[si].data() + pos, pos, n, si == 0 && local ? bytes_after[m].data() : nullptr});
        }
      }
      if (active.empty()) break;
      if (t0 > 0) model.decode_lanes(lanes.data(), lanes.size(), logits, o.threads, o.attention);
      parallel_for(active.size(), o.threads, [&](std::size_t a) {
        const std::size_t i = active[a], si = b0 + i;
        const std::vector<std::int32_t>& seq = all[si];
        const std::size_t n = seq.size();
        const std::size_t stride = (n - prompt[si] + MemoryTrace::kMaxTracePoints - 1) / MemoryTrace::kMaxTracePoints;
        thread_local ReferenceRow ref;  // the full cache's row of this step
        for (std::size_t j = 0; j < steps[a]; ++j) {
          const std::size_t t = t0 + j, pos = prompt[si] - 1 + t;
          std::size_t ref_top = 0;
          for (std::size_t m = 0; m < n_methods; ++m) {
            // Lane m of this sequence holds rows row0 + m * steps .. (each lane's steps in order).
            const float* x = t0 == 0 ? first[i].data()
                                     : logits.row(static_cast<Eigen::Index>(row0[a] + m * steps[a] + j)).data();
            PplSums& s = r.sequences[si][m];
            const std::size_t top = argmax(x, c.vocab_size);
            double lse = 0;
            if (m == 0) {
              ref.set(x, c.vocab_size);
              lse = ref.lse;
              ref_top = top;
            } else {
              lse = log_sum_exp(x, c.vocab_size);
              s.kl += kl_divergence(ref, x, lse);
            }
            s.nll += lse - static_cast<double>(x[seq[pos + 1]]);
            s.tokens += 1;
            s.top1 += top == ref_top ? 1 : 0;
            if (si == 0 && (t % stride == 0 || pos + 2 == n)) {
              const KvPolicy& cache = *caches[i * n_methods + m];
              if (t0 > 0 && local) {
                r.traces[m].tokens.push_back(pos + 1);
                r.traces[m].bytes.push_back(bytes_after[m][j]);
              } else {
                record(r.traces[m], cache, pos + 1);
              }
            }
          }
        }
      });
      t0 += t0 == 0 ? 1 : block;
    }
    for (std::size_t lane = 0; lane < caches.size(); ++lane) {
      const std::size_t si = b0 + lane / n_methods;
      PplSums& s = r.sequences[si][lane % n_methods];
      s.bytes = caches[lane]->bytes();
      if (const auto tb = caches[lane]->tier_bytes()) s.host_bytes = tb->cold;
      s.f16_bytes = 2ull * 2 * c.n_layers * c.n_kv_heads * c.head_dim * (all[si].size() - 1);
    }
    if (progress) progress(b0 + nb, n_seq);
  }
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
  j["attention"] = attention_mode_name(attention);
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
  std::string out = fmt::format("{} sequences, {} predicted tokens per method (continuation after the prompt){}\n",
                                sequences.size(), full.tokens,
                                attention == AttentionMode::int8 ? "; decode attention: int8" : "");
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
