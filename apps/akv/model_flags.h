#pragma once
// The flags of commands that load a model (dump, evaluate --model, bench decode).
#include <string>
#include <utility>
#include <vector>

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
  CLI::Option* t = sub->add_option("--text", text, text_help + " (- = standard input)");
  sub->add_option("--ctx", ctx, "With --text: tokens per chunk")->capture_default_str()
      ->check(CLI::Range(4, 1 << 24));
  sub->add_option("--tokenizer", tokenizer,
                  "Tokenizer of --text and of passkey text mode: `bytes` (UTF-8 bytes as ids 0-255, BOS 256), a "
                  "SentencePiece tokenizer.model or a Hugging Face tokenizer.json (BPE: byte-level GPT-2, Llama 3, "
                  "Qwen2; SentencePiece-style Mistral, TinyLlama, Gemma) (default: the model's own: tokenizer.model, else tokenizer.json, in a Hugging Face model "
                  "directory, the vocabulary embedded in a GGUF model (llama or gpt2), or the byte tokenizer when "
                  "its config.json says \"akv_tokenizer\": \"bytes\")");
  return t;
}

// The passkey task's flags (evaluate --task passkey).
inline void add_passkey_flags(CLI::App* sub, PasskeyOptions& pk, std::string& filler) {
  sub->add_option("--lengths", pk.lengths, "Passkey and ruler: prompt lengths in tokens (ruler's default: 4096)")->delimiter(',')->capture_default_str();
  sub->add_option("--depths", pk.depths,
                  "Passkey: needle depths in [0, 1]. Ruler (niah_* tasks only; default: RULER's random depths): "
                  "every needle at each depth, --samples per (task, length, depth): a needle-in-a-haystack "
                  "heatmap per task (depth x length)")
      ->delimiter(',')->capture_default_str();
  sub->add_option("--trials", pk.trials, "Passkey: trials per (depth, length)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--key-tokens", pk.key_tokens, "Passkey: key length in tokens")
      ->capture_default_str()->check(CLI::Range(1, 64));
  sub->add_option("--seed", pk.seed, "Passkey and ruler: random seed (markers, keys, needles, haystacks)")->capture_default_str();
  sub->add_option("--filler", filler,
                  "Passkey: filler token sequences (one per line; - = standard input; default: --tokens); used in token mode, "
                  "when the model has no tokenizer and --tokenizer names none");
  sub->add_flag("--query-agnostic", pk.query_agnostic,
                "Passkey: the caches ingest the prompt up to its question (text mode: 'What is the pass key? ...'; "
                "token mode: the final marker), which is then decoded through the compressed cache (kvpress's "
                "query-agnostic protocol; ruler's default). Default: the whole prompt is compressed");
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
                  "given without a budget or threshold runs at budget 1 - r for each (kvpress's ratio: the fraction "
                  "of the context's tokens removed), all from one prefill per sample; the report leads with a "
                  "leaderboard of method x ratio")
      ->delimiter(',');
  sub->add_flag("--query-aware", ro.query_aware,
                "Ruler: the caches ingest the whole prompt, question included (default: the context alone, the "
                "question then decoded through the compressed cache, as kvpress's default)");
}

// The flags that belong to one task (evaluate refuses them with another).
inline std::vector<std::pair<std::string, std::vector<const char*>>> task_flags() {
  return {{"ruler", {"--tasks", "--samples", "--answer-prefix", "--answer-tokens", "--ratios", "--query-aware"}},
          {"passkey", {"--query-agnostic"}}};
}

// evaluate --model's decode-loop flags: --token-block, --attention, --max-context, --prefill and
// --prefill-mode (the strings and the prompt length are parsed by the command).
inline void add_decode_loop_flags(CLI::App* sub, ModelRunOptions& mo, std::string& token_block, std::size_t& prefill,
                                  std::string& prefill_mode) {
  sub->add_option("--token-block", token_block,
                  "With --model (ppl): continuation tokens each (sequence, method) lane decodes per model "
                  "call, layer by layer (its tokens are known: teacher forcing), so a call reads each weight "
                  "matrix once for all of them and each lane's cache while it is in the CPU caches. auto (or 0) "
                  "= about 256 rows a call: ceil(256 / lanes), 1 to 16, fewer when the call's logits would "
                  "pass 256 MiB. 1 when a method evicts while "
                  "decoding (h2o, streamingllm) or is tiered. The results do not depend on it")
      ->capture_default_str();
  sub->add_option("--attention", mo.attention,
                  "With --model: decode attention path of the methods' caches: exact (f32 products) or int8 "
                  "(packed 2- and 4-bit rows through 8-bit integer loops: query x key codes, probabilities x "
                  "value codes; other rows stay exact; error and speed in docs/attention.md)")
      ->capture_default_str()->check(CLI::IsMember({"exact", "int8"}));
  sub->add_option("--max-context", mo.max_context,
                  "With --model: refuse a run that reaches past this many positions (0 = no limit: a run past the "
                  "model's trained context goes on with a warning on stderr and \"context\": {\"past_trained\": true} "
                  "in the JSON, as llama.cpp runs past it; past a sliding window in every layer (Mistral) only none and f32 run; docs/model.md)")
      ->capture_default_str();
  sub->add_option("--prefill", prefill,
                  "With --model: prompt tokens per sequence (default half of each sequence)");
  sub->add_option("--prefill-mode", prefill_mode,
                  "With --model: exact (one full-precision prefill, then each cache ingests the prompt), "
                  "chunked:N (the prompt in chunks of N tokens: each chunk attends exactly to its own rows and to "
                  "the method's compressed cache of the earlier chunks, then the method compresses it - quantizers "
                  "store it, one-shot eviction plans the chunk alone to budget x its tokens; not for tiered, h2o, "
                  "streamingllm, kvzip, joint or --budget-tokens), chunked:N:replan (the same, but one-shot eviction "
                  "keeps the chunk and cuts the whole cache back to budget x the tokens so far, scored over the "
                  "chunk's last window queries: snapkv, knorm, keydiff, lagkv or qfilter scores, uniform or adakv, no "
                  "quant=) "
                  "or batch (llama.cpp's batch: every prompt token's K/V through the method's cache before attention; "
                  "quantizers, ggml and full only). docs/model.md")
      ->capture_default_str();
}

}  // namespace akv::cli
