#include "akv/method/eviction_params.h"

#include <type_traits>

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

const std::vector<ScoreParam>& score_params() {
  using R = EvictionRequest;
  using O = ScoreOptions;
  using Sm = ScoreMethod;
  using P = ScoreParam;
  static const std::vector<ScoreParam> rows = {
      {Sm::expected_attention, "future", "sets", "scores", P::Count{&R::future, &O::future}},
      {Sm::expected_attention, "covariance", "sets", "scores", P::Switch{&R::covariance, &O::covariance}},
      {Sm::expected_attention, "vnorm", "sets", "scores", P::Switch{&R::vnorm, &O::vnorm}},
      {Sm::lagkv, "lag", "sets", "partitions", P::Count{&R::lag, &O::lag}},
      {Sm::kvzip, "plus", "sets", "normalization", P::Switch{&R::plus, &O::plus}, true},
      {Sm::qfilter, "qfilters", "gives", "filters", P::File{&R::qfilters, &O::qfilters}},
      {Sm::kvzap, "surrogate", "gives", "surrogate", P::File{&R::surrogate, &O::surrogate}},
  };
  return rows;
}

void apply_score_params(ScoreOptions& o, const EvictionRequest& r) {
  for (const ScoreParam& p : score_params()) {
    std::visit(
        [&](const auto& f) {
          const auto& given = r.*f.first;
          if (!given) return;
          using V = std::decay_t<decltype(*given)>;
          std::string value;
          if constexpr (std::is_same_v<V, long long>) {
            value = std::to_string(*given);
          } else {
            value = *given;
          }
          if (o.method != p.method) {
            throw UsageError(std::string("this flag ") + p.verb + " " + score_method_name(p.method) + "'s " + p.what +
                                 ", not " + score_method_name(o.method) + "'s",
                             {"", std::string("--") + p.param, value});
          }
          using T = std::decay_t<decltype(o.*f.second)>;
          if constexpr (std::is_same_v<T, bool>) {
            o.*f.second = *given == "on";
          } else if constexpr (std::is_same_v<T, std::size_t>) {
            o.*f.second = static_cast<std::size_t>(*given);
          } else {
            o.*f.second = *given;
          }
        },
        p.field);
  }
}

void check_score_file(const ScoreOptions& o) {
  for (const ScoreParam& p : score_params()) {
    const auto* f = std::get_if<ScoreParam::File>(&p.field);
    if (f && o.method == p.method && (o.*f->second).empty()) {
      throw UsageError(score_method_name(p.method) + " scores with the " + p.what + " `akv calibrate` fits: give " +
                           p.param + "=calib.json",
                       {"", std::string("--") + p.param, "missing"});
    }
  }
}

std::vector<std::string> score_files(const ScoreOptions& o) {
  std::vector<std::string> files;
  for (const ScoreParam& p : score_params()) {
    const auto* f = std::get_if<ScoreParam::File>(&p.field);
    if (f && o.method == p.method && !(o.*f->second).empty()) files.push_back(o.*f->second);
  }
  return files;
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
  for (const ScoreParam& p : score_params()) {
    if (score.method != p.method) continue;
    std::visit(
        [&](const auto& f) {
          const auto& v = score.*f.second;
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) {
            if (p.json_when_on && !v) return;
          }
          j[p.param] = v;
        },
        p.field);
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
    for (const ScoreParam& s : score_params()) {
      if (p.score.method != s.method) continue;
      std::visit(
          [&](const auto& f) {
            auto& v = p.score.*f.second;
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::size_t>) {
              v = count(s.param, s.param);
            } else if constexpr (std::is_same_v<T, bool>) {
              v = s.json_when_on ? j.value(s.param, false) : j.at(s.param).get<bool>();
            } else {
              v = j.at(s.param).get<std::string>();
            }
          },
          s.field);
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
