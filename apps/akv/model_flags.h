#pragma once
// The flags of commands that load a model (dump, evaluate --model, bench decode).
#include <string>

#include <CLI/CLI.hpp>

#include "akv/eval/model_run.h"

namespace akv::cli {

inline constexpr const char* kModelHelp =
    "Model: a Hugging Face directory (config.json + safetensors), a GGUF file, or a llama2.c "
    "checkpoint (.bin) (docs/model.md)";

// --weights stored|f32 into `mode`.
inline void add_weights_flag(CLI::App* sub, std::string& mode) {
  sub->add_option("--weights", mode,
                  "stored: F16/BF16 and GGUF block weights stay as the file stores them (memory-mapped) "
                  "and are converted to f32 a tile at a time in each product; f32: converted on load "
                  "(4 bytes per weight; the same results); q8: as stored, but in decode steps GGUF block "
                  "types (Q4_0..Q6_K) multiply in integers against activations rounded to 8-bit blocks, "
                  "as llama.cpp's CPU backend does (several times faster one-stream decode; logits move "
                  "within that rounding; the prompt's products stay exact; docs/model.md)")
      ->capture_default_str()->check(CLI::IsMember({"stored", "f32", "q8"}));
}

// --text (with `text_help`), --ctx and --tokenizer (evaluate --model, dump). Returns --text.
inline CLI::Option* add_text_flags(CLI::App* sub, std::string& text, std::size_t& ctx, std::string& tokenizer,
                                   const std::string& text_help) {
  CLI::Option* t = sub->add_option("--text", text, text_help);
  sub->add_option("--ctx", ctx, "With --text: tokens per chunk")->capture_default_str()
      ->check(CLI::Range(4, 1 << 24));
  sub->add_option("--tokenizer", tokenizer,
                  "Tokenizer of --text and of passkey text mode: `bytes` (UTF-8 bytes as ids 0-255, BOS 256), a "
                  "SentencePiece tokenizer.model or a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, "
                  "Qwen2) (default: the model's own: tokenizer.model, else tokenizer.json, in a Hugging Face model "
                  "directory, the vocabulary embedded in a GGUF model (llama or gpt2), or the byte tokenizer when "
                  "its config.json says \"akv_tokenizer\": \"bytes\")");
  return t;
}

// The passkey task's flags (evaluate --task passkey).
inline void add_passkey_flags(CLI::App* sub, PasskeyOptions& pk, std::string& filler) {
  sub->add_option("--lengths", pk.lengths, "Passkey and ruler: prompt lengths in tokens (ruler's default: 4096)")->delimiter(',')->capture_default_str();
  sub->add_option("--depths", pk.depths, "Passkey: needle depths in [0, 1]")->delimiter(',')->capture_default_str();
  sub->add_option("--trials", pk.trials, "Passkey: trials per (depth, length)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--key-tokens", pk.key_tokens, "Passkey: key length in tokens")
      ->capture_default_str()->check(CLI::Range(1, 64));
  sub->add_option("--seed", pk.seed, "Passkey and ruler: random seed (markers, keys, needles, haystacks)")->capture_default_str();
  sub->add_option("--filler", filler,
                  "Passkey: filler token sequences (one per line; default: --tokens); used in token mode, "
                  "when the model has no tokenizer and --tokenizer names none");
}

// RULER's flags (evaluate --task ruler); --lengths and --seed are the passkey flags'.
inline void add_ruler_flags(CLI::App* sub, RulerOptions& ro, std::string& prefix, std::vector<double>& ratios) {
  sub->add_option("--tasks", ro.tasks,
                  "Ruler: tasks, comma-separated (default all): niah_single_1, niah_single_2, niah_single_3, "
                  "niah_multikey_1, niah_multikey_2, niah_multikey_3, niah_multivalue, niah_multiquery, vt, cwe, fwe "
                  "(docs/ruler.md)")
      ->delimiter(',');
  sub->add_option("--samples", ro.samples, "Ruler: samples per (task, length)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--answer-prefix", prefix,
                  "Ruler: how a needle task's prompt ends: ruler (RULER's answer prefix) or restate (the needle's own "
                  "words up to its value, 'One of the special magic numbers for KEY is:', for models that retrieve by "
                  "verbatim match such as the constructed retrieval model)")
      ->capture_default_str()->check(CLI::IsMember({"ruler", "restate"}));
  sub->add_option("--answer-tokens", ro.answer_tokens,
                  "Ruler: greedy tokens decoded per answer (0 = RULER's per task: 128 for niah, 30 vt, 120 cwe, 50 fwe)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 16));
  sub->add_option("--ratios", ratios,
                  "Ruler: compression ratios, comma-separated (e.g. 0.25,0.5,0.75,0.875): every eviction method "
                  "given without a budget runs at budget 1 - r for each (kvpress's ratio: the fraction of the "
                  "context's tokens removed), all from one prefill per sample; the report leads with a leaderboard "
                  "of method x ratio")
      ->delimiter(',');
  sub->add_flag("--query-aware", ro.query_aware,
                "Ruler: the caches ingest the whole prompt, question included (default: the context alone, the "
                "question then decoded through the compressed cache, as kvpress's default)");
}

}  // namespace akv::cli
