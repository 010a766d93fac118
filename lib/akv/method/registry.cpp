#include "akv/method/registry.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "akv/core/errors.h"
#include "akv/method/ggml_params.h"

namespace akv {
namespace {

using P = ParamInfo;
using S = ParamScope;
const std::vector<long long> kBits = {2, 3, 4, 8};

std::vector<std::string> score_words() {
  std::vector<std::string> w;
  const std::string list = score_method_list(",");
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    w.push_back(list.substr(at, end - at));
    at = end + 1;
  }
  return w;
}

}  // namespace

namespace {

MethodInfo preset(const char* name, const char* help, int bits_key, int bits_value) {
  MethodInfo m{name, MethodKind::preset, help};
  m.bits_key = bits_key;
  m.bits_value = bits_value;
  return m;
}

MethodInfo eviction(const char* name, const char* help, ScoreMethod score, AllocMethod alloc, std::size_t sinks = 0,
                    double alpha = 0.2) {
  MethodInfo m{name, alloc == AllocMethod::joint ? MethodKind::joint : MethodKind::eviction, help};
  m.score = score;
  m.alloc = alloc;
  m.sinks = sinks;
  m.alpha = alpha;
  return m;
}

// A CriticalKV row (kvpress's CriticalKVPress / CriticalAdaKVPress over SnapKV's scores).
MethodInfo critical(const char* name, const char* help, AllocMethod alloc, CapacityRule rule) {
  MethodInfo m = eviction(name, help, ScoreMethod::snapkv, alloc);
  m.capacity_rule = rule;
  m.critical = true;
  return m;
}

// DuoAttention's row: kvzip head scores, 128 sinks and 256 recent tokens (DuoAttention's released
// patterns, kvpress's on-the-fly default).
MethodInfo duo(const char* name, const char* help) {
  MethodInfo m = eviction(name, help, ScoreMethod::kvzip, AllocMethod::duo, 128);
  m.window = 256;
  return m;
}

MethodInfo tier_preset(const char* name, const char* help, int bits, std::size_t hot) {
  MethodInfo m{name, MethodKind::tiered, help};
  m.bits_key = m.bits_value = bits;
  m.hot = hot;
  return m;
}

// A TurboQuant row (kind ggml: its caches are ggml rows): the key and value bits it stores by default.
MethodInfo turboquant(const char* name, const char* help, int bits_key, int bits_value) {
  MethodInfo m{name, MethodKind::ggml, help};
  m.bits_key = bits_key;
  m.bits_value = bits_value;
  return m;
}

}  // namespace

