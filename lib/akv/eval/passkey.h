#pragma once
// Passkey retrieval, token mode (models without a tokenizer): a random marker sequence followed
// by a random key sequence is placed at a relative depth inside filler tokens, and the prompt
// ends with the marker again; success = the greedy continuation reproduces the key exactly. The
// key is decoded teacher-forced, which gives the same successes and the mean log-probability of
// the key's tokens (a continuous score where every method fails). Text mode (below) decodes
// greedily and scores the key's tokens teacher-forced in a second lane per method (same prefill).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/progress.h"
#include "akv/core/shard.h"
#include "akv/eval/perplexity.h"
#include "akv/model/tokenizer.h"

namespace akv {

struct PasskeyOptions {
  std::vector<std::size_t> lengths = {128, 256, 448};  // prompt tokens
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  std::size_t trials = 5;
  std::size_t marker_tokens = 4, key_tokens = 4;
  std::int32_t bos = 1;           // first token of every prompt (< 0: none)
  std::int32_t min_token = 3;     // marker/key tokens are drawn from [min_token, vocab)
  std::uint64_t seed = 1;
  std::size_t answer_tokens = 10;  // text mode: greedy tokens decoded and searched for the key
  std::string length_flag = "--lengths";  // the flag a too-short text prompt's error names
  int threads = 1;
  std::size_t batch = kBatchAuto;  // prompts decoded together, every method of each: see PplOptions::batch
  AttentionMode attention = AttentionMode::exact;  // see PplOptions::attention
  PrefillMode prefill_mode = PrefillMode::exact;   // see PplOptions::prefill_mode
  // The caches ingest the prompt up to its question (text mode: the question sentence; token
  // mode: the final marker), which is then decoded through the compressed cache: kvpress's
  // query-agnostic protocol. Default: the whole prompt is compressed (query-aware).
  bool query_agnostic = false;
  Shard shard;  // evaluate prompts [shard.range(total)) of the (depth, length, trial) grid
};

struct PasskeyPrompt {
  std::vector<std::int32_t> tokens;  // the prompt, exactly `length` tokens
  std::vector<std::int32_t> key;     // what the continuation must reproduce (token mode), or the
                                     // answer's tokens (text mode: " NNNNN" encoded), scored
  std::string key_text;              // text mode: what the decoded continuation must contain
  std::size_t needle_pos = 0;        // position of the needle's first token
  std::size_t question_pos = 0;      // first token of the question (token mode: the final marker)
  std::size_t answer_tokens = 0;     // greedy tokens to generate
};

// Prompt for one (length, depth, trial): filler drawn as a contiguous run of `filler` (a
// concatenation of the filler sequences, chosen by the rng), marker + key inserted so that the
// needle starts at round(depth * (length - 1 - needle - marker)) after the BOS, then the marker.
// Throws InvalidInput when the length cannot hold BOS + needle + marker + 1 filler token.
PasskeyPrompt make_passkey_prompt(const std::vector<std::int32_t>& filler, std::size_t vocab,
                                  std::size_t length, double depth, std::size_t trial,
                                  const PasskeyOptions& o);

// The greedy continuation of `prompt` (n tokens) through a cache method (nullopt = full):
// one prefill, the method ingests it, then each argmax token is decoded through the cache.
std::vector<std::int32_t> greedy_continuation(const Model& model, const std::vector<std::int32_t>& prompt,
                                              std::size_t n, const std::optional<CompressParams>& method);

// Text mode (a SentencePiece tokenizer): BOS, the task line, filler sentences, the needle
// "The pass key is NNNNN. Remember it. NNNNN is the pass key." after round(depth * n_filler)
// filler tokens, more filler, then "What is the pass key? The pass key is"; exactly `length`
// tokens. NNNNN is a random 5-digit number; success = the decoded greedy continuation
// (o.answer_tokens tokens) contains it; `key` = the tokens of " NNNNN", whose teacher-forced
// log-probability is the continuous score.
PasskeyPrompt make_text_passkey_prompt(const Tokenizer& tok, std::size_t length, double depth,
                                       std::size_t trial, const PasskeyOptions& o);

struct PasskeyReport {
  std::vector<std::string> specs, descriptions;
  std::vector<std::size_t> lengths;
  std::vector<double> depths;
  std::size_t trials = 0;
  std::string mode;  // "token" or "text"
  // successes[method][depth][length], over the prompts evaluated
  std::vector<std::vector<std::vector<std::size_t>>> successes;
  // The prompts evaluated, [first_prompt, first_prompt + outcomes.size()) of total_prompts in
  // grid order (depth, then length, then trial); outcomes[prompt][method] = 1 on success.
  std::size_t first_prompt = 0, total_prompts = 0;
  std::vector<std::vector<char>> outcomes;
  // key_logprob[prompt][method] = mean log p of the key's tokens (nats, teacher-forced), and its
  // sums per cell, logprob_sums[method][depth][length].
  std::vector<std::vector<double>> key_logprob;
  std::vector<std::vector<std::vector<double>>> logprob_sums;
  // kv_bytes[prompt][method]: the cache's bytes after the answer; bits[prompt][method]: the same
  // per element of the positions the cache has seen, 16 x bytes / (2 bytes x layers x KV heads
  // x head_dim x 2 x positions): the full f32 cache 32, an eviction method counts what it dropped.
  std::vector<std::vector<std::uint64_t>> kv_bytes;
  std::vector<std::vector<double>> bits;
  // peak_kv_bytes[prompt][method]: the most KV bytes resident at once (Continuations::peak_bytes:
  // the prompt's rows not yet compressed counted as f32 keys and values).
  std::vector<std::vector<std::uint64_t>> peak_kv_bytes;
  bool query_agnostic = false;
  // Rebuilds successes (and logprob_sums) from outcomes (grid order from first_prompt).
  void tally();
  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Token mode from filler sequences, or text mode when `tokenizer` is given (filler unused).
PasskeyReport evaluate_passkey(const Model& model, const std::vector<std::vector<std::int32_t>>& filler,
                               const std::vector<PplMethod>& methods, const PasskeyOptions& o,
                               const ProgressFn& progress, const Tokenizer* tokenizer = nullptr);

}  // namespace akv
