#include "akv/method/eviction_params.h"

#include "akv/core/errors.h"
#include "akv/method/ggml_params.h"
#include "akv/method/registry.h"

namespace akv {
std::string alloc_method_name(AllocMethod a) {
  switch (a) {
    case AllocMethod::uniform: return "uniform";
    case AllocMethod::adakv: return "adakv";
    case AllocMethod::waterfill: return "waterfill";
    case AllocMethod::pyramid: return "pyramid";
    case AllocMethod::adakv_pyramid: return "adakv-pyramid";
    case AllocMethod::adakv_global: return "adakv-global";
    case AllocMethod::duo: return "duo";
    case AllocMethod::file: return "file";
    case AllocMethod::joint: return "joint";
  }
  return "?";
}

namespace {

constexpr AllocMethod kAllocators[] = {AllocMethod::uniform, AllocMethod::adakv,         AllocMethod::waterfill,
                                       AllocMethod::pyramid, AllocMethod::adakv_pyramid, AllocMethod::adakv_global,
                                       AllocMethod::duo};

bool evicts(const MethodInfo& m) { return m.kind == MethodKind::eviction || m.kind == MethodKind::joint; }

}  // namespace

std::string alloc_method_list(const char* separator) {
  std::string out;
  for (AllocMethod a : kAllocators) out += (out.empty() ? "" : separator) + alloc_method_name(a);
  return out;
}

AllocMethod parse_alloc_method(const std::string& s) {
  for (AllocMethod a : kAllocators) {
    if (alloc_method_name(a) == s) return a;
  }
  throw InvalidInput("unknown allocation method (expected " + alloc_method_list(", ") + ")", {"", "--method", s});
}

std::vector<std::string> eviction_method_names() {
  std::vector<std::string> v;
  for (const MethodInfo& m : method_registry()) {
    if (evicts(m)) v.push_back(m.name);
  }
  return v;
}

bool is_eviction_method(const std::string& name) {
  const MethodInfo* m = find_method(name);
  return m && evicts(*m);
}

std::string eviction_method_name(ScoreMethod score, AllocMethod alloc, bool critical) {
  for (const MethodInfo& m : method_registry()) {
    if (evicts(m) && m.critical == critical && m.alloc == alloc && (m.score == score || alloc == AllocMethod::joint)) {
      return m.name;
    }
  }
  return alloc_method_name(alloc);
}

EvictionParams eviction_method(const std::string& name) {
  const MethodInfo* m = find_method(name);
  if (!m || !evicts(*m)) throw InvalidInput("unknown eviction method", {"", "--method", name});
  EvictionParams p;
  p.score.method = m->score;
  p.score.window = m->window >= 0 ? static_cast<std::size_t>(m->window) : default_window(m->score);
  p.alloc = m->alloc;
  p.sinks = m->sinks;
  p.alpha = m->alpha;
  p.critical = m->critical;
  p.capacity_rule = m->capacity_rule;
  return p;
}

const std::vector<ScoreFileParam>& score_file_params() {
  static const std::vector<ScoreFileParam> rows = {
      {ScoreMethod::qfilter, "qfilters", "filters", &EvictionRequest::qfilters, &ScoreOptions::qfilters},
      {ScoreMethod::kvzap, "surrogate", "surrogate", &EvictionRequest::surrogate, &ScoreOptions::surrogate},
  };
  return rows;
}

void check_score_file(const ScoreOptions& o) {
  for (const ScoreFileParam& f : score_file_params()) {
    if (o.method == f.method && (o.*f.path).empty()) {
      throw UsageError(score_method_name(f.method) + " scores with the " + f.gives + " `akv calibrate` fits: give " +
                           f.param + "=calib.json",
                       {"", std::string("--") + f.param, "missing"});
    }
  }
}

void check_cut(const EvictionParams& e, const std::string& what) {
  const ScoreMethod s = e.score.method;
  if (s != ScoreMethod::snapkv && s != ScoreMethod::knorm && s != ScoreMethod::keydiff && s != ScoreMethod::lagkv &&
      s != ScoreMethod::qfilter) {
    throw UsageError(what + " scores with snapkv, knorm, keydiff, lagkv or qfilter", {"", "--score", score_method_name(s)});
  }
  if (e.alloc != AllocMethod::uniform && e.alloc != AllocMethod::adakv) {
    throw UsageError(what + " allocates uniform or adakv", {"", "--method", alloc_method_name(e.alloc)});
  }
  if (e.critical) {
    throw UsageError(what + " does not weigh values by the output projection (critical)", {"", "--critical", "on"});
  }
}

void check_decode_compression(const EvictionParams& e) {
  check_cut(e, "decode-time compression");
  if (e.target <= e.sinks + e.score.window) {
    throw InvalidInput("target must exceed the always-kept tokens (window " + std::to_string(e.score.window) +
                           " + sinks " + std::to_string(e.sinks) + ")",
                       {"", "--target", std::to_string(e.target)});
  }
}

void check_threshold_decoding(const EvictionParams& e, bool quantized) {
  const ScoreMethod s = e.score.method;
  if (s != ScoreMethod::knorm && s != ScoreMethod::qfilter && s != ScoreMethod::kvzap) {
    throw UsageError("decoding=on scores each decoded token alone: knorm, qfilter or kvzap",
                     {"", "--score", score_method_name(s)});
  }
  if (quantized) throw UsageError("decoding=on evicts f16 rows: it takes no quant= or rotate=", {"", "--decoding", "on"});
  if (e.every > 0) {
    throw UsageError("decoding=on evicts by threshold while decoding already; every= is for budgets",
                     {"", "--every", std::to_string(e.every)});
  }
}

std::string capacity_rule_name(CapacityRule r) {
  switch (r) {
    case CapacityRule::exact_total: return "exact-total";
    case CapacityRule::kvpress: return "kvpress";
    case CapacityRule::official: break;
  }
  return "official";
}

CapacityRule parse_capacity_rule(const std::string& s) {
  if (s == "official") return CapacityRule::official;
  if (s == "exact-total") return CapacityRule::exact_total;
  if (s == "kvpress") return CapacityRule::kvpress;
  throw InvalidInput("unknown capacity rule (expected official, exact-total or kvpress)", {"", "--capacity-rule", s});
}

nlohmann::json EvictionParams::to_json() const {
  nlohmann::json j;
  j["score"] = score_method_name(score.method);
  j["window"] = score.window;
  j["pool"] = pool_name(score.pool);
  j["kernel"] = score.kernel;
  j["gqa_reduce"] = gqa_reduce_name(score.gqa_reduce);
  if (score.method == ScoreMethod::expected_attention) {
    j["future"] = score.future;
    j["covariance"] = score.covariance;
    j["vnorm"] = score.vnorm;
  }
  if (score.method == ScoreMethod::lagkv) j["lag"] = score.lag;
  if (score.method == ScoreMethod::kvzip && score.plus) j["plus"] = true;
  for (const ScoreFileParam& f : score_file_params()) {
    if (score.method == f.method) j[f.param] = score.*f.path;
  }
  j["alloc"] = alloc_method_name(alloc);
  j["budget_fraction"] = budget_fraction ? nlohmann::json(*budget_fraction) : nlohmann::json(nullptr);
  j["budget_tokens"] = budget_tokens ? nlohmann::json(*budget_tokens) : nlohmann::json(nullptr);
  j["sinks"] = sinks;
  j["alpha"] = alpha;
  j["capacity_rule"] = capacity_rule_name(capacity_rule);
  j["beta"] = beta;
  j["min_tokens"] = min_tokens;
  j["step"] = step;
  if (!budgets_file.empty()) j["budgets_file"] = budgets_file;
  if (!duo_heads.empty()) j["duo_heads"] = duo_heads;
  if (rotate_choice) j["rotate_choice"] = true;
  if (!cache_types.empty()) j["cache_types"] = cache_types;
  if (threshold) {
    j["threshold"] = *threshold;
    j["decoding"] = decoding;
  }
  if (every > 0) {
    j["every"] = every;
    j["target"] = target;
  }
  if (critical) {
    j["critical"] = true;
    j["first_stage"] = first_stage;
  }
  return j;
}

EvictionParams EvictionParams::from_json(const nlohmann::json& j, const std::string& file) {
  EvictionParams p;
  try {
    p.score.method = parse_score_method(j.at("score").get<std::string>());
    const std::string at = "params.eviction.";
    auto count = [&](const char* key, const char* param) {
      return static_cast<std::size_t>(file_integer(j, key, param, file, at + key));
    };
    p.score.window = count("window", "window");
    p.score.pool = parse_pool(j.at("pool").get<std::string>());
    p.score.kernel = count("kernel", "kernel");
    p.score.gqa_reduce = parse_gqa_reduce(j.at("gqa_reduce").get<std::string>());
    if (p.score.method == ScoreMethod::expected_attention) {
      p.score.future = static_cast<std::size_t>(file_integer(j, "future", "future", file, at + "future"));
      p.score.covariance = j.at("covariance").get<bool>();
      p.score.vnorm = j.at("vnorm").get<bool>();
    }
    if (p.score.method == ScoreMethod::lagkv) {
      p.score.lag = static_cast<std::size_t>(file_integer(j, "lag", "lag", file, at + "lag"));
    }
    if (p.score.method == ScoreMethod::kvzip) p.score.plus = j.value("plus", false);
    for (const ScoreFileParam& f : score_file_params()) {
      if (p.score.method == f.method) p.score.*f.path = j.at(f.param).get<std::string>();
    }
    const std::string a = j.at("alloc").get<std::string>();
    p.alloc = a == "file" ? AllocMethod::file : a == "joint" ? AllocMethod::joint : parse_alloc_method(a);
    if (!j.at("budget_fraction").is_null()) p.budget_fraction = file_real(j, "budget_fraction", "budget", file, at + "budget_fraction");
    if (!j.at("budget_tokens").is_null()) p.budget_tokens = count("budget_tokens", "budget-tokens");
    p.sinks = count("sinks", "sinks");
    p.alpha = file_real(j, "alpha", "alpha", file, at + "alpha");
    // Files written before the rule was recorded used exact totals.
    p.capacity_rule = j.contains("capacity_rule") ? parse_capacity_rule(j.at("capacity_rule").get<std::string>())
                                                  : CapacityRule::exact_total;
    p.beta = file_real(j, "beta", "beta", file, at + "beta");
    p.min_tokens = count("min_tokens", "min-tokens");
    p.step = count("step", "step");
    p.budgets_file = j.value("budgets_file", "");
    p.duo_heads = j.value("duo_heads", "");
    p.rotate_choice = j.value("rotate_choice", false);
    if (j.contains("cache_types")) {
      p.cache_types = j.at("cache_types").get<std::vector<std::string>>();
      for (std::size_t i = 0; i < p.cache_types.size(); ++i) {
        parse_head_type(p.cache_types[i], file, at + "cache_types[" + std::to_string(i) + "]");
      }
    }
    if (j.contains("critical")) {
      p.critical = j.at("critical").get<bool>();
      p.first_stage = file_real(j, "first_stage", "first-stage", file, at + "first_stage");
    }
    if (j.contains("threshold")) {
      p.threshold = file_real(j, "threshold", "threshold", file, at + "threshold");
      p.decoding = j.at("decoding").get<bool>();
    }
    if (j.contains("every")) {
      p.every = count("every", "every");
      p.target = count("target", "target");
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(std::string("bad eviction parameters: ") + e.what(), {file, "eviction"});
  } catch (const CorruptData&) {
    throw;
  } catch (const Error& e) {
    throw CorruptData(e.what(), {file, "eviction"});
  }
  return p;
}

}  // namespace akv
