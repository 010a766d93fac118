// akv evaluate --dump DUMP --cache CACHE: fidelity of a compressed cache; akv evaluate --model:
// perplexity or passkey of cache methods inside a model (eval/model_run.h).
#include <cstdio>

#include <fmt/format.h>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/eval/batch.h"
#include "akv/eval/fidelity.h"
#include "akv/eval/fidelity_methods.h"
#include "akv/eval/model_run.h"
#include "akv/io/json_file.h"
#include "akv/method/registry.h"
#include "commands.h"
#include "model_flags.h"

namespace akv::cli {

void register_evaluate(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string dump, cache, output = "-";
    bool json = false, csv = false, per_head = false, no_verify = false;
    ModelRunOptions mo;  // --model: the flags go straight into it, but for these
    std::size_t prefill = 0;
    std::string prefill_mode = "exact";
    std::string batch = "auto", token_block = "auto", task = "ppl", shard, answer_prefix = "ruler";
    std::vector<double> ratios;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "evaluate",
      "Fidelity of a cache against its dump; perplexity or passkey of methods inside a model\n"
      "Fidelity of a compressed cache against its source dump, per layer and KV head, using the "
      "dump's window queries (each query head reads its KV head; causal): key and value "
      "relative MSE, attention output relative error ||o - o^|| / ||o||, KL(p || p^) of the "
      "attention distributions, top-k recall (k = 1, 8, 32) of the original attention's top "
      "tokens. Definitions in docs/evaluate.md.\n"
      "With --model: perplexity, KL(full || method) and top-1 agreement of cache methods inside "
      "the model's decode loop, over the continuation of each token sequence after a "
      "full-precision prompt (docs/evaluate.md, 'Model mode').");
  auto* dump = sub->add_option("--dump", opt->dump, "Source dump (akv-dump)");
  auto* cache = sub->add_option("--cache", opt->cache, "Compressed cache (akv-cache)");
  auto* model = sub->add_option("--model", opt->mo.model, kModelHelp);
  add_weights_flag(sub, opt->mo.weights);
  sub->add_option("--tokens", opt->mo.tokens,
                  "With --model: token sequences (one per line, ids separated by spaces; or an "
                  "HDF5 file with /tokens; - = standard input)");
  sub->add_option("--methods", opt->mo.methods,
                  "With --model or --dump (then without --cache: each method compressed from the dump into a "
                  "scratch cache in $TMPDIR and evaluated, one row each): methods to compare, comma-separated, each " +
                      method_spec_help() +
                      " E.g. kivi-2, kivi:bits-key=4:bits-value=2, adakv:budget=0.2:quant=k4v2, "
                      "balanced:demotion=fifo (docs/model.md, docs/tiered.md). With --model the f32 full cache is "
                      "always evaluated first as the reference")
      ->delimiter(',');
  CLI::Option* text = add_text_flags(sub, opt->mo.text, opt->mo.ctx, opt->mo.tokenizer,
                                     "With --model: a text file, tokenized (BOS first) and cut as llama-perplexity cuts it: "
                                     "chunks of --ctx tokens, each chunk's first token BOS, its second half scored (prompt "
                                     "ctx/2 + 1 tokens, then decoded through each method's cache); --sequences N takes the "
                                     "first N chunks. Needs a tokenizer (see --tokenizer)");
  sub->add_option("--shard", opt->shard,
                  "Evaluate shard K of N (K/N, 1-based): with --model (ppl) a contiguous 1/N of the "
                  "sequences (or --text chunks), with --task passkey of the (depth, length, trial) "
                  "prompts, with --task ruler of the (task, length, sample) grid, with --dump --cache of the layers; "
                  "writes a partial report (JSON, format akv-perplexity-part, akv-passkey-part, akv-ruler-part or "
                  "akv-fidelity-part) that `akv merge` "
                  "combines into the unsharded report (docs/scale.md)")->check(kShardText);
  sub->add_option("--batch", opt->batch,
                  "With --model: sequences (passkey: prompts) decoded together; each step runs every "
                  "(sequence, method) pair of the batch through the model at once, so each weight matrix "
                  "is read once per step for all of them (0 = all; auto = as many as keep the lanes' f32 K/V "
                  "within 2 GiB). The results do not depend on it")
      ->capture_default_str();
  add_decode_loop_flags(sub, opt->mo, opt->token_block, opt->prefill, opt->prefill_mode);
  sub->add_option("--sequences", opt->mo.ppl.max_sequences, "With --model: evaluate the first N sequences (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--task", opt->task,
                  "With --model: ppl (perplexity, KL, top-1 over continuations) or passkey "
                  "(passkey retrieval: token mode, marker + key at a depth inside filler, marker again at the "
                  "end, or text mode with a tokenizer; success = the greedy continuation gives the key; also the "
                  "key's mean log-probability, teacher-forced, and each cache's bits per element; docs/model.md) or ruler "
                  "(RULER's synthetic tasks, generated with the model's tokenizer: needle variants, variable "
                  "tracking, common and frequent words; greedy answers scored by string_match_all; docs/ruler.md)")
      ->capture_default_str()->check(CLI::IsMember({"ppl", "passkey", "ruler"}));
  add_passkey_flags(sub, opt->mo.passkey_options, opt->mo.filler);
  CLI::Option* lengths = sub->get_option("--lengths");
  CLI::Option* depths = sub->get_option("--depths");
  add_ruler_flags(sub, opt->mo.ruler_options, opt->answer_prefix, opt->ratios);
  text->excludes(sub->get_option("--tokens"));
  dump->excludes(model);
  cache->excludes(model);
  auto* json = sub->add_flag("--json", opt->json, "Print JSON: overall, per layer, per head");
  sub->add_flag("--csv", opt->csv, "Print CSV, one row per layer and KV head")->excludes(json);
  sub->add_flag("--per-head", opt->per_head, "Table: also one row per KV head");
  sub->add_option("-o,--output", opt->output, "Write the report to this file ('-' = stdout)")
      ->capture_default_str();
  sub->add_flag("--no-verify-hash", opt->no_verify,
                "Skip the content-hash check that the cache was made from this dump (shapes are "
                "still checked)");
  sub->callback([opt, lengths, depths, sub, &global] {
    check_output_distinct(opt->output, {opt->dump, opt->cache});
    ProgressBar bar("evaluate", !global.quiet);
    const ReportFormat format = opt->json ? ReportFormat::json : opt->csv ? ReportFormat::csv : ReportFormat::table;
    for (const auto& [task, flags] : task_flags()) {  // a task's flag elsewhere would be silently ignored
      for (const char* flag : flags) {
        if (opt->task != task && sub->get_option(flag)->count()) throw UsageError(std::string(flag) + " needs --task " + task, {"", flag});
      }
    }
    if (!opt->mo.model.empty()) {
      ModelRunOptions& mo = opt->mo;
      if (!opt->ratios.empty()) apply_ratios(mo, opt->ratios);
      mo.ppl.methods = resolve_methods(mo.methods);
      std::vector<std::string> inputs = model_run_inputs(mo.model, mo.ppl.methods);
      inputs.insert(inputs.end(), {mo.tokens, mo.text, mo.filler, mo.tokenizer});
      check_output_distinct(opt->output, inputs);
      mo.passkey = opt->task == "passkey";
      mo.ruler = opt->task == "ruler";
      if (mo.ruler) {
        if (lengths->count()) mo.ruler_options.lengths = mo.passkey_options.lengths;
        if (depths->count()) mo.ruler_options.depths = mo.passkey_options.depths;
        mo.ruler_options.seed = mo.passkey_options.seed;
        mo.ruler_options.prefix = parse_answer_prefix(opt->answer_prefix);
      }
      if (!opt->shard.empty()) mo.shard = parse_shard(opt->shard);
      if (opt->prefill) mo.ppl.prefill = opt->prefill;
      mo.ppl.prefill_mode = parse_prefill_mode(opt->prefill_mode);
      mo.ppl.threads = global.threads;
      mo.warn = [](const std::string& message) { fmt::print(stderr, "akv: warning: {}\n", message); };
      mo.ppl.batch = parse_batch(opt->batch);
      mo.ppl.token_block = parse_token_block(opt->token_block);
      mo.ppl.attention = parse_attention_mode(mo.attention);
      write_text_file(opt->output, evaluate_model(mo, format, bar.callback()));
      return;
    }
    if (!opt->dump.empty() && !opt->mo.methods.empty()) {
      if (!opt->cache.empty() || !opt->shard.empty() || opt->per_head || opt->no_verify) {
        throw UsageError("--dump with --methods takes no --cache, --shard, --per-head or --no-verify-hash", {"", "--methods"});
      }
      const std::vector<PplMethod> methods = resolve_dump_methods(opt->mo.methods);
      check_output_distinct(opt->output, model_run_inputs("", methods));
      write_text_file(opt->output, render_method_fidelity(opt->dump, evaluate_methods(opt->dump, methods, global.threads, bar.callback()), format));
      return;
    }
    if (opt->dump.empty() || opt->cache.empty()) {
      throw UsageError("evaluate needs --dump with --cache or --methods (or --model with --tokens or --text)", {"", "--dump"});
    }
    const Shard shard = opt->shard.empty() ? Shard{} : parse_shard(opt->shard);  // a part's JSON with a shard
    const FidelityReport r = evaluate_cache(opt->dump, opt->cache, global.threads, !opt->no_verify, bar.callback(), shard);
    write_text_file(opt->output, !opt->shard.empty() ? json_text(fidelity_part_json(r, shard))
                                 : opt->json         ? json_text(r.to_json())
                                 : opt->csv          ? r.to_csv()
                                                     : r.to_table(opt->per_head));
  });
}

}  // namespace akv::cli
