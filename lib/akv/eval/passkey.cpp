#include "akv/eval/passkey.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/eval/parts.h"
#include "akv/core/rng.h"
#include "akv/eval/lanes.h"
#include "akv/io/json_file.h"

namespace akv {

PasskeyPrompt make_passkey_prompt(const std::vector<std::int32_t>& filler, std::size_t vocab,
                                  std::size_t length, double depth, std::size_t trial,
                                  const PasskeyOptions& o) {
  const std::size_t bos = o.bos >= 0 ? 1 : 0;
  const std::size_t needle = o.marker_tokens + o.key_tokens;
  if (length < bos + needle + o.marker_tokens + 1) {
    throw InvalidInput("passkey length too short for the needle (needs " +
                           std::to_string(bos + needle + o.marker_tokens + 1) + " tokens)",
                       {"", "--lengths", std::to_string(length)});
  }
  if (!(depth >= 0.0 && depth <= 1.0)) {
    throw InvalidInput("depth must be in [0, 1]", {"", "--depths", format_number(depth)});
  }
  if (o.min_token < 0 || static_cast<std::size_t>(o.min_token) >= vocab) {
    throw InvalidInput("no token range for markers and keys", {"", "min_token", std::to_string(o.min_token)});
  }
  const std::size_t n_fill = length - bos - needle - o.marker_tokens;
  if (filler.size() < n_fill) {
    throw InvalidInput("filler has fewer tokens than a prompt needs (" + std::to_string(n_fill) + ")",
                       {"", "--filler", std::to_string(filler.size())});
  }
  Rng rng(stream_seed(o.seed, {length, static_cast<std::uint64_t>(std::llround(depth * 1e6)), trial}));
  const std::size_t span = vocab - static_cast<std::size_t>(o.min_token);
  std::vector<std::int32_t> marker(o.marker_tokens), key(o.key_tokens);
  for (auto& t : marker) t = o.min_token + static_cast<std::int32_t>(rng.below(span));
  for (auto& t : key) t = o.min_token + static_cast<std::int32_t>(rng.below(span));
  const std::size_t start = rng.below(filler.size() - n_fill + 1);
  const std::size_t before = static_cast<std::size_t>(std::llround(depth * static_cast<double>(n_fill)));
  PasskeyPrompt p;
  if (bos) p.tokens.push_back(o.bos);
  p.tokens.insert(p.tokens.end(), filler.begin() + static_cast<std::ptrdiff_t>(start),
                  filler.begin() + static_cast<std::ptrdiff_t>(start + before));
  p.needle_pos = p.tokens.size();
  p.tokens.insert(p.tokens.end(), marker.begin(), marker.end());
  p.tokens.insert(p.tokens.end(), key.begin(), key.end());
  p.tokens.insert(p.tokens.end(), filler.begin() + static_cast<std::ptrdiff_t>(start + before),
                  filler.begin() + static_cast<std::ptrdiff_t>(start + n_fill));
  p.question_pos = p.tokens.size();
  p.tokens.insert(p.tokens.end(), marker.begin(), marker.end());
  p.key = key;
  p.answer_tokens = key.size();
  return p;
}

PasskeyPrompt make_text_passkey_prompt(const Tokenizer& tok, std::size_t length, double depth,
                                       std::size_t trial, const PasskeyOptions& o) {
  if (!(depth >= 0.0 && depth <= 1.0)) {
    throw InvalidInput("depth must be in [0, 1]", {"", "--depths", format_number(depth)});
  }
  Rng rng(stream_seed(o.seed, {length, static_cast<std::uint64_t>(std::llround(depth * 1e6)), trial, 7}));
  const std::string key = std::to_string(10000 + rng.below(90000));
  const auto task = tok.encode(
      "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
      "it. I will quiz you about the important information there.");
  const auto needle = tok.encode(" The pass key is " + key + ". Remember it. " + key + " is the pass key.");
  const auto question = tok.encode(" What is the pass key? The pass key is");
  const auto filler_block = tok.encode(
      " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.");
  const std::size_t bos = tok.bos() >= 0 ? 1 : 0;  // Qwen2-style tokenizers put none
  const std::size_t fixed = bos + task.size() + needle.size() + question.size();
  if (length <= fixed) {
    throw InvalidInput("passkey length too short for the text prompt (needs more than " + std::to_string(fixed) + " tokens)",
                       {"", o.length_flag, std::to_string(length)});
  }
  const std::size_t n_fill = length - fixed;
  std::vector<std::int32_t> filler;
  while (filler.size() < n_fill) filler.insert(filler.end(), filler_block.begin(), filler_block.end());
  filler.resize(n_fill);
  const std::size_t before = static_cast<std::size_t>(std::llround(depth * static_cast<double>(n_fill)));
  PasskeyPrompt p;
  if (bos) p.tokens.push_back(tok.bos());
  p.tokens.insert(p.tokens.end(), task.begin(), task.end());
  p.tokens.insert(p.tokens.end(), filler.begin(), filler.begin() + static_cast<std::ptrdiff_t>(before));
  p.needle_pos = p.tokens.size();
  p.tokens.insert(p.tokens.end(), needle.begin(), needle.end());
  p.tokens.insert(p.tokens.end(), filler.begin() + static_cast<std::ptrdiff_t>(before), filler.end());
  p.question_pos = p.tokens.size();
  p.tokens.insert(p.tokens.end(), question.begin(), question.end());
  p.key_text = key;
  p.key = tok.encode(" " + key);
  p.answer_tokens = o.answer_tokens;
  return p;
}

std::vector<std::int32_t> greedy_continuation(const Model& model, const std::vector<std::int32_t>& prompt,
                                              std::size_t n, const std::optional<CompressParams>& method) {
  return continue_lanes(model, {prompt}, {n}, {method}, 1, AttentionMode::exact, nullptr).tokens[0];
}

PasskeyReport evaluate_passkey(const Model& model, const std::vector<std::vector<std::int32_t>>& filler_seqs,
                               const std::vector<PplMethod>& given, const PasskeyOptions& o,
                               const ProgressFn& progress, const Tokenizer* tokenizer) {
  const ModelConfig& c = model.config();
  const std::vector<PplMethod> methods = full_first(given);
  std::vector<std::int32_t> filler;
  for (const auto& s : filler_seqs) {
    // Drop a leading BOS so that filler reads as running text.
    filler.insert(filler.end(), s.begin() + (!s.empty() && s[0] == o.bos ? 1 : 0), s.end());
  }
  const AttentionMode attention = protocol_attention(o.prefill_mode, o.attention);
  PasskeyReport r;
  for (const auto& m : methods) {
    r.specs.push_back(m.spec);
    r.descriptions.push_back(method_description(m, o.attention, o.prefill_mode));
  }
  r.lengths = o.lengths;
  r.depths = o.depths;
  r.trials = o.trials;
  r.mode = tokenizer ? "text" : "token";
  if (tokenizer && tokenizer->vocab_size() > c.vocab_size) {
    throw InvalidInput("tokenizer has more pieces (" + std::to_string(tokenizer->vocab_size()) +
                           ") than the model's vocabulary (" + std::to_string(c.vocab_size) + ")",
                       {tokenizer->path(), "vocab_size", std::to_string(tokenizer->vocab_size())});
  }
  // Positions a prompt's lanes decode past it: the answer (text mode: the greedy answer or the
  // key's tokens, whichever is longer).
  const auto answer = [&](const PasskeyPrompt& p) { return tokenizer ? std::max(o.answer_tokens, p.key.size()) : o.key_tokens; };
  const auto check_fits = [&](std::size_t len, std::size_t n) {
    if (len > model.position_limit() || n > model.position_limit() - len) {
      throw InvalidInput("prompt plus key longer than " + model.limit_text(), {"", "--lengths", std::to_string(len)});
    }
  };
  // Grid order: depth, length, trial. Every length and depth is checked before any work (a
  // prompt is as long as its length, whatever its depth and trial); a shard then builds only
  // its own prompts, a batch at a time.
  auto prompt = [&](std::size_t j) {
    const std::size_t d = j / (o.trials * o.lengths.size()), l = j / o.trials % o.lengths.size(), t = j % o.trials;
    return tokenizer ? make_text_passkey_prompt(*tokenizer, o.lengths[l], o.depths[d], t, o)
                     : make_passkey_prompt(filler, c.vocab_size, o.lengths[l], o.depths[d], t, o);
  };
  for (double depth : o.depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) throw InvalidInput("depth must be in [0, 1]", {"", "--depths", format_number(depth)});
  }
  if (!o.depths.empty() && o.trials > 0) {
    for (std::size_t l = 0; l < o.lengths.size(); ++l) {
      check_fits(o.lengths[l], tokenizer ? o.answer_tokens : o.key_tokens);
      check_fits(o.lengths[l], answer(prompt(l * o.trials)));
    }
  }
  r.total_prompts = checked_product({o.depths.size(), o.lengths.size(), o.trials}, {"", "--trials", std::to_string(o.trials)});
  const auto [lo, hi] = o.shard.range(r.total_prompts);
  r.first_prompt = lo;
  r.outcomes.assign(hi - lo, std::vector<char>(methods.size(), 0));
  r.key_logprob.assign(hi - lo, std::vector<double>(methods.size(), 0.0));
  r.kv_bytes.assign(hi - lo, std::vector<std::uint64_t>(methods.size(), 0));
  r.peak_kv_bytes.assign(hi - lo, std::vector<std::uint64_t>(methods.size(), 0));
  r.bits.assign(hi - lo, std::vector<double>(methods.size(), 0.0));
  r.query_agnostic = o.query_agnostic;
  // Lanes per prompt: each method once (token mode: the key teacher-forced gives the successes
  // too), or twice in text mode (greedy answer, then the key's tokens teacher-forced).
  const std::size_t n_methods = methods.size(), per_prompt = tokenizer ? 2 * n_methods : n_methods;
  std::vector<std::optional<CompressParams>> params;
  for (std::size_t l = 0; l < per_prompt; ++l) params.push_back(methods[l % n_methods].params);
  std::size_t longest = 0;  // the lengths of this shard's prompts (text mode: up to 8 key tokens for the estimate)
  for (std::size_t j = lo; j < hi; ++j) {
    longest = std::max(longest, o.lengths[j / o.trials % o.lengths.size()] + (tokenizer ? std::max<std::size_t>(o.answer_tokens, 8) : o.key_tokens));
  }
  const std::size_t batch = resolve_batch(o.batch, hi - lo, per_prompt, c, longest);
  const KvzipPrompts zip = tokenizer ? kvzip_prompts(*tokenizer) : KvzipPrompts{};
  const double element_bytes = 2.0 * 2.0 * static_cast<double>(c.n_kv_heads * c.head_dim);  // f16 K + V of a row
  for (std::size_t b0 = lo; b0 < hi; b0 += batch) {
    const std::size_t nb = std::min(batch, hi - b0);
    std::vector<PasskeyPrompt> jobs;
    std::vector<std::vector<std::int32_t>> prompts(nb), questions(nb);
    std::vector<LaneGoal> goals;
    for (std::size_t i = 0; i < nb; ++i) {
      jobs.push_back(prompt(b0 + i));
      const auto& t = jobs[i].tokens;
      check_fits(t.size(), answer(jobs[i]));
      const auto split = t.begin() + static_cast<std::ptrdiff_t>(o.query_agnostic ? jobs[i].question_pos : t.size());
      prompts[i].assign(t.begin(), split);
      questions[i].assign(split, t.end());
    }
    // Token mode decodes the key teacher-forced: the argmax tokens match the key exactly when
    // the greedy continuation would (they agree up to the first miss), and the key's
    // log-probability comes with them.
    for (std::size_t i = 0; i < nb; ++i) {
      for (std::size_t l = 0; l < per_prompt; ++l) {
        const bool greedy = tokenizer && l < n_methods;
        goals.push_back({greedy ? jobs[i].answer_tokens : jobs[i].key.size(), greedy ? nullptr : &jobs[i].key});
      }
    }
    const Continuations out = continue_lanes(model, prompts, params, goals, o.threads, attention,
                                             o.query_agnostic ? &questions : nullptr, o.prefill_mode,
                                             tokenizer ? &zip : nullptr);
    for (std::size_t i = 0; i < nb; ++i) {
      const PasskeyPrompt& p = jobs[i];
      for (std::size_t mi = 0; mi < n_methods; ++mi) {
        const std::size_t lane = i * per_prompt + mi, scored = lane + (tokenizer ? n_methods : 0);
        const auto& cont = out.tokens[lane];
        const std::size_t k = b0 + i - lo;
        r.outcomes[k][mi] = tokenizer ? (tokenizer->decode(cont).find(p.key_text) != std::string::npos ? 1 : 0)
                                      : (cont == p.key ? 1 : 0);
        r.key_logprob[k][mi] = out.logprob[scored] / static_cast<double>(p.key.size());
        r.kv_bytes[k][mi] = out.bytes[lane];
        r.peak_kv_bytes[k][mi] = out.peak_bytes[lane];
        const std::size_t positions = p.tokens.size() + std::max<std::size_t>(goals[lane].n, 1) - 1;
        r.bits[k][mi] = 16.0 * static_cast<double>(out.bytes[lane]) / (element_bytes * static_cast<double>(c.cached_rows(positions)));
      }
    }
    if (progress) progress(b0 + nb - lo, hi - lo);
  }
  r.tally();
  return r;
}


