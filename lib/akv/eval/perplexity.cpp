#include "akv/eval/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/eval/lanes.h"
#include "akv/eval/token_metrics.h"
#include "akv/kv/runtime.h"

namespace akv {
namespace {

void record(MemoryTrace& t, const KvPolicy& cache, std::size_t tokens) {
  t.tokens.push_back(tokens);
  t.bytes.push_back(cache.bytes());
  if (const auto tb = cache.tier_bytes()) t.tiers.push_back(*tb);
}

}  // namespace

PplSums& PplSums::operator+=(const PplSums& o) {
  fields([&](const char*, auto m) { this->*m += o.*m; });
  return *this;
}

double PplSums::ppl() const { return tokens ? std::exp(nll / static_cast<double>(tokens)) : 0.0; }

PplSums PplReport::total(std::size_t method) const {
  PplSums s;
  for (const auto& seq : sequences) s += seq[method];
  return s;
}

std::vector<PplMethod> full_first(const std::vector<PplMethod>& given) {
  std::vector<PplMethod> methods = given;
  if (methods.empty() || methods[0].params) methods.insert(methods.begin(), PplMethod{kFullMethod, std::nullopt});
  return methods;
}

std::string method_description(const PplMethod& m, bool int8) {
  return m.params ? describe(*m.params) + (int8 ? "; int8 attention" : "") : "f32 K/V (reference)";
}

std::string method_description(const PplMethod& m, AttentionMode attention, PrefillMode prefill) {
  return method_description(m, attention == AttentionMode::int8) +
         (prefill != PrefillMode::exact ? "; prompt " + prefill_mode_name(prefill) : "");
}

PplReport evaluate_perplexity(const Model& model,
                              const std::vector<std::vector<std::int32_t>>& all,
                              const PplOptions& o, const ProgressFn& progress) {
  const ModelConfig& c = model.config();
  const std::vector<PplMethod> methods = full_first(o.methods);
  const std::size_t n_seq = o.max_sequences ? std::min(o.max_sequences, all.size()) : all.size();
  PplReport r;
  r.attention = o.attention;
  r.prefill_mode = o.prefill_mode;
  // llama.cpp's protocol: its batch, and its query rounding for ggml block keys, prompt and steps.
  const AttentionMode attention = protocol_attention(o.prefill_mode, o.attention);
  for (const auto& m : methods) {
    r.specs.push_back(m.spec);
    r.descriptions.push_back(method_description(m, false));
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
    // Lane i * n_methods + m: sequence b0 + i through method m (m = 0: the full cache); first[lane]:
    // the lane's logits after its prompt, its step 0.
    PromptLanes start = prefill_lanes(model, prompts, params, longest, o.threads,
                                      {o.prefill_mode, attention, o.token_block, o.kvzip ? &*o.kvzip : nullptr});
    std::vector<std::unique_ptr<KvPolicy>>& caches = start.caches;
    const std::vector<std::vector<float>>& first = start.last_logits;
    // Step t predicts token P + t of each sequence (P its prompt length) from position P - 1 + t;
    // step 0 from the prompt's logits, then the lane engine's calls of `block` steps (each lane's
    // tokens are known). A sequence leaves the batch after its last token.
    bool local = true;
    for (const auto& cache : caches) local = local && cache->layer_local();
    const std::size_t block = local ? resolve_token_block(o.token_block, caches.size(), c.vocab_size) : 1;
    // Sequence 0's cache bytes after each token of a call, per method (the memory trace).
    std::vector<std::vector<std::uint64_t>> bytes_after(n_methods, std::vector<std::uint64_t>(block));
    // Steps [t0, t0 + n) of sequence b0 + i; x(m, j): method m's logits of step t0 + j; `traced`:
    // bytes_after holds the cache bytes of those steps.
    const auto score = [&](std::size_t i, std::size_t t0, std::size_t n, bool traced,
                           const std::function<const float*(std::size_t, std::size_t)>& x_of) {
      const std::size_t si = b0 + i;
      const std::vector<std::int32_t>& seq = all[si];
      const std::size_t len = seq.size();
      const std::size_t stride = (len - prompt[si] + MemoryTrace::kMaxTracePoints - 1) / MemoryTrace::kMaxTracePoints;
      thread_local ReferenceRow ref;  // the full cache's row of this step
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t t = t0 + j, pos = prompt[si] - 1 + t;
        std::size_t ref_top = 0;
        for (std::size_t m = 0; m < n_methods; ++m) {
          const float* x = x_of(m, j);
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
          if (si == 0 && (t % stride == 0 || pos + 2 == len)) {
            if (traced) {
              r.traces[m].tokens.push_back(pos + 1);
              r.traces[m].bytes.push_back(bytes_after[m][j]);
            } else {
              record(r.traces[m], *caches[i * n_methods + m], pos + 1);
            }
          }
        }
      }
    };
    parallel_for(nb, o.threads, [&](std::size_t i) {
      score(i, 0, 1, false, [&](std::size_t m, std::size_t) { return first[i * n_methods + m].data(); });
    });
    // Lane i * n_methods + m: step t >= 1 feeds token P - 1 + t at that position.
    std::vector<DecodeLane> lanes;
    for (std::size_t i = 0; i < nb; ++i) {
      const std::size_t si = b0 + i, p = prompt[si];
      for (std::size_t m = 0; m < n_methods; ++m) {
        lanes.push_back({caches[i * n_methods + m].get(), p, all[si].size() - p - 1, all[si].data() + p,
                         si == 0 && local ? bytes_after[m].data() : nullptr});
      }
    }
    std::vector<std::uint64_t> peak = start.peak_bytes;  // [lane]: sampled after every call
    run_lanes(
        model, lanes, block, {},
        [&](const std::vector<LaneRows>& rows, const RowMatrix& logits) {
          for (const LaneRows& r0 : rows) peak[r0.lane] = std::max(peak[r0.lane], caches[r0.lane]->peak_bytes());
          // The lanes of one sequence are consecutive and take the same steps.
          std::vector<std::size_t> seq_rows;  // index into rows of each sequence's method-0 lane
          for (std::size_t k = 0; k < rows.size(); ++k) {
            if (rows[k].lane % n_methods == 0) seq_rows.push_back(k);
          }
          parallel_for(seq_rows.size(), o.threads, [&](std::size_t a) {
            const LaneRows& r0 = rows[seq_rows[a]];
            score(r0.lane / n_methods, 1 + r0.step, r0.n, local, [&](std::size_t m, std::size_t j) {
              return logits.row(static_cast<Eigen::Index>(rows[seq_rows[a] + m].row + j)).data();
            });
          });
        },
        o.threads, attention);
    for (std::size_t lane = 0; lane < caches.size(); ++lane) {
      const std::size_t si = b0 + lane / n_methods;
      PplSums& s = r.sequences[si][lane % n_methods];
      s.bytes = caches[lane]->bytes();
      s.peak_bytes = std::max(peak[lane], caches[lane]->peak_bytes());
      if (const auto tb = caches[lane]->tier_bytes()) s.host_bytes = tb->cold;
      s.f16_bytes = 2ull * 2 * c.n_kv_heads * c.head_dim * c.cached_rows(all[si].size() - 1);
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
  if (!tiers.empty()) tier_columns([&](const char*, const char* name, auto m) { j[name] = column(m); });
  return j;
}

nlohmann::json PplReport::to_json() const {
  nlohmann::json j;
  j["format"] = "akv-perplexity";
  j["version"] = 1;
  j["sequences"] = sequences.size();
  j["attention"] = attention_mode_name(attention);
  if (prefill_mode != PrefillMode::exact) j["prefill_mode"] = prefill_mode_name(prefill_mode);
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
                  {"mean_peak_kv_bytes", static_cast<double>(s.peak_bytes) / static_cast<double>(sequences.size())},
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
                                std::string(attention == AttentionMode::int8 ? "; decode attention: int8" : "") +
                                    (prefill_mode == PrefillMode::batch ? "; prompt: batch (llama.cpp's protocol)"
                                     : prefill_mode != PrefillMode::exact
                                         ? "; prompt: " + prefill_mode_name(prefill_mode) + " (chunks attend to the compressed earlier chunks)"
                                         : ""));
  std::size_t width = 28;  // wider for long method specs
  for (const std::string& s : specs) width = std::max(width, s.size());
  out += fmt::format("{:<{}} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>8}  {}\n", "method", width, "bytes",
                     "host", "bits/el", "ppl", "ppl delta", "kl", "top1", "description");
  for (std::size_t m = 0; m < specs.size(); ++m) {
    const PplSums s = total(m);
    const double t = static_cast<double>(s.tokens);
    out += fmt::format("{:<{}} {:>10} {:>10} {:>8.3f} {:>10.4f} {:>+10.4f} {:>10.3e} {:>8.4f}  {}\n", specs[m], width,
                       s.bytes / sequences.size(), s.host_bytes / sequences.size(),
                       16.0 * static_cast<double>(s.bytes) / static_cast<double>(s.f16_bytes), s.ppl(),
                       s.ppl() - full.ppl(), s.kl / t, static_cast<double>(s.top1) / t, descriptions[m]);
  }
  return out;
}

}  // namespace akv
