// akv dump --model M --tokens FILE [--line K] -o DUMP [--window W]: a dump from a model run (or of
// --text, or of a text passkey prompt: --passkey).
#include <cstdio>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/eval/kvzip.h"
#include "akv/eval/passkey.h"
#include "akv/io/token_file.h"
#include "akv/model/dump_model.h"
#include "akv/model/load.h"
#include "akv/model/tokenizer.h"
#include "commands.h"
#include "model_flags.h"

namespace akv::cli {

void register_dump(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string model, tokens, output, dtype = "f32", weights = "stored", text, tokenizer;
    std::size_t line = 1, ctx = 512;
    std::size_t window = 32;
    bool out_proj = false, kvzap = false;
    std::size_t passkey = 0, trial = 0;
    double depth = 0.5;
    std::uint64_t seed = 1;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "dump",
      "Run a model over a token sequence and write its keys, values and queries as a dump\n"
      "Run a model over one token sequence (full precision, causal) and write a dump (format "
      "akv-dump v1): keys after and before RoPE, values, the queries of the last --window "
      "positions, and the tokens; for allocate / compress / evaluate on real model tensors");
  sub->add_option("--model", opt->model, kModelHelp)->required();
  add_weights_flag(sub, opt->weights);
  auto* tokens = sub->add_option("--tokens", opt->tokens, "Token sequences (one per line, or HDF5 /tokens; - = standard input)");
  CLI::Option* text = add_text_flags(sub, opt->text, opt->ctx, opt->tokenizer,
                                     "A text file cut into llama-perplexity's chunks of --ctx tokens (BOS first; "
                                     "evaluate --text); --line picks the chunk");
  text->excludes(tokens);
  auto* passkey = sub->add_option(
      "--passkey", opt->passkey,
      "Dump a text passkey prompt of this many tokens instead: the prompt `evaluate --task passkey` builds in "
      "text mode (the model's tokenizer, or --tokenizer), up to and with its question, so the window queries "
      "read the needle (calibration of duo's heads: akv calibrate, docs/calibrate.md)");
  passkey->excludes(tokens)->excludes(text);
  sub->add_option("--depth", opt->depth, "--passkey: where the needle sits (0 = start, 1 = end)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", opt->seed, "--passkey: seed of the key (as evaluate --seed; take another than the "
                  "evaluation's to calibrate on other prompts)")->capture_default_str();
  sub->add_option("--trial", opt->trial, "--passkey: trial index (as evaluate's trials)")->capture_default_str();
  sub->add_option("--line", opt->line, "Which sequence (1-based line among the non-empty ones, or chunk of --text)")
      ->capture_default_str();
  sub->add_option("-o,--output", opt->output, "Output dump (HDF5)")->required();
  sub->add_option("--window", opt->window, "Queries of the last W positions are stored")
      ->capture_default_str();
  sub->add_flag("--out-proj", opt->out_proj,
                "Also write each layer's attention output projection W_o (/layers/L/o_proj, [dim, n_heads * "
                "head_dim]), which the CriticalKV methods (critical-snapkv, critical-adakv, critical=on) read");
  sub->add_flag("--kvzap", opt->kvzap,
                "Also write what `akv calibrate` fits KVzap's surrogate on: each layer's attention inputs "
                "(/layers/L/attn_input [n_tokens, dim], the RMS-normed hidden states) and every token's KVzip+ score "
                "(/layers/L/kvzip_plus [n_kv_heads, n_tokens], f32: the scores of kvzip:plus=on with its 4 sinks; "
                "the repeat prompt is written with the model's tokenizer or --tokenizer; one more prefill per 2048 "
                "tokens); method kvzap then also runs on the dump");
  sub->add_option("--dtype", opt->dtype, "Storage type: f32, f16 or bf16")->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  sub->callback([opt, &global] {
    std::vector<std::string> inputs = model_run_inputs(opt->model, {});
    inputs.insert(inputs.end(), {opt->tokens, opt->text, opt->tokenizer});
    check_output_distinct(opt->output, inputs);
    if ((opt->tokens.empty() ? 0 : 1) + (opt->text.empty() ? 0 : 1) + (opt->passkey ? 1 : 0) != 1) {
      throw UsageError("dump needs one of --tokens, --text, --passkey", {"", "--tokens"});
    }
    const Model m = load_model(opt->model, parse_weight_mode(opt->weights));
    const auto tokenizer = [&](const char* flag, const char* use) {
      return require_tokenizer(opt->tokenizer, opt->model, m.config().tokenizer, flag, use);
    };
    const std::string source = opt->passkey ? "--passkey" : opt->text.empty() ? opt->tokens : opt->text;
    std::vector<std::vector<std::int32_t>> seqs;
    if (opt->passkey) {
      PasskeyOptions po;
      po.seed = opt->seed;
      po.length_flag = "--passkey";
      seqs.push_back(make_text_passkey_prompt(*tokenizer("--passkey", "the prompt's text"), opt->passkey, opt->depth,
                                              opt->trial, po).tokens);
    } else if (opt->text.empty()) {
      seqs = read_token_file(opt->tokens);
    } else {
      seqs = text_chunks(opt->text, find_tokenizer(opt->tokenizer, opt->model, m.config().tokenizer).get(), opt->ctx, 0);
    }
    m.check_tokens(seqs, source);
    if (opt->line < 1 || opt->line > seqs.size()) {
      throw InvalidInput("no such sequence (the file has " + std::to_string(seqs.size()) + ")",
                         {source, "--line", std::to_string(opt->line)});
    }
    ModelDumpOptions o;
    o.window = opt->window;
    o.dtype = parse_dtype(opt->dtype);
    o.threads = global.threads;
    o.out_proj = opt->out_proj;
    o.attn_input = opt->kvzap;
    TokenScores plus;
    if (opt->kvzap) {
      plus = kvzip_scores(m, seqs[opt->line - 1], kvzip_prompts(*tokenizer("--kvzap", "KVzip's repeat prompt")), default_sinks(ScoreMethod::kvzip), global.threads,
                          kKvzipChunk, true);
      o.kvzip_plus = &plus;
    }
    const DumpMeta meta = dump_model_run(m, seqs[opt->line - 1], opt->output, o);
    std::printf("wrote %s (%s: %zu layers, %zu heads / %zu kv heads, head_dim %zu, %zu tokens, %zu window queries)\n",
                opt->output.c_str(), meta.model.c_str(), meta.n_layers, meta.n_heads, meta.n_kv_heads,
                meta.head_dim, meta.n_tokens, meta.n_query);
  });
}

}  // namespace akv::cli
