#include "akv/alloc/budgets_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "akv/alloc/file_heads.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/ggml_params.h"
#include "akv/method/registry.h"

namespace akv {

nlohmann::json budgets_to_json(const BudgetsFile& f) {
  const KvWindow& m = f.shape;
  nlohmann::json j;
  j["format"] = kBudgetsFormat;
  j["version"] = kBudgetsVersion;
  j["dump"] = {{"path", f.dump_path},       {"hash", f.dump_hash},     {"n_layers", m.n_layers},
               {"n_kv_heads", m.n_kv_heads}, {"n_tokens", m.n_tokens}, {"head_dim", m.head_dim}};
  j["summary"] = f.summary;
  if (!f.joint.is_null()) j["joint"] = f.joint;
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < f.heads.size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    std::size_t tokens = 0;
    bool has_mass = false;
    double lo = INFINITY, sum = 0;
    for (std::size_t h = 0; h < f.heads[l].size(); ++h) {
      const BudgetHead& b = f.heads[l][h];
      nlohmann::json hj = {{"head", h}, {"tokens", b.tokens}};
      if (b.retained_mass) {
        hj["retained_mass"] = *b.retained_mass;
        has_mass = true;
        lo = std::min(lo, *b.retained_mass);
        sum += *b.retained_mass;
      }
      if (b.key_bits) hj["key_bits"] = *b.key_bits;
      if (b.value_bits) hj["value_bits"] = *b.value_bits;
      if (b.key_type) hj["key_type"] = *b.key_type;
      if (b.value_type) hj["value_type"] = *b.value_type;
      if (b.rotate) hj["rotate"] = *b.rotate;
      if (b.bytes) hj["bytes"] = *b.bytes;
      if (b.predicted_error) hj["predicted_error"] = *b.predicted_error;
      if (!b.kind.empty()) hj["kind"] = b.kind;
      heads.push_back(hj);
      tokens += b.tokens;
    }
    nlohmann::json lj = {{"layer", l}, {"tokens", tokens}, {"heads", heads}};
    if (has_mass) {
      lj["retained_mass_min"] = lo;
      lj["retained_mass_mean"] = sum / static_cast<double>(f.heads[l].size());
    }
    layers.push_back(lj);
  }
  j["layers"] = layers;
  return j;
}

nlohmann::json budgets_json(const EvictionPlan& plan, const DumpReader& dump,
                            const std::string& dump_hash) {
  BudgetsFile f;
  f.dump_path = dump.path();
  f.dump_hash = dump_hash;
  f.shape = dump.meta();
  f.summary = plan.summary_json();
  for (std::size_t l = 0; l < plan.heads.size(); ++l) {
    const auto& kinds = dump.layer(l).head_kinds;
    auto& layer = f.heads.emplace_back();
    for (std::size_t h = 0; h < plan.heads[l].size(); ++h) {
      BudgetHead b;
      b.tokens = plan.heads[l][h].tokens;
      b.retained_mass = plan.heads[l][h].retained_mass;
      if (!kinds.empty()) b.kind = kinds[h];
      layer.push_back(b);
    }
  }
  return budgets_to_json(f);
}

namespace {

// The file's dump shape against m's (layers, KV heads, tokens).
void check_budgets_shape(const nlohmann::json& d, const std::string& path, const KvWindow& m) {
  const std::pair<const char*, std::size_t> shape[] = {
      {"n_layers", m.file_layers()}, {"n_kv_heads", m.n_kv_heads}, {"n_tokens", m.n_tokens}};
  for (const auto& [name, want] : shape) {
    const std::size_t got = file_count(d, name, path, std::string("dump.") + name);
    if (got != want) {
      throw InvalidInput("budgets were made for a dump of another shape (this dump has " +
                             std::to_string(want) + ")",
                         {path, std::string("dump.") + name, std::to_string(got)});
    }
  }
}

// One head's entry (`at` names it): its tokens within [forced, n_tokens] into `tokens`, and a
// joint plan's bits, cache types and rotation into r.
void read_budget_head(const nlohmann::json& head, const std::string& path, const std::string& at, std::size_t forced,
                      std::size_t n_tokens, std::vector<std::size_t>& tokens, BudgetsRead& r) {
  const std::size_t t = file_count(head, "tokens", path, at + ".tokens");
  if (t < forced || t > n_tokens) {
    throw InvalidInput("head budget outside [forced tokens " + std::to_string(forced) + ", n_tokens]",
                       {path, at + ".tokens", std::to_string(t)});
  }
  tokens.push_back(t);
  if (head.contains("key_bits")) {
    const auto kb = static_cast<int>(file_count(head, "key_bits", path, at + ".key_bits"));
    const auto vb = static_cast<int>(file_count(head, "value_bits", path, at + ".value_bits"));
    for (int x : {kb, vb}) {
      if (x != 16 && x != 2 && x != 3 && x != 4 && x != 8 && x != 0) {
        throw InvalidInput("unsupported bits in budgets file", {path, at, std::to_string(x)});
      }
    }
    r.bits.emplace_back(kb, vb);
    // A tensor of bits 0 is stored as its cache type (joint with cache types): its name.
    auto type_of = [&](int bits, const std::string& key) -> std::string {
      const bool named = head.contains(key);
      if ((bits == 0) != named) {
        throw InvalidInput("a tensor has bits 0 exactly when it has a " + key, {path, at + "." + key, named ? "given" : "missing"});
      }
      if (!named) return "";
      if (!head.at(key).is_string()) throw CorruptData(key + " is a cache type name", {path, at + "." + key});
      const std::string type = head.at(key).get<std::string>();
      parse_head_type(type, path, at + "." + key);
      return type;
    };
    r.types.emplace_back(type_of(kb, "key_type"), type_of(vb, "value_type"));
  }
  if (head.contains("rotate")) {
    if (!head.at("rotate").is_string()) throw CorruptData("rotate is a rotation name", {path, at + ".rotate"});
    r.rotate.push_back(parse_rotation(head.at("rotate").get<std::string>(), path, at + ".rotate"));
  }
}

}  // namespace