void PasskeyReport::tally() {
  successes.assign(specs.size(), std::vector<std::vector<std::size_t>>(
                                     depths.size(), std::vector<std::size_t>(lengths.size(), 0)));
  logprob_sums.assign(specs.size(),
                      std::vector<std::vector<double>>(depths.size(), std::vector<double>(lengths.size(), 0.0)));
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const std::size_t j = first_prompt + i;  // grid order: depth, length, trial
    const std::size_t d = j / (trials * lengths.size()), l = j / trials % lengths.size();
    for (std::size_t mi = 0; mi < specs.size(); ++mi) {
      successes[mi][d][l] += static_cast<std::size_t>(outcomes[i][mi]);
      logprob_sums[mi][d][l] += key_logprob[i][mi];
    }
  }
}

nlohmann::json PasskeyReport::to_json() const {
  nlohmann::json j = {{"format", "akv-passkey"}, {"version", 1},    {"mode", mode},
                      {"lengths", lengths},   {"depths", depths}, {"trials", trials},
                      {"question", query_agnostic ? "decoded after compression" : "compressed with the context"}};
  nlohmann::json ms = nlohmann::json::array();
  for (std::size_t m = 0; m < specs.size(); ++m) {
    std::size_t total = 0;
    double all = 0.0;
    const nlohmann::json grid = json_grid(depths.size(), lengths.size(), [&](std::size_t d, std::size_t l) {
      total += successes[m][d][l];
      return static_cast<double>(successes[m][d][l]) / static_cast<double>(trials);
    });
    const nlohmann::json lp = json_grid(depths.size(), lengths.size(), [&](std::size_t d, std::size_t l) {
      all += logprob_sums[m][d][l];
      return logprob_sums[m][d][l] / static_cast<double>(trials);
    });
    const double cells = static_cast<double>(trials * depths.size() * lengths.size());
    nlohmann::json entry = {{"method", specs[m]},          {"description", descriptions[m]},
                            {"accuracy", grid},             {"mean_accuracy", static_cast<double>(total) / cells},
                            {"mean_kv_bytes", mean_of_method(kv_bytes, m)}, {"bits_per_element", mean_of_method(bits, m)},
                            {"mean_peak_kv_bytes", mean_of_method(peak_kv_bytes, m)}};
    entry["key_logprob"] = lp;
    entry["mean_key_logprob"] = all / cells;
    ms.push_back(entry);
  }
  j["methods"] = ms;
  return j;
}

