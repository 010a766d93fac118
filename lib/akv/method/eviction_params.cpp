#include "akv/method/eviction_params.h"

#include <algorithm>
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

const std::vector<EvictionField>& eviction_fields() {
  using R = EvictionRequest;
  using E = EvictionParams;
  using O = ScoreOptions;
  using Sm = ScoreMethod;
  using F = EvictionField;
  // Each row names all three pointers (Of has no defaults: clang 14 drops code that reads a
  // defaulted null member pointer of an aggregate).
  static const std::vector<EvictionField> rows = {
      {"kernel", F::Count{&R::kernel, nullptr, &O::kernel}},
      {"pool", F::Of<PoolKind, std::string>{&R::pool, nullptr, &O::pool}},
      {"gqa-reduce", F::Of<GqaReduce, std::string>{&R::gqa_reduce, nullptr, &O::gqa_reduce}},
      {"alpha", F::Of<double, double>{&R::alpha, &E::alpha, nullptr}, std::nullopt, nullptr, nullptr, true},
      {"beta", F::Of<double, double>{&R::beta, &E::beta, nullptr}, std::nullopt, nullptr, nullptr, true},
      // Files written before the rule was recorded used exact totals.
      {"capacity-rule", F::Of<CapacityRule, std::string>{&R::capacity_rule, &E::capacity_rule, nullptr}, std::nullopt,
       nullptr, nullptr, true, "exact-total"},
      {"min-tokens", F::Count{&R::min_tokens, &E::min_tokens, nullptr}, std::nullopt, nullptr, nullptr, true},
      {"step", F::Count{&R::step, &E::step, nullptr}, std::nullopt, nullptr, nullptr, true},
      {"future", F::Count{&R::future, nullptr, &O::future}, Sm::expected_attention, "sets", "scores"},
      {"covariance", F::Switch{&R::covariance, nullptr, &O::covariance}, Sm::expected_attention, "sets", "scores"},
      {"vnorm", F::Switch{&R::vnorm, nullptr, &O::vnorm}, Sm::expected_attention, "sets", "scores"},
      {"lag", F::Count{&R::lag, nullptr, &O::lag}, Sm::lagkv, "sets", "partitions"},
      {"plus", F::Switch{&R::plus, nullptr, &O::plus}, Sm::kvzip, "sets", "normalization", false, "off", true},
      {"qfilters", F::File{&R::qfilters, nullptr, &O::qfilters}, Sm::qfilter, "gives", "filters"},
      {"surrogate", F::File{&R::surrogate, nullptr, &O::surrogate}, Sm::kvzap, "gives", "surrogate"},
  };
  return rows;
}

namespace {

// parse_capacity_rule's inverse.
std::string capacity_rule_name(CapacityRule r) {
  switch (r) {
    case CapacityRule::exact_total: return "exact-total";
    case CapacityRule::kvpress: return "kvpress";
    case CapacityRule::official: break;
  }
  return "official";
}

// A value from its text (a switch: on | off; a word: its name; a number; a path).
template <class T>
T parse_value(const std::string& s) {
  if constexpr (std::is_same_v<T, bool>) {
    return s == "on";
  } else if constexpr (std::is_same_v<T, PoolKind>) {
    return parse_pool(s);
  } else if constexpr (std::is_same_v<T, GqaReduce>) {
    return parse_gqa_reduce(s);
  } else if constexpr (std::is_same_v<T, CapacityRule>) {
    return parse_capacity_rule(s);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return s;
  } else {
    return static_cast<T>(std::stod(s));
  }
}

std::string value_text(long long v) { return std::to_string(v); }
std::string value_text(double v) { return format_number(v); }
std::string value_text(const std::string& v) { return v; }

// A value as JSON holds it: numbers, bools and paths as themselves, words as their names.
template <class T>
nlohmann::json json_value(const T& v) {
  if constexpr (std::is_same_v<T, PoolKind>) {
    return pool_name(v);
  } else if constexpr (std::is_same_v<T, GqaReduce>) {
    return gqa_reduce_name(v);
  } else if constexpr (std::is_same_v<T, CapacityRule>) {
    return capacity_rule_name(v);
  } else {
    return v;
  }
}

std::string json_key(const char* param) {
  std::string key = param;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// The path a score's file row holds in o (nullptr: another score's row, or no file row).
const std::string* score_file(const EvictionField& f, const ScoreOptions& o) {
  const auto* file = std::get_if<EvictionField::File>(&f.field);
  return file && f.score == o.method ? &(o.*file->score_at) : nullptr;
}

}  // namespace

void apply_eviction_fields(EvictionParams& e, const EvictionRequest& r) {
  for (const EvictionField& f : eviction_fields()) {
    std::visit(
        [&](const auto& of) -> void {
          const auto& given = r.*of.given;
          if (!given) return;
          if (f.score && e.score.method != *f.score) {
            throw UsageError(std::string("this flag ") + f.verb + " " + score_method_name(*f.score) + "'s " + f.what +
                                 ", not " + score_method_name(e.score.method) + "'s",
                             {"", std::string("--") + f.param, value_text(*given)});
          }
          auto& v = of.at ? e.*of.at : e.score.*of.score_at;
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
            v = static_cast<T>(*given);  // counts >= 0: check_request
          } else {
            v = parse_value<T>(*given);
          }
        },
        f.field);
  }
}

