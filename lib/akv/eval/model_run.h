#pragma once
// `akv evaluate --model`: one run of a model from what the command line names (model, token or
// text files, tokenizer, methods, shard) to the report's text: perplexity or passkey, whole or
// one shard's part (docs/evaluate.md, docs/scale.md); or RULER's tasks (docs/ruler.md). The model file is opened once for its
// weights and once more, for GGUF, for its vocabulary.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "akv/core/progress.h"
#include "akv/core/shard.h"
#include "akv/eval/passkey.h"
#include "akv/eval/perplexity.h"
#include "akv/eval/ruler.h"
#include "akv/model/tokenizer.h"

namespace akv {

struct ModelRunOptions {
  std::string model;                 // a Hugging Face directory, a GGUF file or a llama2.c checkpoint
  std::string weights = "stored";    // stored | f32 (model/weight.h)
  std::vector<std::string> methods;  // method specs as given ("full" is always evaluated first)
  std::string tokens;                // token sequences (one per line)
  std::string text;                  // or a text file, cut into llama-perplexity's chunks of ctx tokens
  std::size_t ctx = 512;
  std::string tokenizer;             // --tokenizer; empty: the model's own (find_tokenizer)
  std::string filler;                // passkey filler sequences (default: tokens)
  bool passkey = false;              // the passkey task instead of perplexity
  bool ruler = false;                // RULER's synthetic tasks instead (needs a tokenizer; no shard)
  std::optional<Shard> shard;        // a part (JSON) of shard K/N instead of the report
  std::string attention = "exact";   // exact | int8
  // Positions a run may reach (0: any; the model's trained context is passed with a warning, as
  // llama.cpp does; never a sliding window); `warn` gets that warning (and the JSON report a
  // "context" field: trained, longest, past_trained).
  std::size_t max_context = 0;
  std::function<void(const std::string&)> warn;
  PplOptions ppl;                    // methods, prefill, sequences, threads, batch, token block
  PasskeyOptions passkey_options;
  RulerOptions ruler_options;
};

enum class ReportFormat { table, csv, json };

// Runs it and returns the report (a part's JSON with a shard). InvalidInput / UsageError naming
// the file and field for bad inputs.
std::string evaluate_model(const ModelRunOptions& o, ReportFormat format, const ProgressFn& progress);

// Method specs as given on a command line, resolved ("full", the f32 reference every report puts
// first, is left out); UsageError / InvalidInput naming the spec.
std::vector<PplMethod> resolve_methods(const std::vector<std::string>& specs);

// `--ratios`: every eviction spec that names no budget (budget=, budget-tokens=, budgets=) nor a
// threshold (threshold=), at budget 1 - r for each ratio r (kvpress's compression ratio: the
// fraction of the context's tokens removed), in ratio order; every other spec once, without a
// ratio. InvalidInput naming --ratios for a ratio outside [0, 1).
std::vector<RatioSpec> expand_ratios(const std::vector<std::string>& specs, const std::vector<double>& ratios);
// `--ratios` applied: o.methods replaced by their expansion, kept in o.ruler_options.ratio_specs.
void apply_ratios(ModelRunOptions& o, const std::vector<double>& ratios);

// What a run of a model reads besides its own flags' files: the model path and, for a Hugging
// Face directory, every file in it (config.json, weights, the tokenizer found there), and the
// side files of each method (calibration=, budgets=). For check_output_distinct.
std::vector<std::string> model_run_inputs(const std::string& model_path, const std::vector<PplMethod>& methods);

// A text file cut into llama-perplexity's chunks of `ctx` tokens (BOS first; at most
// max_chunks, 0 = all); UsageError without a tokenizer.
std::vector<std::vector<std::int32_t>> text_chunks(const std::string& path, const Tokenizer* tok, std::size_t ctx,
                                                   std::size_t max_chunks);

}  // namespace akv