const std::vector<MethodInfo>& method_registry() {
  using K = MethodKind;
  using Sc = ScoreMethod;
  using A = AllocMethod;
  static const std::vector<MethodInfo> methods = {
      {"none", K::quantizer, "f16 copy of K and V: the baseline every ratio is measured against"},
      {"uniform", K::quantizer, "one bit width for K and V, per-token groups, no residual window"},
      {"kivi", K::quantizer, "KIVI: keys per channel, values per token, the last R tokens in f16"},
      {"nuq", K::quantizer,
       "KVQuant: non-uniform levels per layer fitted by `akv calibrate` (calibration=calib.json), keys before "
       "RoPE normalized per channel, values per token, ~1% outliers and the first token kept exact; bits 2, 3, "
       "4 or 8 (default 3)"},
      preset("kivi-2", "kivi with 2-bit keys and values", 2, 2),
      preset("kivi-4", "kivi with 4-bit keys and values", 4, 4),
      preset("k4v2", "kivi with 4-bit keys, 2-bit values", 4, 2),
      preset("k4v3", "kivi with 4-bit keys, 3-bit values", 4, 3),
      eviction("snapkv", "SnapKV: window attention, pooled, the same budget per head", Sc::snapkv, A::uniform),
      eviction("h2o", "H2O: accumulated attention of every query (streaming in decode)", Sc::h2o, A::uniform),
      eviction("streamingllm", "StreamingLLM: 4 sinks and the most recent tokens", Sc::streamingllm, A::uniform, 4),
      eviction("knorm", "key norm (kvpress KnormPress): the keys of smallest norm kept; reads no queries", Sc::knorm,
               A::uniform),
      eviction("keydiff", "KeyDiff: the keys least like the mean key direction kept; reads no queries", Sc::keydiff,
               A::uniform),
      eviction("tova", "TOVA: the last query's attention averaged over every head of the layer", Sc::tova,
               A::uniform),
      eviction("lagkv",
               "LagKV: each partition of lag tokens scored by the spread of its keys and values against the "
               "next partition's ranges; 4 sinks; reads no queries", Sc::lagkv, A::uniform, 4),
      eviction("expected-attention",
               "Expected Attention (kvpress): attention expected of future queries (a Gaussian fitted to the "
               "prompt's queries, RoPE of the next positions) times |v|; 4 sinks; reads no window",
               Sc::expected_attention, A::uniform, 4),
      eviction("kvzip",
               "KVzip: the most attention each token receives while the model reconstructs its context "
               "(a second prefill per 2048-token chunk); the lowest over every head of every layer evicted "
               "(adakv-global, alpha 0); 4 sinks; evaluate --model only",
               Sc::kvzip, A::adakv_global, 4, 0.0),
      eviction("kvzap",
               "KVzap (kvpress KVzapPress, linear): each token scored by a linear map of its attention input "
               "fitted to log KVzip+ scores by `akv calibrate` (surrogate=calib.json); the lowest over every "
               "head of every layer evicted (adakv-global, alpha 0); 4 sinks; evaluate --model, or dumps with "
               "attention inputs (akv dump --kvzap)",
               Sc::kvzap, A::adakv_global, 4, 0.0),
      eviction("qfilter",
               "Q-Filters (kvpress QFilterPress): each key scored by its projection on the principal direction of "
               "the model's queries, fitted by `akv calibrate` (qfilters=calib.json); reads no queries",
               Sc::qfilter, A::uniform),
      eviction("adakv", "Ada-KV: SnapKV scores, head-wise budgets within each layer", Sc::snapkv, A::adakv),
      eviction("waterfill", "greedy marginal-utility water-filling across the heads of a layer", Sc::snapkv,
               A::waterfill),
      eviction("pyramid", "PyramidKV: budgets decreasing from the first layer to the last", Sc::snapkv, A::pyramid),
      eviction("adakv-pyramid", "PyramidKV layer budgets spread over heads by Ada-KV", Sc::snapkv, A::adakv_pyramid),
      eviction("adakv-global", "Ada-KV across all heads of all layers", Sc::snapkv, A::adakv_global),
      critical("critical-snapkv",
               "CriticalKV (kvpress CriticalKVPress): SnapKV; each head keeps its best-scored half of the "
               "budget, then the best by (score + 1e-4) x |W_o v|_1; needs the output projection (a dump's "
               "o_proj, or the model)",
               A::uniform, CapacityRule::official),
      critical("critical-adakv",
               "CriticalAdaKV (kvpress CriticalAdaKVPress): Ada-KV budgets by kvpress's rule, then "
               "critical-snapkv's two stages in each head",
               A::adakv, CapacityRule::kvpress),
      duo("duo",
          "DuoAttention's head split: the best-scored heads (KVzip's head-level score: a head's largest token "
          "score) keep every token, the others 128 sinks + the 256 most recent; the budget sets how many heads "
          "keep all; score= ranks heads by another score; evaluate --model only with kvzip"),
      eviction("joint",
               "tokens and key/value bits per head under one byte budget (--budget as a fraction of f16; "
               "needs --quant kivi, or a budgets file from `akv allocate --method joint`)",
               Sc::snapkv, A::joint),
      {"tiered", K::tiered, "hot f16 / warm quantized / cold int2 tiers (preset= picks the budgets)"},
      tier_preset("quality", "tiered: 256 hot tokens, 4-bit warm", 4, 256),
      tier_preset("balanced", "tiered: 128 hot tokens, 3-bit warm", 3, 128),
      tier_preset("compact", "tiered: 64 hot tokens, 2-bit warm", 2, 64),
      {"ggml", K::ggml, "llama.cpp's KV cache types: every K and V row in ggml blocks of type k= / v= (as -ctk / -ctv)"},
      {"fp8", K::ggml, "vLLM's fp8 KV cache: every K and V value an 8-bit float, k= / v= e4m3 (default) or e5m2, "
                       "x / scale with one f32 scale per tensor (scale=)"},
      turboquant("turboquant",
                 "vLLM's TurboQuant KV cache: keys Hadamard-rotated, normalized and rounded to Lloyd-Max levels "
                 "(bits-key 2-4, norm-corrected; 8: fp8 e4m3, unrotated), values uniform per row (bits-value 2-4); "
                 "default 3 / 4",
                 3, 4),
      turboquant("turboquant_k8v4", "TurboQuant preset: fp8 keys, 4-bit values (vLLM's turboquant_k8v4)", 8, 4),
      turboquant("turboquant_4bit_nc", "TurboQuant preset: 4-bit keys, 4-bit values (vLLM's turboquant_4bit_nc)", 4, 4),
      turboquant("turboquant_k3v4_nc", "TurboQuant preset: 3-bit keys, 4-bit values (vLLM's turboquant_k3v4_nc)", 3, 4),
      turboquant("turboquant_3bit_nc", "TurboQuant preset: 3-bit keys, 3-bit values (vLLM's turboquant_3bit_nc)", 3, 3),
      {kFullMethod, K::reference, "f32 K/V exactly as the model computed them: the reference of every model-run metric"},
  };
  return methods;
}