std::string allocator_flag_list() {
  std::string out;
  for (const EvictionField& f : eviction_fields()) {
    if (f.allocator) out += (out.empty() ? "" : ", ") + std::string(f.param);
  }
  return out;
}

bool gives_allocator_flag(const EvictionRequest& r) {
  for (const EvictionField& f : eviction_fields()) {
    if (f.allocator && std::visit([&](const auto& of) { return (r.*of.given).has_value(); }, f.field)) return true;
  }
  return false;
}

void check_score_file(const ScoreOptions& o) {
  for (const EvictionField& f : eviction_fields()) {
    const std::string* file = score_file(f, o);
    if (file && file->empty()) {
      throw UsageError(score_method_name(o.method) + " scores with the " + f.what + " `akv calibrate` fits: give " +
                           f.param + "=calib.json",
                       {"", std::string("--") + f.param, "missing"});
    }
  }
}

std::vector<std::string> score_files(const ScoreOptions& o) {
  std::vector<std::string> files;
  for (const EvictionField& f : eviction_fields()) {
    const std::string* file = score_file(f, o);
    if (file && !file->empty()) files.push_back(*file);
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
  for (const EvictionField& f : eviction_fields()) {
    if (f.score && score.method != *f.score) continue;
    std::visit(
        [&](const auto& of) -> void {
          const auto& v = of.at ? this->*of.at : score.*of.score_at;
          using T = std::decay_t<decltype(v)>;
          if (f.omit_absent && v == parse_value<T>(f.absent)) return;
          j[json_key(f.param)] = json_value(v);
        },
        f.field);
  }
  j["alloc"] = alloc_method_name(alloc);
  j["budget_fraction"] = budget_fraction ? nlohmann::json(*budget_fraction) : nlohmann::json(nullptr);
  j["budget_tokens"] = budget_tokens ? nlohmann::json(*budget_tokens) : nlohmann::json(nullptr);
  j["sinks"] = sinks;
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
    for (const EvictionField& f : eviction_fields()) {
      if (f.score && p.score.method != *f.score) continue;
      const std::string key = json_key(f.param);
      std::visit(
          [&](const auto& of) -> void {
            auto& v = of.at ? p.*of.at : p.score.*of.score_at;
            using T = std::decay_t<decltype(v)>;
            if (f.absent && !j.contains(key)) {
              v = parse_value<T>(f.absent);
            } else if constexpr (std::is_same_v<T, std::size_t>) {
              v = count(key.c_str(), f.param);
            } else if constexpr (std::is_same_v<T, double>) {
              v = file_real(j, key.c_str(), f.param, file, at + key);
            } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
              v = j.at(key).get<T>();
            } else {
              v = parse_value<T>(j.at(key).get<std::string>());
            }
          },
          f.field);
    }
    const std::string a = j.at("alloc").get<std::string>();
    p.alloc = a == "file" ? AllocMethod::file : a == "joint" ? AllocMethod::joint : parse_alloc_method(a);
    if (!j.at("budget_fraction").is_null()) p.budget_fraction = file_real(j, "budget_fraction", "budget", file, at + "budget_fraction");
    if (!j.at("budget_tokens").is_null()) p.budget_tokens = count("budget_tokens", "budget-tokens");
    p.sinks = count("sinks", "sinks");
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
