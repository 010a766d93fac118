#include "akv/eval/model_run.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/eval/model_parts.h"
#include "akv/io/file_hash.h"
#include "akv/io/json_file.h"
#include "akv/io/token_file.h"
#include "akv/method/registry.h"
#include "akv/model/load.h"

namespace akv {
namespace {

nlohmann::json file_input(const std::string& path) { return {{"path", path}, {"hash", file_hash(path)}}; }

std::size_t saturating_add(std::size_t a, std::size_t b) {
  return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max() : a + b;
}

// A run whose sequences reach `longest` positions: a warning when that passes the model's trained
// context, and the report's "context" field.
nlohmann::json check_context(const ModelRunOptions& o, const Model& m, std::size_t longest) {
  const std::size_t trained = m.config().seq_len;
  if (longest > trained && longest <= m.position_limit() && longest != std::numeric_limits<std::size_t>::max() && o.warn) {
    o.warn("the run reaches position " + std::to_string(longest) + ", past the model's trained context (seq_len " +
           std::to_string(trained) + "): positions beyond it get RoPE angles the model never saw (--max-context " +
           std::to_string(trained) + " refuses such runs)");
  }
  return {{"trained", trained}, {"longest", longest}, {"past_trained", longest > trained}};
}

// The report's JSON with its "context" field.
std::string with_context(nlohmann::json j, const nlohmann::json& context) {
  j["context"] = context;
  return json_text(j);
}

// The decode settings of --model runs (threads, batch, attention path, prompt protocol), as
// passkey and RULER options take them.
template <class TaskOptions>
TaskOptions with_decode_settings(TaskOptions t, const PplOptions& p) {
  t.threads = p.threads;
  t.batch = p.batch;
  t.attention = p.attention;
  t.prefill_mode = p.prefill_mode;
  return t;
}

// A passkey or RULER part's provenance: the model, the task's own `params` with the methods,
// weights, attention path, kernels and a batch prompt protocol; the caller adds its text inputs.
PplRun task_part_run(const ModelRunOptions& o, nlohmann::json params, PrefillMode prefill_mode) {
  PplRun run;
  run.inputs["model"] = {{"path", o.model}, {"hash", path_hash(o.model)}};
  params["methods"] = o.methods;
  params["weights"] = o.weights;
  params["attention"] = o.attention;
  params["kernels"] = kernel_arithmetic();
  if (prefill_mode != PrefillMode::exact) params["prefill_mode"] = prefill_mode_name(prefill_mode);
  run.params = std::move(params);
  return run;
}

std::string passkey_run(const ModelRunOptions& o, const Model& m, const Tokenizer* tok, ReportFormat format,
                        const ProgressFn& progress) {
  PasskeyOptions pk = with_decode_settings(o.passkey_options, o.ppl);
  std::vector<std::vector<std::int32_t>> filler;
  const std::string& filler_file = o.filler.empty() ? o.tokens : o.filler;
  if (!tok) {
    filler = read_token_file(filler_file);
    m.check_tokens(filler, filler_file);
  }
  if (o.shard) pk.shard = *o.shard;
  std::size_t longest = 0;
  for (std::size_t len : pk.lengths) longest = std::max(longest, saturating_add(len, tok ? pk.answer_tokens : pk.key_tokens));
  const nlohmann::json context = check_context(o, m, longest);
  const PasskeyReport r = evaluate_passkey(m, filler, o.ppl.methods, pk, progress, tok);
  if (!o.shard) return format == ReportFormat::json ? with_context(r.to_json(), context) : r.to_table();
  PplRun run = task_part_run(o, {{"key_tokens", pk.key_tokens}, {"seed", pk.seed}}, pk.prefill_mode);
  if (tok) {
    run.inputs["tokenizer"] = tok->path();
  } else {
    run.inputs["filler"] = file_input(filler_file);
  }
  if (pk.query_agnostic) run.params["query_agnostic"] = true;
  nlohmann::json part = passkey_part_json(r, pk.shard, run);
  part["context"] = context;  // `akv merge` puts it in the merged report
  return json_text(part);
}

std::string ruler_run(const ModelRunOptions& o, const Model& m, const Tokenizer& tok, ReportFormat format,
                      const ProgressFn& progress) {
  RulerOptions ro = with_decode_settings(o.ruler_options, o.ppl);
  std::size_t longest = 0;
  std::vector<std::string> names = ro.tasks;
  if (names.empty()) {
    for (const RulerTask& t : ruler_tasks()) names.push_back(t.name);
  }
  for (std::size_t len : ro.lengths) {
    for (const std::string& t : names) {
      longest = std::max(longest, saturating_add(len, ro.answer_tokens ? ro.answer_tokens : ruler_task(t).answer_tokens));
    }
  }
  const nlohmann::json context = check_context(o, m, longest);
  if (o.shard) ro.shard = *o.shard;
  const RulerReport r = evaluate_ruler(m, tok, o.ppl.methods, ro, progress);
  if (o.shard) {
    PplRun run = task_part_run(o, {{"seed", ro.seed}, {"answer_tokens", ro.answer_tokens}}, ro.prefill_mode);
    run.inputs["tokenizer"] = tok.path();
    nlohmann::json out = ruler_part_json(r, *o.shard, run);
    out["context"] = context;  // `akv merge` puts it in the merged report
    return json_text(out);
  }
  return format == ReportFormat::json  ? with_context(r.to_json(), context)
         : format == ReportFormat::csv ? r.to_csv()
                                       : r.to_table();
}

std::string ppl_run(const ModelRunOptions& o, const Model& m, const Tokenizer* tok, ReportFormat format,
                    const ProgressFn& progress) {
  PplOptions po = o.ppl;
  std::vector<std::vector<std::int32_t>> seqs;
  std::string source = o.tokens;
  if (!o.text.empty()) {
    seqs = text_chunks(o.text, tok, o.ctx, po.max_sequences);
    if (!po.prefill) po.prefill = o.ctx / 2 + 1;
    po.kvzip = kvzip_prompts(*tok);
    source = o.text;
  } else {
    seqs = read_token_file(o.tokens);
  }
  m.check_tokens(seqs, source);
  std::size_t longest = 0;
  for (std::size_t i = 0; i < seqs.size() && (!po.max_sequences || i < po.max_sequences); ++i) {
    longest = std::max(longest, seqs[i].size());
  }
  const nlohmann::json context = check_context(o, m, longest);
  if (!o.shard) {
    const PplReport r = evaluate_perplexity(m, seqs, po, progress);
    return format == ReportFormat::json  ? with_context(r.to_json(), context)
           : format == ReportFormat::csv ? r.to_csv()
                                         : r.to_table();
  }
  // The shard's contiguous slice of the sequences (after --sequences).
  if (po.max_sequences) seqs.resize(std::min(seqs.size(), po.max_sequences));
  po.max_sequences = 0;
  const auto [lo, hi] = o.shard->range(seqs.size());
  const std::vector<std::vector<std::int32_t>> part(seqs.begin() + static_cast<std::ptrdiff_t>(lo),
                                                    seqs.begin() + static_cast<std::ptrdiff_t>(hi));
  PplRun run;
  run.inputs["model"] = {{"path", o.model}, {"hash", path_hash(o.model)}};
  if (o.text.empty()) {
    run.inputs["tokens"] = file_input(o.tokens);
  } else {
    run.inputs["text"] = {{"path", o.text}, {"hash", file_hash(o.text)}, {"ctx", o.ctx}, {"tokenizer", tok->path()}};
  }
  run.params = {{"methods", o.methods},
                {"prefill", po.prefill ? nlohmann::json(*po.prefill) : nlohmann::json()},
                {"sequences", o.ppl.max_sequences},
                {"weights", o.weights},
                {"kernels", kernel_arithmetic()}};
  const PplReport r = evaluate_perplexity(m, part, po, progress);
  nlohmann::json out = ppl_part_json(r, *o.shard, lo, seqs.size(), run);
  out["context"] = context;  // `akv merge` puts it in the merged report
  return json_text(out);
}

}  // namespace

std::string evaluate_model(const ModelRunOptions& o, ReportFormat format, const ProgressFn& progress) {
  if (o.tokens.empty() && o.text.empty() && !o.passkey && !o.ruler) {
    throw UsageError("--model needs --tokens or --text", {"", "--tokens"});
  }
  Model m = load_model(o.model, parse_weight_mode(o.weights));
  m.set_position_limit(o.max_context ? o.max_context : std::numeric_limits<std::size_t>::max());
  if (o.ruler) {
    return ruler_run(o, m, *require_tokenizer(o.tokenizer, o.model, m.config().tokenizer, "--task ruler", "RULER's text prompts"),
                     format, progress);
  }
  const std::unique_ptr<Tokenizer> tok =
      o.passkey || !o.text.empty() ? find_tokenizer(o.tokenizer, o.model, m.config().tokenizer) : nullptr;
  return o.passkey ? passkey_run(o, m, tok.get(), format, progress) : ppl_run(o, m, tok.get(), format, progress);
}

std::vector<PplMethod> resolve_methods(const std::vector<std::string>& specs) {
  std::vector<PplMethod> methods;
  for (const std::string& spec : specs) {
    if (spec != kFullMethod) methods.push_back({spec, resolve_method_spec(spec)});
  }
  return methods;
}

std::vector<RatioSpec> expand_ratios(const std::vector<std::string>& specs, const std::vector<double>& ratios) {
  for (double r : ratios) {
    if (!(r >= 0.0 && r < 1.0)) throw InvalidInput("a compression ratio must be in [0, 1)", {"", "--ratios", format_number(r)});
  }
  std::vector<RatioSpec> out;
  for (const std::string& spec : specs) {
    const MethodInfo* info = find_method(spec.substr(0, spec.find(':')));
    bool has_budget = false;
    for (const char* key : {":budget=", ":budget-tokens=", ":budgets=", ":threshold="}) has_budget = has_budget || spec.find(key) != std::string::npos;
    if (!info || info->kind != MethodKind::eviction || has_budget || ratios.empty()) {
      out.push_back({spec, spec, std::nullopt});
      continue;
    }
    for (double r : ratios) out.push_back({spec + ":budget=" + format_number(1.0 - r), spec, r});
  }
  return out;
}

void apply_ratios(ModelRunOptions& o, const std::vector<double>& ratios) {
  o.ruler_options.ratio_specs = expand_ratios(o.methods, ratios);
  o.methods.clear();
  for (const RatioSpec& r : o.ruler_options.ratio_specs) o.methods.push_back(r.spec);
}

std::vector<std::string> model_run_inputs(const std::string& model_path, const std::vector<PplMethod>& methods) {
  std::vector<std::string> files{model_path};
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(model_path, ec)) {
      if (e.is_regular_file(ec)) files.push_back(e.path().string());
    }
  }
  for (const PplMethod& m : methods) {
    if (!m.params) continue;
    for (const std::string& f : m.params->input_files()) files.push_back(f);
  }
  return files;
}


std::vector<std::vector<std::int32_t>> text_chunks(const std::string& path, const Tokenizer* tok, std::size_t ctx,
                                                   std::size_t max_chunks) {
  if (!tok) throw UsageError("--text needs a tokenizer (--tokenizer FILE, or one in the model)", {"", "--text"});
  std::vector<std::int32_t> ids;
  if (tok->bos() >= 0) ids.push_back(tok->bos());
  const std::vector<std::int32_t> body = tok->encode(read_text_file(path));
  ids.insert(ids.end(), body.begin(), body.end());
  return perplexity_chunks(std::move(ids), ctx, tok->bos(), max_chunks);
}

}  // namespace akv