BudgetsRead read_budgets(const std::string& path, const KvWindow& m) {
  const nlohmann::json j = read_json_file(path, "budgets", kBudgetsFormat, kBudgetsVersion);
  BudgetsRead r;
  json_errors_as<CorruptData>("bad budgets file", {path}, [&] {
    check_budgets_shape(j.at("dump"), path, m);
    r.params = EvictionParams::from_json(j.at("summary").at("params"), path);
    const std::size_t forced = forced_tokens(m.n_tokens, r.params.sinks, r.params.score.window);
    std::size_t index = 0;
    each_file_head(j, path, "budgets", m, [&](const nlohmann::json& head, const std::string& at) {
      if (index++ % m.n_kv_heads == 0) r.tokens.emplace_back();
      read_budget_head(head, path, at, forced, m.n_tokens, r.tokens.back(), r);
    });
    if (std::all_of(r.types.begin(), r.types.end(), [](const auto& t) { return t.first.empty() && t.second.empty(); })) {
      r.types.clear();
    }
    if (!r.rotate.empty() && r.rotate.size() != m.n_layers * m.n_kv_heads) {
      throw CorruptData("every head of a rotated joint plan records its rotation", {path, "layers[].heads[].rotate"});
    }
    if (j.contains("joint")) {
      const auto& jj = j["joint"];
      r.joint = true;
      if (jj.contains("group")) r.group = file_count(jj, "group", path, "joint.group");
      if (jj.contains("residual")) r.residual = file_count(jj, "residual", path, "joint.residual");
      if (jj.contains("rotate_seed")) r.rotate_seed = file_count(jj, "rotate_seed", path, "joint.rotate_seed");
    }
  });
  return r;
}

std::string budgets_method(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "budgets", kBudgetsFormat, kBudgetsVersion);
  const EvictionParams p = json_errors_as<CorruptData>(
      "bad budgets file", {path}, [&] { return EvictionParams::from_json(j.at("summary").at("params"), path); });
  return eviction_method_name(p.score.method, p.alloc, p.critical);
}

std::string render_budgets(const nlohmann::json& j) {
  const auto& s = j["summary"];
  std::string out = fmt::format(
      "{} allocation ({} scores{}), {} tokens per KV head on average ({} always kept): {} tokens "
      "= {:.4f} of the cache; retained window attention mass mean {:.4f}, min {:.4f}\n",
      s["params"]["alloc"].get<std::string>(), s["params"]["score"].get<std::string>(),
      s["params"].value("critical", false) ? ", CriticalKV" : "",
      s["budget_tokens_per_head"].get<std::size_t>(), s["forced_tokens_per_head"].get<std::size_t>(),
      s["total_tokens"].get<std::size_t>(), s["fraction"].get<double>(),
      s["retained_mass_mean"].get<double>(), s["retained_mass_min"].get<double>());
  out += fmt::format("{:>5} {:>9} {:>9} {:>9}  {}\n", "layer", "tokens", "mass_min", "mass_mean",
                     "tokens per head (kind)");
  for (const auto& l : j["layers"]) {
    std::string heads;
    for (const auto& h : l["heads"]) {
      heads += fmt::format("{}{}", heads.empty() ? "" : " ", h["tokens"].get<std::size_t>());
      if (h.contains("kind")) heads += "(" + h["kind"].get<std::string>().substr(0, 1) + ")";
    }
    out += fmt::format("{:>5} {:>9} {:>9.4f} {:>9.4f}  {}\n", l["layer"].get<std::size_t>(),
                       l["tokens"].get<std::size_t>(), l["retained_mass_min"].get<double>(),
                       l["retained_mass_mean"].get<double>(), heads);
  }
  return out;
}

}  // namespace akv