const MethodInfo* find_method(const std::string& name) {
  for (const MethodInfo& m : method_registry()) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

std::string method_list(std::initializer_list<MethodKind> kinds) {
  std::string out;
  for (const MethodInfo& m : method_registry()) {
    bool wanted = kinds.size() == 0 && m.kind != MethodKind::reference;
    for (MethodKind k : kinds) wanted = wanted || k == m.kind;
    if (wanted) out += (out.empty() ? "" : ", ") + std::string(m.name);
  }
  return out;
}

const std::vector<ParamInfo>& param_registry() {
  static const std::vector<ParamInfo> params = {
      // Quantization (quantizers, presets, and what an eviction method keeps).
      {"bits", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.bits; }),
       "key and value bits (uniform default 4, kivi default 2)", {}, {}, false, false, kBits, {}},
      {"bits-key", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.bits_key; }),
       "key bits (kivi)", {}, {}, false, false, kBits, {}},
      {"bits-value", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.bits_value; }),
       "value bits (kivi)", {}, {}, false, false, kBits, {}},
      {"key-axis", S::quant, P::Text([](CompressRequest& r) -> auto& { return r.key_axis; }),
       "key groups run along: channel (G tokens of one channel; kivi default) or token (G channels "
       "of one token; uniform default)", {}, {}, false, false, {}, {"channel", "token"}},
      {"value-axis", S::quant, P::Text([](CompressRequest& r) -> auto& { return r.value_axis; }),
       "value groups run along: token (default) or channel", {}, {}, false, false, {}, {"token", "channel"}},
      {"group", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.group; }),
       "group size G (default 32)", 1, {}, false, false, {}, {}},
      {"residual", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.residual; }),
       "residual window R: most recent tokens kept in f16 (kivi, default 128, a multiple of G)", 0, {},
       false, false, {}, {}},
      {"quant-rule", S::quant, P::Text([](CompressRequest& r) -> auto& { return r.quant_rule; }),
       "group parameters, codes and key residual: kivi = as KIVI's code (fp16 arithmetic rounded to "
       "nearest; the newest T mod R keys in f16; default), bounded = directed f16 rounding, every value "
       "within scale/2 (the newest R to R + G - 1 keys in f16)",
       {}, {}, false, false, {}, {"kivi", "bounded"}},
      {"outlier-fraction", S::quant, P::Real([](CompressRequest& r) -> auto& { return r.outlier_fraction; }),
       "keep ceil(f * head_dim) key channels per head (largest variance) in f16 (default 0)", 0, 1,
       false, true, {}, {}},
      {"pre-rope", S::quant, P::Flag([](CompressRequest& r) -> auto& { return r.pre_rope; }),
       "quantize keys before RoPE (KVQuant; needs key_pre_rope in the dump); RoPE is applied after "
       "dequantization", {}, {}, false, false, {}, {}},
      {"rotate", S::quant, P::Text([](CompressRequest& r) -> auto& { return r.rotate; }),
       "rotate each key and value row before quantization: hadamard = normalized Walsh-Hadamard blocks "
       "(keys: the largest power of two dividing head_dim, values: at most 64 channels; llama.cpp's "
       "rotation), random = the same after random signs (rotate-seed); the query is rotated once per "
       "step, the attention output rotated back; with ggml only block types rotate (default none)",
       {}, {}, false, false, {}, {"none", "hadamard", "random"}},
      {"rotate-seed", S::quant, P::Integer([](CompressRequest& r) -> auto& { return r.rotate_seed; }),
       "seed of rotate=random's signs (default 0)", 0, {}, false, false, {}, {}},
      {"calibration", S::quant, P::Text([](CompressRequest& r) -> auto& { return r.calibration; }),
       "a calibration file from `akv calibrate -o calib.json`: per-head key/value bits (kivi layout; replaces "
       "bits), fp8's scales, or nuq's codebooks (bits picks them); - = standard input", {}, {},
       false, false, {}, {}},
      // Eviction.
      {"quant", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.quant; }),
       "quantize the kept tokens with this quantizer or preset (default none = f16); the quantization "
       "flags apply to it", {}, {}, false, false, {}, {}},
      {"budget", S::eviction, P::Real([](CompressRequest& r) -> auto& { return r.eviction.budget; }),
       "budget as a fraction of the tokens: round(f * n_tokens) tokens per KV head on average, window "
       "and sinks included", 0, 1, true, false, {}, {}},
      {"budget-tokens", S::eviction,
       P::Integer([](CompressRequest& r) -> auto& { return r.eviction.budget_tokens; }),
       "budget as tokens per KV head on average (window and sinks included)", 0, {}, false, false, {}, {}},
      {"budgets", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.budgets_file; }),
       "per-head budgets from `akv allocate -o` (its scoring settings are used; implies its method when "
       "no method is named; - = standard input)", {}, {}, false, false, {}, {}},
      {"score", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.score; }),
       "token scores the allocator ranks (default the method's: snapkv for adakv, waterfill, pyramid, "
       "adakv-pyramid, adakv-global); not with joint", {}, {}, false, false, {}, score_words()},
      {"window", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.window; }),
       "observation window W: the last W query positions score the tokens and the last W tokens are "
       "always kept (default 32; tova 1; knorm, keydiff, lagkv, expected-attention, kvzip, kvzap, qfilter 0; <= the dump's "
       "n_query for the scores that read queries)", 0, {},
       false, false, {}, {}},
      {"sinks", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.sinks; }),
       "first tokens always kept (default 4 for streamingllm, lagkv, expected-attention, kvzip and kvzap, 0 otherwise)", 0, {}, false,
       false, {}, {}},
      {"future", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.future; }),
       "expected-attention: future positions whose RoPE rotation is averaged (default 512)", 1, {}, false, false,
       {}, {}},
      {"covariance", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.covariance; }),
       "expected-attention: the queries' covariance term (default on)", {}, {}, false, false, {}, {"on", "off"}},
      {"lag", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.lag; }),
       "lagkv: partition size in tokens (default 128)", 1, {}, false, false, {}, {}},
      {"vnorm", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.vnorm; }),
       "expected-attention: scores times the value norm (default on)", {}, {}, false, false, {}, {"on", "off"}},
      {"plus", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.plus; }),
       "kvzip: KVzip+'s normalization (kvpress kvzip_plus_normalization; default off): each repeat query's "
       "attention divided by the norm of its attention input, each token's multiplied by |W_o v|_2 of the query head",
       {}, {}, false, false, {}, {"on", "off"}},
      {"qfilters", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.qfilters; }),
       "qfilter: the calibration file (`akv calibrate -o calib.json`, from dumps of the same model) holding each "
       "KV head's filter", {}, {}, false, false, {}, {}},
      {"surrogate", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.surrogate; }),
       "kvzap: the calibration file (`akv calibrate -o calib.json` on dumps of the same model written with "
       "`akv dump --kvzap`) holding each layer's linear surrogate", {}, {}, false, false, {}, {}},
      {"heads", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.duo_heads; }),
       "duo: a calibration file (`akv calibrate` on dumps of the same model longer than its duo sinks + window, "
       "e.g. passkey prompts) whose per-head attention error as a streaming head ranks the heads, a fixed "
       "pattern as DuoAttention's (no score=; token scores are then knorm's, for the report only)",
       {}, {}, false, false, {}, {}},
      {"critical", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.critical; }),
       "CriticalKV's two stages under any score and allocator (default off; on for critical-snapkv, critical-adakv): "
       "each head keeps its best-scored first-stage share of its budget, the rest by (score + 1e-4) x the L1 norm "
       "of W_o v averaged over the group; needs the attention output projection (a dump's /layers/L/o_proj, or "
       "evaluate --model); not with joint, h2o, streamingllm, --prefill-mode chunked or every=",
       {}, {}, false, false, {}, {"on", "off"}},
      {"first-stage", S::eviction, P::Real([](CompressRequest& r) -> auto& { return r.eviction.first_stage; }),
       "CriticalKV: the share of each head's budget (forced tokens included) kept by score alone (default 0.5)",
       0, 1, false, false, {}, {}},
      {"every", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.every; }),
       "decode-time compression (with target=; akv evaluate --model only): every N decoded tokens each KV head "
       "is cut back to target tokens, scored with the last W decode queries (kvpress's DecodingPress); snapkv, "
       "knorm, keydiff, lagkv or qfilter scores, uniform or adakv allocation, no quant=",
       1, {}, false, false, {}, {}},
      {"target", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.target; }),
       "decode-time compression: tokens per KV head after each cut (on average with adakv; sinks and window "
       "included)", 1, {}, false, false, {}, {}},
      {"threshold", S::eviction, P::Real([](CompressRequest& r) -> auto& { return r.eviction.threshold; }),
       "keep every token whose score is at least T instead of a budget (kvpress's DMSPress): each head keeps "
       "as many as pass, so the compression ratio follows the content; sinks and the last window= tokens "
       "kept (kvpress's sliding window: window=128:sinks=0); no budget=, allocator flags, critical=on or every=",
       {}, {}, false, false, {}, {}},
      {"decoding", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.decoding; }),
       "threshold=: also while decoding (DMSPress's decoding=True; the model's decode loop: evaluate --model, bench decode): each decoded "
       "token is scored when appended and evicted if below the threshold once window= newer tokens follow it; "
       "knorm, qfilter or kvzap scores, no quant= (default off)",
       {}, {}, false, false, {}, {"on", "off"}},
      {"rotate-choice", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.rotate_choice; }),
       "joint with rotate=hadamard or random: each head also chooses, by its measured error, between its "
       "quantizer unrotated and rotated (default off: every head rotated as rotate= says)",
       {}, {}, false, false, {}, {"on", "off"}},
      {"cache-types", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.cache_types; }),
       "joint: cache types each head's key and value may also be stored as, separated by / (q4_0/fp8_e4m3/"
       "tq3+hadamard: llama.cpp types, fp8, TurboQuant, each with an optional +hadamard or +random; a bare type "
       "rotated as rotate= says), chosen per tensor beside the kivi bits by measured error under the byte budget",
       {}, {}, false, false, {}, {}},
      {"pool", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.pool; }),
       "SnapKV pooling over tokens (default max)", {}, {}, false, false, {}, {"max", "avg"}},
      {"kernel", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.kernel; }),
       "SnapKV pooling kernel, odd (default 7; 1 = none)", 0, {}, false, false, {}, {}},
      {"gqa-reduce", S::eviction, P::Text([](CompressRequest& r) -> auto& { return r.eviction.gqa_reduce; }),
       "combine the scores of a KV group's query heads (default mean)", {}, {}, false, false, {}, {"mean", "max"}},
      {"alpha", S::eviction, P::Real([](CompressRequest& r) -> auto& { return r.eviction.alpha; }),
       "Ada-KV floor fraction (default 0.2)", 0, 1, false, false, {}, {}},
      {"capacity-rule", S::eviction,
       P::Text([](CompressRequest& r) -> auto& { return r.eviction.capacity_rule; }),
       "Ada-KV head and PyramidKV layer budgets: official = as the official code (Ada-KV: round(count "
       "(1 - alpha) + int(alpha base)) per head; PyramidKV: integer step; default), exact-total = largest "
       "remainder so the budget is met exactly, kvpress = Ada-KV as kvpress's AdaKVPress (each head's "
       "int(alpha kept) best protected, the rest by the best scores of all heads; PyramidKV as official)",
       {}, {}, false, false, {}, {"official", "exact-total", "kvpress"}},
      {"beta", S::eviction, P::Real([](CompressRequest& r) -> auto& { return r.eviction.beta; }),
       "PyramidKV beta (default 20)", {}, {}, false, false, {}, {}},
      {"min-tokens", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.min_tokens; }),
       "water-filling: selectable tokens every head starts with (default 0)", 0, {}, false, false, {}, {}},
      {"step", S::eviction, P::Integer([](CompressRequest& r) -> auto& { return r.eviction.step; }),
       "water-filling: tokens awarded per step (default 1)", 1, {}, false, false, {}, {}},
      // The tiered cache.
      {"preset", S::tiered, P::Text([](CompressRequest& r) -> auto& { return r.tiered.preset; }),
       "quality | balanced | compact | k4v2 | k4v3 (with method tiered)", {}, {}, false, false, {}, {}},
      {"hot", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.hot; }),
       "hot (f16) budget in tokens", 0, {}, false, false, {}, {}},
      {"warm", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.warm; }),
       "warm budget in tokens (multiple of 32; default unlimited)", 0, {}, false, false, {}, {}},
      {"warm-bits-key", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.warm_bits_key; }),
       "warm key bits", {}, {}, false, false, kBits, {}},
      {"warm-bits-value", S::tiered,
       P::Integer([](CompressRequest& r) -> auto& { return r.tiered.warm_bits_value; }), "warm value bits", {}, {},
       false, false, kBits, {}},
      {"cold-bits", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.cold_bits; }),
       "cold bits (16 = exact f16 copies on the host)", {}, {}, false, false, {2, 3, 4, 8, 16}, {}},
      {"protect-first", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.protect_first; }),
       "first positions kept hot (default 4)", 0, {}, false, false, {}, {}},
      {"protect-last", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.protect_last; }),
       "last positions kept hot (default 32; compact 0)", 0, {}, false, false, {}, {}},
      {"anchors", S::tiered, P::Integer([](CompressRequest& r) -> auto& { return r.tiered.anchors; }),
       "most important older tokens kept hot (whole blocks)", 0, {}, false, false, {}, {}},
      {"decay", S::tiered, P::Real([](CompressRequest& r) -> auto& { return r.tiered.decay; }),
       "importance decay per step (default 0.95)", 0, 1, false, false, {}, {}},
      {"w-attn", S::tiered, P::Real([](CompressRequest& r) -> auto& { return r.tiered.w_attn; }),
       "weight of the attention received (default 1)", {}, {}, false, false, {}, {}},
      {"w-recency", S::tiered, P::Real([](CompressRequest& r) -> auto& { return r.tiered.w_recency; }),
       "weight of the recency bonus 1/(1+age) (default 0)", {}, {}, false, false, {}, {}},
      {"margin", S::tiered, P::Real([](CompressRequest& r) -> auto& { return r.tiered.margin; }),
       "relative score margin a promotion needs (default 0.25)", 0, {}, false, false, {}, {}},
      {"demotion", S::tiered, P::Text([](CompressRequest& r) -> auto& { return r.tiered.demotion; }),
       "which hot block leaves first (default importance)", {}, {}, false, false, {}, {"importance", "fifo"}},
      // llama.cpp cache types.
      {"k", S::ggml, P::Text([](CompressRequest& r) -> auto& { return r.ggml.k; }),
       "key cache type, as llama.cpp's -ctk (default f16; fp8: e4m3), or vLLM's fp8 (e4m3 = fp8_e4m3, e5m2 = fp8_e5m2)",
       {}, {}, false, false, {}, ggml_cache_type_words()},
      {"v", S::ggml, P::Text([](CompressRequest& r) -> auto& { return r.ggml.v; }),
       "value cache type, as llama.cpp's -ctv (default f16; fp8: e4m3), or vLLM's fp8 (e4m3 = fp8_e4m3, e5m2 = fp8_e5m2)",
       {}, {}, false, false, {}, ggml_cache_type_words()},
      {"boundary", S::ggml, P::Integer([](CompressRequest& r) -> auto& { return r.ggml.boundary; }),
       "turboquant: the first and last N layers (at most half each side) keep f16 K and V, as vLLM's boundary "
       "protection (default 2; 0: every layer quantized)",
       0, 100000, false, false, {}, {}},
      {"types", S::ggml, P::Text([](CompressRequest& r) -> auto& { return r.ggml.types; }),
       "each KV head's key and value cache types from an `akv calibrate --types` file (its "
       "layers[].heads[].ggml_types; instead of k= and v=; the file's rotate must be the cache's)",
       {}, {}, false, false, {}, {}},
      {"qjl", S::ggml, P::Text([](CompressRequest& r) -> auto& { return r.ggml.qjl; }),
       "turboquant: keys as TurboQuant_prod, bits-key - 1 bits of Lloyd-Max levels plus a 1-bit QJL sketch of the "
       "residual (signs of S r, S Gaussian d x d) and its f16 norm, instead of bits-key levels with norm correction "
       "(default off)",
       {}, {}, false, false, {}, {"on", "off"}},
      {"scale", S::ggml, P::Text([](CompressRequest& r) -> auto& { return r.ggml.scale; }),
       "fp8 tensors' f32 scale: head (per KV head's K and V, max |x| / fp8 max over the prompt's rows), tensor "
       "(per layer's K and V, over its KV heads), one (1, vLLM's default without calibrated scales); default head",
       {}, {}, false, false, {}, fp8_scale_names()},
  };
  return params;
}

