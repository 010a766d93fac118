#include "akv/method/params.h"

#include <cmath>
#include <cstdio>

#include "akv/core/errors.h"
#include "akv/method/registry.h"
#include "akv/quant/pack.h"

namespace akv {
namespace {

void check_tensor(const TensorQuant& t, const char* which, const std::string& file) {
  check_bits(t.bits, which == std::string("key") ? "--bits-key" : "--bits-value");
  if (t.group == 0) throw InvalidInput("group size must be >= 1", {file, "--group", "0"});
}

}  // namespace

std::vector<std::string> CompressParams::input_files() const {
  std::vector<std::string> files;
  if (!calibration_file.empty()) files.push_back(calibration_file);
  if (!codebook_file.empty()) files.push_back(codebook_file);
  if (eviction() && !eviction()->budgets_file.empty()) files.push_back(eviction()->budgets_file);
  if (eviction()) {
    for (std::string& f : score_files(eviction()->score)) files.push_back(std::move(f));
  }
  if (eviction() && !eviction()->duo_heads.empty()) files.push_back(eviction()->duo_heads);
  return files;
}

namespace {

std::string rotation_suffix(const QuantParams& p) {
  if (p.rotate == RotationKind::none) return "";
  return p.rotate == RotationKind::hadamard ? " hadamard" : " random-hadamard seed " + std::to_string(p.rotate_seed);
}

}  // namespace

std::string describe(const CompressParams& p) {
  if (const GgmlCacheParams* g = p.ggml()) {
    const std::string types = g->types.empty() ? "K " + g->key + " V " + g->value : "per-head types from " + g->types;
    return "ggml " + types + (g->fp8() ? " scale " + g->scale : "") +
           (g->calibration.empty() ? "" : " calibrated") + rotation_suffix(p) +
           (g->boundary > 0 ? " boundary " + std::to_string(g->boundary) : "");
  }
  if (p.tiered()) {
    const TieredParams& t = *p.tiered();
    return "tiered" + (t.preset.empty() ? std::string() : " " + t.preset) + " hot " + std::to_string(t.hot) +
           " warm K" + std::to_string(t.warm_bits_key) + "/V" + std::to_string(t.warm_bits_value) +
           (t.warm ? " " + std::to_string(*t.warm) : std::string(" unlimited")) + " cold " +
           (t.cold_bits == 16 ? std::string("f16 host") : "int" + std::to_string(t.cold_bits)) + " " +
           (t.demotion == Demotion::fifo ? "fifo" : "importance") +
           (t.anchors ? " anchors " + std::to_string(t.anchors) : std::string());
  }
  std::string out;
  if (p.eviction()) {
    const EvictionParams& e = *p.eviction();
    out = (e.threshold ? std::string("threshold") : alloc_method_name(e.alloc)) + "/" + score_method_name(e.score.method);
    char buf[64];
    if (e.budget_fraction) {
      std::snprintf(buf, sizeof buf, " %g", *e.budget_fraction);
      out += buf;
    } else if (e.budget_tokens) {
      out += " " + std::to_string(*e.budget_tokens) + " tokens";
    }
    if (e.threshold) out += " >= " + format_number(*e.threshold) + (e.decoding ? " while decoding" : "");
    if (e.every > 0) out += " every " + std::to_string(e.every) + " to " + std::to_string(e.target);
    if (e.critical) out += " critical";
    if (e.score.plus) out += " plus";
    out += " + ";
  }
  out += p.preset.empty() ? quantizer_name(p.method) : p.preset;
  if (p.quantized()) {
    // Per-head bits are joint's when it allocates them now or a budgets file of `akv allocate
    // --method joint` brought them (its path is then recorded as their calibration).
    const EvictionParams* e = p.eviction();
    const bool joint = e && (e->alloc == AllocMethod::joint ||
                             (!e->budgets_file.empty() && p.calibration_file == e->budgets_file));
    const bool per_head = !p.head_bits.empty() || !p.calibration_file.empty() || joint;
    out += !per_head ? " K" + std::to_string(p.key.bits) + "/V" + std::to_string(p.value.bits)
                     : joint ? " joint per-head bits" : " calibrated per-head bits";
    if (p.residual) out += " R" + std::to_string(p.residual);
    if (p.rule != QuantRule::kivi) out += " " + quant_rule_name(p.rule);
    if (p.outlier_fraction > 0) out += " outliers";
    if (p.pre_rope) out += " pre-RoPE";
    out += rotation_suffix(p);
    if (p.eviction() && p.eviction()->rotate_choice) out += " or none per head";
    if (p.eviction() && !p.eviction()->cache_types.empty()) {
      std::string types;
      for (const std::string& t : p.eviction()->cache_types) types += (types.empty() ? "" : "/") + t;
      out += " or " + types;
    }
  }
  return out;
}

namespace {

std::size_t count(long long v) { return static_cast<std::size_t>(v); }  // >= 0: check_request

// Exactly one budget: a fraction, a token count, a budgets file or a threshold (decoding=on
// evicts by it while decoding).
void apply_budget_flags(EvictionParams& e, const std::string& method, const EvictionRequest& r) {
  const int budgets = (r.budget ? 1 : 0) + (r.budget_tokens ? 1 : 0) + (r.budgets_file ? 1 : 0) + (r.threshold ? 1 : 0);
  if (budgets != 1) {  // none: name the method; several: name them
    std::string given;
    for (const auto& [flag, set] : {std::pair{"--budget", r.budget.has_value()}, {"--budget-tokens", r.budget_tokens.has_value()},
                                    {"--budgets", r.budgets_file.has_value()}, {"--threshold", r.threshold.has_value()}}) {
      if (set) given += (given.empty() ? "" : " and ") + std::string(flag);
    }
    throw UsageError("an eviction method needs exactly one of --budget, --budget-tokens, --budgets, --threshold",
                     budgets == 0 ? Where{"", "--method", method} : Where{"", "given", given});
  }
  if (r.threshold) e.threshold = *r.threshold;
  if (r.decoding) {
    if (!r.threshold) throw UsageError("decoding=on evicts by a threshold: add threshold=T", {"", "--decoding", *r.decoding});
    e.decoding = *r.decoding == "on";
  }
  if (r.budget) e.budget_fraction = *r.budget;
  if (r.budget_tokens) e.budget_tokens = count(*r.budget_tokens);
  if (r.budgets_file) {
    e.alloc = AllocMethod::file;
    e.budgets_file = *r.budgets_file;
  }
}

// duo's head scores (heads=): its streaming heads' window and sinks unless given.
void apply_duo_heads(EvictionParams& e, const EvictionRequest& r) {
  if (e.alloc != AllocMethod::duo) {
    throw UsageError("this flag gives duo's head scores, not " + alloc_method_name(e.alloc) + "'s",
                     {"", "--heads", *r.duo_heads});
  }
  if (r.score) {
    throw UsageError("heads= ranks duo's heads by the calibration file: a score would not change the split",
                     {"", "--score", *r.score});
  }
  e.duo_heads = *r.duo_heads;
  // Token scores do not move a duo split; knorm (keys only) fills the report's kept scores.
  e.score.method = ScoreMethod::knorm;
  // The streaming heads of the method duo unless given (`akv allocate --method duo` starts from
  // the allocator's defaults).
  const EvictionParams row = eviction_method("duo");
  if (!r.window) e.score.window = row.score.window;
  if (!r.sinks) e.sinks = row.sinks;
}

// threshold= keeps what passes in each head: no allocator, no scores that need the whole
// sequence, no decode-time target.
void check_threshold_flags(const EvictionParams& e, const std::string& method, const EvictionRequest& r) {
  const ScoreMethod s = e.score.method;
  if (s == ScoreMethod::h2o || s == ScoreMethod::streamingllm || e.alloc == AllocMethod::joint ||
      e.alloc == AllocMethod::duo || e.critical) {
    throw UsageError("threshold= keeps what passes in each head: not with h2o, streamingllm, joint, duo or critical=on",
                     {"", "--threshold", method + " (" + score_method_name(s) + ")"});
  }
  if (gives_allocator_flag(r)) {
    throw UsageError("threshold= replaces the allocator: drop its flags (" + allocator_flag_list() + ")",
                     {"", "--threshold", format_number(*e.threshold)});
  }
  if (r.every || r.target) {
    throw UsageError("threshold= evicts by score, every= to a target: to evict while decoding, add decoding=on",
                     {"", r.every ? "--every" : "--target", std::to_string(r.every ? *r.every : *r.target)});
  }
}

void apply_eviction_flags(EvictionParams& e, const std::string& method, const EvictionRequest& r) {
  apply_budget_flags(e, method, r);
  if (r.score) {
    if (e.alloc == AllocMethod::joint && *r.score != "snapkv") {
      throw UsageError("joint scores tokens with snapkv", {"", "--score", *r.score});
    }
    e.score.method = parse_score_method(*r.score);
    // The forced tokens follow the score, unless the method's row fixes them (duo's streaming heads).
    const MethodInfo* row = find_method(method);
    if (!row || row->window < 0) {
      e.score.window = default_window(e.score.method);
      e.sinks = default_sinks(e.score.method);
    }
  }
  if (r.window) e.score.window = count(*r.window);
  if (r.sinks) e.sinks = count(*r.sinks);
  apply_eviction_fields(e, r);
  if (r.duo_heads) apply_duo_heads(e, r);
  if (e.alloc != AllocMethod::file) check_score_file(e.score);  // a budgets file brings its own
  if (r.critical) e.critical = *r.critical == "on";
  if (r.first_stage) {
    if (!e.critical) throw UsageError("first-stage sets CriticalKV's stage 1: add critical=on", {"", "--first-stage", format_number(*r.first_stage)});
    e.first_stage = *r.first_stage;
  }
  if (e.critical) {
    const ScoreMethod s = e.score.method;
    if (e.alloc == AllocMethod::joint || s == ScoreMethod::h2o || s == ScoreMethod::streamingllm) {
      throw UsageError("CriticalKV selects once from a whole prompt's scores: not with joint, h2o or streamingllm",
                       {"", "--critical", e.alloc == AllocMethod::joint ? "on (joint)" : "on (" + score_method_name(s) + ")"});
    }
  }
  if (e.threshold) check_threshold_flags(e, method, r);
  if (r.every.has_value() != r.target.has_value()) {
    throw UsageError("decode-time compression takes both every= and target=",
                     {"", r.every ? "--target" : "--every", "missing"});
  }
  if (r.every) {
    e.every = count(*r.every);
    e.target = count(*r.target);
    check_decode_compression(e);
  }
  if (e.decoding) check_threshold_decoding(e, false);
}

EvictionParams resolve_eviction(const std::string& method, const EvictionRequest& r) {
  EvictionParams e = eviction_method(method);
  apply_eviction_flags(e, method, r);
  return e;
}

CompressParams resolve_quant(const CompressRequest& r);

void apply_rotation(QuantParams& p, const CompressRequest& r) {
  if (r.rotate) p.rotate = parse_rotation(*r.rotate);
  if (r.rotate_seed) {
    if (p.rotate != RotationKind::random) {
      throw UsageError("rotate-seed needs rotate=random", {"", "--rotate-seed", std::to_string(*r.rotate_seed)});
    }
    p.rotate_seed = static_cast<std::uint64_t>(*r.rotate_seed);
  }
}

// turboquant and its presets: ggml rows of TurboQuant's types (tensor/turboquant.h), as vLLM's
// TurboQuantConfig builds them: keys tq<b>nc after a Hadamard rotation (bits-key 8: fp8 e4m3
// with scale one, unrotated), values tqv<b> (never rotated).
CompressParams resolve_turboquant(const CompressRequest& r) {
  const MethodInfo& m = *find_method(r.method);
  const bool preset = r.method != "turboquant";
  CompressRequest rest = r;
  rest.method = "none";
  rest.bits_key.reset();
  rest.bits_value.reset();
  rest.rotate.reset();
  rest.rotate_seed.reset();
  rest.ggml.boundary.reset();
  rest.ggml.qjl.reset();
  if (rest.tiered.any() || rest.eviction.any() || rest.ggml.any() || rest.quant || rest.bits || rest.key_axis ||
      rest.value_axis || rest.quant_rule || rest.group || rest.residual || rest.outlier_fraction || rest.pre_rope ||
      rest.calibration || (preset && (r.bits_key || r.bits_value))) {
    throw UsageError(r.method + (preset ? " takes only boundary, rotate and rotate-seed (its bits are fixed; method "
                                          "turboquant takes bits-key and bits-value)"
                                        : " takes only bits-key (2, 3, 4 or 8), bits-value (2, 3 or 4), boundary, "
                                          "qjl, rotate and rotate-seed"),
                     {"", "--method", r.method});
  }
  const int kb = static_cast<int>(r.bits_key.value_or(m.bits_key));
  const int vb = static_cast<int>(r.bits_value.value_or(m.bits_value));
  if (kb != 2 && kb != 3 && kb != 4 && kb != 8) throw InvalidInput("turboquant keys take 2, 3, 4 or 8 bits", {"", "bits-key", std::to_string(kb)});
  if (vb != 2 && vb != 3 && vb != 4) throw InvalidInput("turboquant values take 2, 3 or 4 bits", {"", "bits-value", std::to_string(vb)});
  const bool qjl = r.ggml.qjl.value_or("off") == "on";
  if (qjl && preset) {
    throw UsageError(r.method + " has norm-corrected keys; qjl=on is method turboquant's (turboquant:bits-key=3:qjl=on)",
                     {"", "qjl", *r.ggml.qjl});
  }
  if (qjl && kb == 8) throw InvalidInput("qjl needs bits-key 2, 3 or 4 (levels + one sign bit)", {"", "bits-key", "8"});
  CompressParams p;
  p.method = Quantizer::none;
  p.residual = 0;
  p.rotate = kb == 8 ? RotationKind::none : RotationKind::hadamard;
  apply_rotation(p, r);
  GgmlCacheParams g;
  g.key = kb == 8 ? "fp8_e4m3" : "tq" + std::to_string(kb) + (qjl ? "j" : "nc");
  g.value = "tqv" + std::to_string(vb);
  g.scale = "one";
  g.boundary = static_cast<std::size_t>(r.ggml.boundary.value_or(2));  // vLLM's default
  p.mode = g;
  return p;
}

}  // namespace

EvictionParams resolve_allocation(const std::string& alloc, const std::string& score,
                                  const EvictionRequest& r) {
  CompressRequest checked;
  checked.eviction = r;
  check_request(checked);
  EvictionParams e;
  e.alloc = parse_alloc_method(alloc);
  e.score.method = parse_score_method(score);
  e.score.window = default_window(e.score.method);
  e.sinks = default_sinks(e.score.method);
  if (r.budgets_file) throw UsageError("allocate computes budgets; --budgets is for compress", {"", "--budgets"});
  if (r.threshold) {
    throw UsageError("allocate spreads a budget; threshold= is for compress and evaluate",
                     {"", "--threshold", format_number(*r.threshold)});
  }
  if (r.every || r.target) {
    throw UsageError("decode-time compression (every=, target=) runs in the model's decode loop: akv evaluate --model",
                     {"", r.every ? "--every" : "--target", std::to_string(r.every ? *r.every : *r.target)});
  }
  apply_eviction_flags(e, alloc, r);
  return e;
}

void validate_params(const CompressParams& p, const std::string& file) {
  if (p.rotate != RotationKind::none && !p.quantized() && !p.ggml()) {
    throw InvalidInput("rotation needs a quantizer or llama.cpp block types", {file, "--rotate", rotation_name(p.rotate)});
  }
  if (!p.quantized()) return;
  if (p.rotate != RotationKind::none && p.tiered()) {
    throw InvalidInput("the tiered cache does not rotate", {file, "--rotate", rotation_name(p.rotate)});
  }
  if (p.rotate != RotationKind::none && p.pre_rope) {
    throw InvalidInput("rotation needs keys after RoPE (not with pre-rope)", {file, "--rotate", rotation_name(p.rotate)});
  }
  check_tensor(p.key, "key", file);
  check_tensor(p.value, "value", file);
  for (const TensorQuant* t : {&p.key, &p.value}) {
    if (p.residual % t->group != 0) {
      throw InvalidInput("residual window must be a multiple of the group size " +
                             std::to_string(t->group),
                         {file, "--residual", std::to_string(p.residual)});
    }
  }
  if (!(p.outlier_fraction >= 0.0 && p.outlier_fraction < 1.0)) {
    throw InvalidInput("outlier fraction must be in [0, 1)",
                       {file, "--outlier-fraction", format_number(p.outlier_fraction)});
  }
}

namespace {

bool is_tiered_method(const std::string& m) {
  const MethodInfo* info = find_method(m);
  return info && info->kind == MethodKind::tiered;
}

// The tiered presets of the AKV seed: warm bits and hot budget.
CompressParams resolve_tiered(const CompressRequest& r) {
  TieredParams t;
  const std::string preset = r.method == "tiered" ? r.tiered.preset.value_or("balanced") : r.method;
  if (r.method != "tiered" && r.tiered.preset) {
    throw UsageError("preset given twice", {"", "preset", *r.tiered.preset});
  }
  // A tiered preset row (quality, balanced, compact), or a kivi preset's bits with 128 hot tokens.
  const MethodInfo* found = find_method(preset);
  if (!found || !(found->kind == MethodKind::preset || (found->kind == MethodKind::tiered && found->hot > 0))) {
    std::string names;
    for (const MethodInfo& m : method_registry()) {
      if (m.kind == MethodKind::tiered && m.hot > 0) names += std::string(m.name) + ", ";
    }
    throw InvalidInput("unknown tiered preset (expected " + names + method_list({MethodKind::preset}) + ")",
                       {"", "preset", preset});
  }
  t.preset = found->name;
  t.warm_bits_key = found->bits_key;
  t.warm_bits_value = found->bits_value;
  t.hot = found->hot > 0 ? found->hot : 128;
  t.protect_last = t.hot >= 128 ? 32 : 0;  // compact's 64 hot tokens hold the sink and open blocks only
  const TieredRequest& q = r.tiered;  // ranges checked by check_request
  if (q.hot) t.hot = count(*q.hot);
  if (q.warm) t.warm = count(*q.warm);
  if (q.warm_bits_key) t.warm_bits_key = static_cast<int>(*q.warm_bits_key);
  if (q.warm_bits_value) t.warm_bits_value = static_cast<int>(*q.warm_bits_value);
  if (q.cold_bits) t.cold_bits = static_cast<int>(*q.cold_bits);
  if (q.protect_first) t.protect_first = count(*q.protect_first);
  if (q.protect_last) t.protect_last = count(*q.protect_last);
  if (q.anchors) t.anchors = count(*q.anchors);
  if (q.decay) t.decay = *q.decay;
  if (q.w_attn) t.w_attn = *q.w_attn;
  if (q.w_recency) t.w_recency = *q.w_recency;
  if (q.margin) t.margin = *q.margin;
  if (q.demotion) t.demotion = *q.demotion == "fifo" ? Demotion::fifo : Demotion::importance;
  if (r.bits || r.bits_key || r.bits_value || r.key_axis || r.value_axis || r.group || r.residual ||
      r.quant_rule || r.outlier_fraction || r.pre_rope || r.rotate || r.rotate_seed || r.calibration || r.quant ||
      r.eviction.any()) {
    throw UsageError("tiered takes hot, warm, warm-bits-key, warm-bits-value, cold-bits, protect-first, "
                     "protect-last, anchors, decay, w-attn, w-recency, margin, demotion, preset",
                     {"", "--method", r.method});
  }
  CompressParams p;
  p.method = Quantizer::kivi;
  p.key = {t.warm_bits_key, QuantAxis::channel, t.block};
  p.value = {t.warm_bits_value, QuantAxis::token, 32};
  p.residual = 0;
  p.rule = QuantRule::bounded;  // the tiers' rule (kv/tiered.cpp)
  p.mode = t;
  return p;
}

// Methods ggml and fp8: llama.cpp's cache types (k=, v=, types=), fp8's scale rule and calibration.
CompressParams resolve_cache_types(const CompressRequest& r) {
  if (r.ggml.boundary) {
    throw UsageError("boundary is turboquant's (vLLM's boundary protection)", {"", "boundary", std::to_string(*r.ggml.boundary)});
  }
  if (r.ggml.qjl) throw UsageError("qjl is turboquant's (ggml's key types tq2j-tq4j store it)", {"", "qjl", *r.ggml.qjl});
  CompressRequest rest = r;
  rest.ggml = {};
  rest.method = "none";
  rest.rotate.reset();
  rest.rotate_seed.reset();
  if (rest.tiered.any() || rest.eviction.any() || rest.quant || rest.bits || rest.bits_key || rest.bits_value ||
      rest.key_axis || rest.value_axis || rest.quant_rule || rest.group || rest.residual || rest.outlier_fraction ||
      rest.pre_rope || (rest.calibration && r.method != "fp8")) {
    throw UsageError(r.method + " takes only k, v (cache types), scale, rotate and rotate-seed (fp8: and calibration)",
                     {"", "--method", r.method});
  }
  CompressParams p;
  p.method = Quantizer::none;
  p.residual = 0;
  apply_rotation(p, r);
  GgmlCacheParams g;
  if (r.ggml.types) {
    if (r.method != "ggml") throw UsageError("types is method ggml's (per-head cache types)", {"", "--method", r.method});
    if (r.ggml.k || r.ggml.v) {
      throw UsageError("types gives every head its k and v types: drop k= and v=", {"", "types", *r.ggml.types});
    }
    g.types = *r.ggml.types;  // read against the model's shape by read_calibration_inputs
    g.key.clear();
    g.value.clear();
  }
  if (r.method == "fp8") g.key = g.value = "fp8_e4m3";
  if (r.ggml.k) g.key = ggml_cache_type_alias(*r.ggml.k);
  if (r.ggml.v) g.value = ggml_cache_type_alias(*r.ggml.v);
  if (r.method == "fp8" && !(g.key.rfind("fp8_", 0) == 0 && g.value.rfind("fp8_", 0) == 0)) {
    throw UsageError("fp8 takes k= and v= e4m3 or e5m2 (other cache types: method ggml)", {"", "k", g.key + "/" + g.value});
  }
  if (r.ggml.scale) {
    if (!g.fp8() && g.types.empty()) {
      throw UsageError("scale is the fp8 types' scale rule (k= or v= e4m3, e5m2)", {"", "scale", *r.ggml.scale});
    }
    g.scale = *r.ggml.scale;
  }
  if (r.calibration) {  // method fp8 only (above)
    if (g.scale == "one") throw UsageError("a calibration gives fp8 scales per head or tensor, not scale=one", {"", "calibration", *r.calibration});
    g.calibration = *r.calibration;
  }
  p.mode = g;
  return p;
}

// An eviction (or joint) method over the quantizer of --quant.
CompressParams resolve_evicting(const CompressRequest& r) {
  const std::string quant = r.quant.value_or("none");
  if (is_eviction_method(quant)) {
    throw UsageError("--quant takes a quantization method or preset", {"", "--quant", quant});
  }
  if (const MethodInfo* q = find_method(quant); q && q->kind == MethodKind::ggml) {
    throw UsageError("--quant takes a quantizer or preset (" + method_list({MethodKind::quantizer, MethodKind::preset}) +
                         "): ggml, fp8 and turboquant caches store every row and do not combine with eviction",
                     {"", "--quant", quant});
  }
  CompressRequest q = r;
  q.method = quant;
  CompressParams p = resolve_quant(q);
  p.mode = resolve_eviction(r.method, r.eviction);
  if (p.method == Quantizer::nuq && p.eviction()->alloc == AllocMethod::joint) {
    throw UsageError("joint allocates kivi bits per head: --quant kivi", {"", "--quant", quant});
  }
  if (r.eviction.rotate_choice) {
    if (p.eviction()->alloc != AllocMethod::joint) {
      throw UsageError("rotate-choice is joint's", {"", "--rotate-choice", *r.eviction.rotate_choice});
    }
    if (*r.eviction.rotate_choice == "on" && p.rotate == RotationKind::none) {
      throw UsageError("rotate-choice=on chooses between none and rotate=: add rotate=hadamard or random",
                       {"", "--rotate-choice", "on"});
    }
    std::get<EvictionParams>(p.mode).rotate_choice = *r.eviction.rotate_choice == "on";
  }
  if (r.eviction.cache_types) {
    if (p.eviction()->alloc != AllocMethod::joint) {
      throw UsageError("cache-types is joint's", {"", "--cache-types", *r.eviction.cache_types});
    }
    std::get<EvictionParams>(p.mode).cache_types = parse_cache_types(*r.eviction.cache_types, '/', "--cache-types");
  }
  if (p.eviction()->every > 0 && (p.quantized() || p.rotate != RotationKind::none)) {
    throw UsageError("decode-time compression cuts f16 rows: it takes no quant= or rotate=", {"", "--quant", quant});
  }
  if (p.eviction()->decoding) check_threshold_decoding(*p.eviction(), p.quantized() || p.rotate != RotationKind::none);
  return p;
}

}  // namespace

std::optional<CompressParams> resolve_method_spec(const std::string& spec) {
  const MethodInfo* m = find_method(spec);
  if (m && m->kind == MethodKind::reference) return std::nullopt;
  return resolve_params(parse_method_spec(spec));
}

std::optional<CompressParams> resolve_method_spec_for_bytes(const std::string& spec) {
  CompressRequest r = parse_method_spec(spec);
  if (r.method != "nuq" || r.calibration) return resolve_method_spec(spec);
  r.calibration = "";  // resolve_nuq's codebook_file, left empty
  return resolve_params(r);
}

CompressParams resolve_params(const CompressRequest& r) {
  check_request(r);
  if (const MethodInfo* m = find_method(r.method); m && m->kind == MethodKind::ggml && r.method.rfind("turboquant", 0) == 0) {
    return resolve_turboquant(r);
  }
  if (r.method == "ggml" || r.method == "fp8") return resolve_cache_types(r);
  if (r.ggml.any()) {
    throw UsageError("k, v, types, scale, boundary and qjl (--k, --v, --types, --scale, --boundary, --qjl, k=, v=, ...: cache types) need method ggml, fp8 "
                     "or turboquant", {"", "--method", r.method});
  }
  if (is_tiered_method(r.method)) return resolve_tiered(r);
  if (r.tiered.any()) {
    throw UsageError("tiered flags (hot, warm, cold-bits...) need a tiered method (" +
                         method_list({MethodKind::tiered}) + ")", {"", "--method", r.method});
  }
  if (is_eviction_method(r.method)) return resolve_evicting(r);
  if (r.quant || r.eviction.any()) {
    throw UsageError("eviction flags (--budget, --quant, --window...) need an eviction method (" +
                         method_list({MethodKind::eviction, MethodKind::joint}) + ")",
                     {"", "--method", r.method});
  }
  return resolve_quant(r);
}

namespace {

// UsageError `message` naming the first flag of the affine layout given (axes, group, residual,
// rule, outlier channels, pre-RoPE keys, rotation): for methods whose layout is fixed.
void refuse_layout_flags(const CompressRequest& r, const std::string& message) {
  const std::pair<bool, const char*> flags[] = {
      {r.key_axis || r.value_axis, "--key-axis/--value-axis"}, {r.group.has_value(), "--group"},
      {r.residual.has_value(), "--residual"}, {r.quant_rule.has_value(), "--quant-rule"},
      {r.outlier_fraction.has_value(), "--outlier-fraction"}, {r.pre_rope, "--pre-rope"},
      {r.rotate.has_value(), "--rotate"}, {r.rotate_seed.has_value(), "--rotate-seed"}};
  for (const auto& [given, flag] : flags) {
    if (given) throw UsageError(message, {"", flag, r.method});
  }
}

// KVQuant's nuq: every row coded at once under a calibration's codebooks, keys before RoPE.
CompressParams resolve_nuq(const CompressRequest& r) {
  refuse_layout_flags(r, "flag has no effect with nuq (its layout is KVQuant's; keys always before RoPE)");
  if (!r.calibration) {
    throw UsageError("nuq needs calibration=calib.json: the codebooks `akv calibrate` fits on dumps with key_pre_rope",
                     {"", "calibration", ""});
  }
  CompressParams p;
  p.method = Quantizer::nuq;
  p.key = {3, QuantAxis::channel, 1};
  p.value = {3, QuantAxis::token, 1};
  if (r.bits) p.key.bits = p.value.bits = static_cast<int>(*r.bits);
  if (r.bits_key) p.key.bits = static_cast<int>(*r.bits_key);
  if (r.bits_value) p.value.bits = static_cast<int>(*r.bits_value);
  p.residual = 0;
  p.pre_rope = true;
  p.codebook_file = *r.calibration;
  validate_params(p, "");
  return p;
}

CompressParams resolve_quant(const CompressRequest& r) {
  CompressParams p;
  const MethodInfo* info = find_method(r.method);
  const MethodInfo* preset = info && info->kind == MethodKind::preset ? info : nullptr;
  if (r.method == "none") {
    p.method = Quantizer::none;
  } else if (r.method == "uniform") {
    p.method = Quantizer::uniform;
    p.key = {4, QuantAxis::token, 32};
    p.value = {4, QuantAxis::token, 32};
    p.residual = 0;
  } else if (r.method == "kivi" || preset) {
    p.method = Quantizer::kivi;
  } else if (r.method == "nuq") {
    return resolve_nuq(r);
  } else {
    throw InvalidInput("unknown method (expected " + method_list() + ")", {"", "--method", r.method});
  }
  auto refuse = [&](bool given, const char* flag) {
    if (given) throw UsageError("flag has no effect with this method", {"", flag, r.method});
  };
  if (p.method == Quantizer::none) {
    refuse(r.bits || r.bits_key || r.bits_value, "--bits");
    refuse_layout_flags(r, "flag has no effect with this method");
    p.residual = 0;
    return p;
  }
  if (preset) {
    refuse(r.bits || r.bits_key || r.bits_value, "--bits");
    p.preset = preset->name;
    p.key.bits = preset->bits_key;
    p.value.bits = preset->bits_value;
  }
  if (p.method == Quantizer::uniform) {
    refuse(r.bits_key || r.bits_value, "--bits-key/--bits-value (uniform takes --bits)");
    refuse(r.residual.has_value(), "--residual");
  }
  if (r.bits) p.key.bits = p.value.bits = static_cast<int>(*r.bits);
  if (r.bits_key) p.key.bits = static_cast<int>(*r.bits_key);
  if (r.bits_value) p.value.bits = static_cast<int>(*r.bits_value);
  if (r.key_axis) p.key.axis = parse_quant_axis(*r.key_axis);
  if (r.value_axis) p.value.axis = parse_quant_axis(*r.value_axis);
  if (r.group) p.key.group = p.value.group = static_cast<std::size_t>(*r.group);
  if (r.residual) p.residual = static_cast<std::size_t>(*r.residual);
  if (r.quant_rule) p.rule = parse_quant_rule(*r.quant_rule);
  if (r.outlier_fraction) p.outlier_fraction = *r.outlier_fraction;
  p.pre_rope = r.pre_rope;
  apply_rotation(p, r);
  if (r.calibration) {
    if (p.method != Quantizer::kivi) {
      throw UsageError("--calibration applies per-head bits to the kivi layout", {"", "--method", r.method});
    }
    refuse(r.bits || r.bits_key || r.bits_value, "--bits (the calibration sets them)");
    p.calibration_file = *r.calibration;  // read against the dump's shape by compress_dump
  }
  validate_params(p, "");
  return p;
}

}  // namespace

CompressParams CompressParams::for_head(std::size_t layer, std::size_t head, std::size_t n_kv_heads) const {
  CompressParams p;  // everything but the per-head table (copying it for every head is quadratic)
  static_cast<QuantParams&>(p) = *this;
  p.preset = preset;
  p.mode = mode;
  p.calibration_file = calibration_file;
  p.codebook_file = codebook_file;
  p.codebooks = codebooks;
  if (method == Quantizer::nuq && codebooks) {
    const NuqCalibration& k = codebooks->key.at(layer);
    const std::size_t d = k.upper.size() / n_kv_heads;
    p.nuq_key = std::make_shared<const NuqTable>(nuq_table(k, codebooks->sparsity, codebooks->sink, head * d, d));
    p.nuq_value = std::make_shared<const NuqTable>(nuq_table(codebooks->value.at(layer), codebooks->sparsity, codebooks->sink, 0, 0));
  }
  if (const GgmlCacheParams* g = ggml(); g && !g->head_types.empty()) {  // this head's types
    GgmlCacheParams one = *g;
    one.key = g->head_types.at(layer * n_kv_heads + head).first;
    one.value = g->head_types.at(layer * n_kv_heads + head).second;
    one.types.clear();
    one.head_types.clear();
    p.mode = one;
  }
  if (!head_rotate.empty()) p.rotate = head_rotate.at(layer * n_kv_heads + head);
  if (!head_bits.empty()) {
    const auto& b = head_bits.at(layer * n_kv_heads + head);
    if (b.first == 16) {  // joint allocation chose f16 for this head
      p.method = Quantizer::none;
      p.residual = 0;
      return p;
    }
    p.key.bits = b.first;
    p.value.bits = b.second;
  }
  if (!head_tensor_types.empty()) {
    p.key.type = head_tensor_types.at(layer * n_kv_heads + head).first;
    p.value.type = head_tensor_types.at(layer * n_kv_heads + head).second;
  }
  return p;
}

nlohmann::json CompressParams::to_json() const {
  nlohmann::json j;
  j["method"] = quantizer_name(method);
  j["preset"] = preset;
  auto tensor = [](const TensorQuant& t) {
    return nlohmann::json{{"bits", t.bits}, {"axis", quant_axis_name(t.axis)}, {"group", t.group}};
  };
  if (quantized()) {
    j["key"] = tensor(key);
    j["value"] = tensor(value);
    j["outlier_fraction"] = outlier_fraction;
    j["pre_rope"] = pre_rope;
    j["quant_rule"] = quant_rule_name(rule);
  }
  j["residual"] = residual;
  if (rotate != RotationKind::none) {
    j["rotate"] = rotation_name(rotate);
    j["rotate_seed"] = rotate_seed;
  }
  j["scale_dtype"] = "f16";
  j["eviction"] = eviction() ? eviction()->to_json() : nlohmann::json(nullptr);
  if (tiered()) {
    j["method"] = "tiered";
    j["tiered"] = tiered()->to_json();
  }
  if (ggml()) {
    j["method"] = "ggml";
    j["ggml"] = ggml()->to_json();
  }
  if (!head_bits.empty()) {
    j["head_bits"] = head_bits;
    j["calibration"] = calibration_file;
  }
  if (!head_rotate.empty()) {
    std::vector<std::string> names;
    for (const RotationKind r : head_rotate) names.push_back(rotation_name(r));
    j["head_rotate"] = names;
  }
  if (!head_tensor_types.empty()) j["head_tensor_types"] = head_tensor_types;
  if (method == Quantizer::nuq) j["calibration"] = codebook_file;
  return j;
}

namespace {

// params.head_tensor_types (CompressParams::head_tensor_types): beside head_bits, a type name
// exactly where the bits are 0.
void read_head_tensor_types(const nlohmann::json& j, const std::string& file, CompressParams& p) {
  if (j.contains("head_tensor_types")) {
    const nlohmann::json& ht = j["head_tensor_types"];
    if (!ht.is_array() || ht.size() != p.head_bits.size()) {
      throw CorruptData("head_tensor_types is not a list as long as head_bits", {file, "params.head_tensor_types"});
    }
    for (std::size_t i = 0; i < ht.size(); ++i) {
      const std::string at = "params.head_tensor_types[" + std::to_string(i) + "]";
      if (!(ht[i].is_array() && ht[i].size() == 2 && ht[i][0].is_string() && ht[i][1].is_string())) {
        throw CorruptData("head_tensor_types entries are [key type, value type]", {file, at, ht[i].dump().substr(0, 40)});
      }
      p.head_tensor_types.emplace_back(ht[i][0].get<std::string>(), ht[i][1].get<std::string>());
    }
  }
  for (std::size_t i = 0; i < p.head_bits.size(); ++i) {
    const std::string at = "params.head_tensor_types[" + std::to_string(i) + "]";
    const std::pair<int, int> b = p.head_bits[i];
    const std::pair<std::string, std::string> none;
    const auto& t = p.head_tensor_types.empty() ? none : p.head_tensor_types[i];
    if ((b.first == 0) != !t.first.empty() || (b.second == 0) != !t.second.empty()) {
      throw CorruptData("a head's tensor has bits 0 exactly when it has a cache type",
                        {file, at, "[" + t.first + ", " + t.second + "]"});
    }
    if (!t.first.empty()) parse_head_type(t.first, file, at + "[0]");
    if (!t.second.empty()) parse_head_type(t.second, file, at + "[1]");
  }
}

// params.method (and what each method records beside it: nuq's calibration, tiered's and ggml's
// own fields) into p.method / p.codebook_file / p.mode.
void read_method(const nlohmann::json& j, const std::string& file, CompressParams& p) {
  const std::string m = j.at("method").get<std::string>();
  if (m == "none") {
    p.method = Quantizer::none;
  } else if (m == "uniform") {
    p.method = Quantizer::uniform;
  } else if (m == "kivi") {
    p.method = Quantizer::kivi;
  } else if (m == "nuq") {
    p.method = Quantizer::nuq;
    p.codebook_file = j.at("calibration").get<std::string>();
  } else if (m == "tiered") {
    p.method = Quantizer::kivi;
    p.mode = TieredParams::from_json(j.at("tiered"), file);
  } else if (m == "ggml") {
    p.method = Quantizer::none;
    p.mode = GgmlCacheParams::from_json(j.at("ggml"), file);
  } else {
    throw InvalidInput("unknown method", {file, "params.method", m});
  }
}

// A quantized method's key / value settings, outlier fraction, pre-RoPE flag and rule.
void read_quantizer(const nlohmann::json& j, const std::string& file, CompressParams& p) {
  auto tensor = [&](const nlohmann::json& t, const std::string& at) {
    return TensorQuant{static_cast<int>(file_integer(t, "bits", "bits", file, at + ".bits")),
                       parse_quant_axis(t.at("axis").get<std::string>()),
                       static_cast<std::size_t>(file_integer(t, "group", "group", file, at + ".group"))};
  };
  p.key = tensor(j.at("key"), "params.key");
  p.value = tensor(j.at("value"), "params.value");
  p.outlier_fraction = file_real(j, "outlier_fraction", "outlier-fraction", file, "params.outlier_fraction");
  p.pre_rope = j.at("pre_rope").get<bool>();
  // Files written before the kivi rule existed were quantized with the bounded rule.
  p.rule = j.contains("quant_rule") ? parse_quant_rule(j.at("quant_rule").get<std::string>()) : QuantRule::bounded;
}

// params.head_bits (per-head [key bits, value bits]) and the calibration file they came from.
void read_head_bits(const nlohmann::json& j, const std::string& file, CompressParams& p) {
  const nlohmann::json& hb = j["head_bits"];
  if (!hb.is_array()) throw CorruptData("head_bits is not a list", {file, "params.head_bits"});
  for (std::size_t i = 0; i < hb.size(); ++i) {
    const nlohmann::json& e = hb[i];
    const auto bits_ok = [](const nlohmann::json& b) {
      return b.is_number_integer() && (b.get<long long>() == 16 || b.get<long long>() == 2 || b.get<long long>() == 3 ||
                                       b.get<long long>() == 4 || b.get<long long>() == 8 || b.get<long long>() == 0);
    };
    if (!(e.is_array() && e.size() == 2 && bits_ok(e[0]) && bits_ok(e[1]))) {
      throw CorruptData("head_bits entries are [key bits, value bits], each 2, 3, 4, 8 or 16 (0: a cache type)",
                        {file, "params.head_bits[" + std::to_string(i) + "]", e.dump().substr(0, 40)});
    }
    p.head_bits.emplace_back(e[0].get<int>(), e[1].get<int>());
  }
  p.calibration_file = j.value("calibration", "");
}

// params.head_rotate: one rotation name per head, as many as head_bits when both are given.
void read_head_rotate(const nlohmann::json& j, const std::string& file, CompressParams& p) {
  const nlohmann::json& hr = j["head_rotate"];
  if (!hr.is_array()) throw CorruptData("head_rotate is not a list", {file, "params.head_rotate"});
  for (std::size_t i = 0; i < hr.size(); ++i) {
    const std::string at = "params.head_rotate[" + std::to_string(i) + "]";
    if (!hr[i].is_string()) throw CorruptData("head_rotate entries are rotation names", {file, at, hr[i].dump().substr(0, 40)});
    p.head_rotate.push_back(parse_rotation(hr[i].get<std::string>(), file, at));
  }
  if (!p.head_bits.empty() && p.head_rotate.size() != p.head_bits.size()) {
    throw CorruptData("head_rotate and head_bits of different lengths", {file, "params.head_rotate", std::to_string(hr.size())});
  }
}

}  // namespace

CompressParams CompressParams::from_json(const nlohmann::json& j, const std::string& file) {
  CompressParams p;
  try {
    read_method(j, file, p);
    p.preset = j.value("preset", "");
    p.residual = static_cast<std::size_t>(file_integer(j, "residual", "residual", file, "params.residual"));
    if (j.contains("rotate")) {
      p.rotate = parse_rotation(j.at("rotate").get<std::string>(), file, "params.rotate");
      p.rotate_seed = static_cast<std::uint64_t>(file_integer(j, "rotate_seed", "rotate-seed", file, "params.rotate_seed"));
    }
    if (p.quantized()) read_quantizer(j, file, p);
    if (j.contains("head_bits")) read_head_bits(j, file, p);
    if (j.contains("head_rotate")) read_head_rotate(j, file, p);
    read_head_tensor_types(j, file, p);
    if (j.contains("eviction") && !j["eviction"].is_null()) {
      if (p.tiered()) throw CorruptData("a tiered cache records no eviction", {file, "params.eviction"});
      p.mode = EvictionParams::from_json(j["eviction"], file);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(std::string("bad compression parameters: ") + e.what(), {file, "params"});
  } catch (const CorruptData&) {
    throw;
  } catch (const Error& e) {
    throw CorruptData(e.what(), {file, "params"});
  }
  validate_params(p, file);
  return p;
}

}  // namespace akv