std::string PasskeyReport::to_table() const {
  std::string out = fmt::format("passkey ({} mode), {} trials per cell, the question {}; accuracy by depth (rows) x prompt length (columns)\n",
                                mode, trials, query_agnostic ? "decoded after compression" : "compressed with the context");
  for (std::size_t m = 0; m < specs.size(); ++m) {
    out += fmt::format("\n{} ({}; {:.3g} bits per element; peak resident {:.2f} MiB)\n{:>7}", specs[m], descriptions[m],
                       mean_of_method(bits, m), mean_of_method(peak_kv_bytes, m) / 1048576.0, "depth");
    for (std::size_t l : lengths) out += fmt::format(" {:>6}", l);
    out += "\n";
    const auto grid = [&](auto cell) {  // a row a depth
      for (std::size_t d = 0; d < depths.size(); ++d) {
        out += fmt::format("{:>7.2f}", depths[d]);
        for (std::size_t l = 0; l < lengths.size(); ++l) out += cell(d, l);
        out += "\n";
      }
    };
    const double n = static_cast<double>(trials);
    grid([&](std::size_t d, std::size_t l) { return fmt::format(" {:>6.2f}", static_cast<double>(successes[m][d][l]) / n); });
    out += "key log-probability (nats per key token, teacher-forced)\n";
    grid([&](std::size_t d, std::size_t l) { return fmt::format(" {:>6.3g}", logprob_sums[m][d][l] / n); });
  }
  return out;
}

}  // namespace akv