const ParamInfo* find_param(const std::string& name) {
  for (const ParamInfo& p : param_registry()) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

std::string param_range(const ParamInfo& p) {
  std::string range;
  if (!p.choices.empty()) {
    for (std::size_t i = 0; i < p.choices.size(); ++i) {
      range += (i == 0 ? "" : i + 1 == p.choices.size() ? " or " : ", ") + std::to_string(p.choices[i]);
    }
  } else if (!p.words.empty()) {
    for (std::size_t i = 0; i < p.words.size(); ++i) range += (i == 0 ? "" : " | ") + p.words[i];
  } else if (p.lo && p.hi) {
    range = std::string(p.lo_open ? "(" : "[") + format_number(*p.lo) + ", " + format_number(*p.hi) +
            (p.hi_open ? ")" : "]");
  } else if (p.lo) {
    range = std::string(p.lo_open ? "> " : ">= ") + format_number(*p.lo);
  }
  return range;
}

std::string param_help(const ParamInfo& p) {
  const std::string range = param_range(p);
  return range.empty() ? p.help : range + ": " + p.help;
}

namespace {

// Whether x (integer i for integer parameters) lies in p's range or choices.
bool in_range(const ParamInfo& p, double x, long long i) {
  return std::isfinite(x) && (!p.lo || (p.lo_open ? x > *p.lo : x >= *p.lo)) &&
         (!p.hi || (p.hi_open ? x < *p.hi : x <= *p.hi)) &&
         (p.choices.empty() || std::find(p.choices.begin(), p.choices.end(), i) != p.choices.end());
}

// Throws InvalidInput naming `flag` and `text` when x (integer i) is outside p's range.
void check_number(const ParamInfo& p, double x, long long i, const std::string& flag, const std::string& text) {
  if (!in_range(p, x, i)) throw InvalidInput("value out of range (" + param_range(p) + ")", {"", flag, text});
}

void check_word(const ParamInfo& p, const std::string& value, const std::string& flag) {
  if (!p.words.empty() && std::find(p.words.begin(), p.words.end(), value) == p.words.end()) {
    throw InvalidInput("value must be " + param_range(p), {"", flag, value});
  }
}

}  // namespace

void set_param(CompressRequest& r, const ParamInfo& p, const std::string& value, const std::string& flag) {
  if (std::holds_alternative<ParamInfo::Flag>(p.field)) {
    if (!value.empty()) throw UsageError("flag takes no value", {"", flag, value});
    std::get<ParamInfo::Flag>(p.field)(r) = true;
    return;
  }
  if (value.empty()) throw UsageError("flag needs a value", {"", flag});
  if (std::holds_alternative<ParamInfo::Text>(p.field)) {
    check_word(p, value, flag);
    std::get<ParamInfo::Text>(p.field)(r) = value;
    return;
  }
  char* end = nullptr;
  const bool integer = std::holds_alternative<ParamInfo::Integer>(p.field);
  errno = 0;
  const long long i = integer ? std::strtoll(value.c_str(), &end, 10) : 0;
  const double x = integer ? static_cast<double>(i) : std::strtod(value.c_str(), &end);
  if (*end) throw UsageError(integer ? "not an integer" : "not a number", {"", flag, value});
  if (integer && errno == ERANGE) throw InvalidInput("integer beyond 64 bits (strtoll would clamp it)", {"", flag, value});
  check_number(p, x, i, flag, value);
  if (integer) {
    std::get<ParamInfo::Integer>(p.field)(r) = i;
  } else {
    std::get<ParamInfo::Real>(p.field)(r) = x;
  }
}

void check_request(const CompressRequest& request) {
  CompressRequest r = request;  // the accessors take a mutable request
  for (const ParamInfo& p : param_registry()) {
    const std::string flag = std::string("--") + p.name;
    if (const auto* f = std::get_if<ParamInfo::Integer>(&p.field)) {
      if (const auto& v = (*f)(r)) check_number(p, static_cast<double>(*v), *v, flag, std::to_string(*v));
    } else if (const auto* g = std::get_if<ParamInfo::Real>(&p.field)) {
      if (const auto& v = (*g)(r)) check_number(p, *v, 0, flag, format_number(*v));
    } else if (const auto* t = std::get_if<ParamInfo::Text>(&p.field)) {
      if (const auto& v = (*t)(r)) check_word(p, *v, flag);
    }
  }
}

namespace {

const nlohmann::json& file_value(const nlohmann::json& j, const char* key, const std::string& file,
                                 const std::string& field) {
  if (!j.is_object() || !j.contains(key)) throw CorruptData("missing field", {file, field, "missing"});
  const nlohmann::json& v = j[key];
  if (!v.is_number()) throw CorruptData("not a number", {file, field, v.dump().substr(0, 40)});
  return v;
}

long long whole(const nlohmann::json& v, const std::string& file, const std::string& field) {
  if (v.is_number_integer()) return v.get<long long>();
  const double x = v.get<double>();
  if (!(std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9.0e18)) {
    throw CorruptData("not an integer", {file, field, format_number(x)});
  }
  return static_cast<long long>(x);
}

}  // namespace

namespace {

const ParamInfo& registry_param(const char* name) {
  const ParamInfo* p = find_param(name);
  if (!p) throw std::logic_error(std::string("no registry parameter ") + name);
  return *p;
}

}  // namespace

long long file_integer(const nlohmann::json& j, const char* key, const char* param, const std::string& file,
                       const std::string& field) {
  const long long i = whole(file_value(j, key, file, field), file, field);
  const ParamInfo& p = registry_param(param);
  if (!in_range(p, static_cast<double>(i), i)) {
    throw CorruptData("value out of range (" + param_range(p) + ")", {file, field, std::to_string(i)});
  }
  return i;
}

double file_real(const nlohmann::json& j, const char* key, const char* param, const std::string& file,
                 const std::string& field) {
  const double x = file_value(j, key, file, field).get<double>();
  const ParamInfo& p = registry_param(param);
  if (!in_range(p, x, 0)) throw CorruptData("value out of range (" + param_range(p) + ")", {file, field, format_number(x)});
  return x;
}

std::size_t file_count(const nlohmann::json& j, const char* key, const std::string& file, const std::string& field) {
  const long long i = whole(file_value(j, key, file, field), file, field);
  if (i < 0) throw CorruptData("must be >= 0", {file, field, std::to_string(i)});
  return static_cast<std::size_t>(i);
}

CompressRequest parse_method_spec(const std::string& spec) {
  CompressRequest r;
  std::size_t start = 0;
  std::vector<std::string> parts;
  for (;;) {
    const std::size_t end = spec.find(':', start);
    parts.push_back(spec.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  r.method = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    const std::string key = parts[i].substr(0, eq), value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
    if (key.empty()) throw UsageError("empty method flag (name:flag=value:...)", {"", spec, parts[i]});
    const ParamInfo* p = find_param(key);
    if (!p) {
      std::string known;
      for (const ParamInfo& q : param_registry()) known += (known.empty() ? "" : ", ") + std::string(q.name);
      throw UsageError("unknown method flag (known: " + known + ")", {"", spec, key});
    }
    if (eq != std::string::npos && value.empty()) throw UsageError("method flag needs a value (flag=value)", {"", spec, key});
    set_param(r, *p, value, spec + ": " + key);
  }
  return r;
}

void join_method_spec(CompressRequest& r) {
  if (r.method.find(':') == std::string::npos) return;
  const std::string spec = r.method;
  CompressRequest s = parse_method_spec(spec);
  r.method = s.method;
  for (const ParamInfo& p : param_registry()) {
    std::visit(
        [&](auto field) {
          const auto& from = field(s);
          auto& to = field(r);
          if (!from) return;
          if (to) throw UsageError("flag given twice: in the method spec and as a flag", {"", std::string("--") + p.name, spec});
          to = from;
        },
        p.field);
  }
}

std::string method_spec_help() {
  std::string out = "name[:flag=value...]; the reference " + method_list({MethodKind::reference}) + "; quantizers " +
                    method_list({MethodKind::quantizer}) + "; presets " +
                    method_list({MethodKind::preset}) + "; eviction " +
                    method_list({MethodKind::eviction, MethodKind::joint}) + "; tiered " +
                    method_list({MethodKind::tiered}) + "; llama.cpp cache types ggml.";
  const char* scopes[] = {"quantization flags", "eviction flags (with an eviction method)",
                          "tiered flags (with a tiered method)", "ggml flags"};
  for (S s : {S::quant, S::eviction, S::tiered, S::ggml}) {
    std::string names;
    for (const ParamInfo& p : param_registry()) {
      if (p.scope == s) names += (names.empty() ? "" : ", ") + std::string(p.name);
    }
    out += std::string(" ") + scopes[static_cast<int>(s)] + ": " + names + ".";
  }
  return out;
}

}  // namespace akv
