#include "akv/kv/joint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "akv/alloc/budgets_file.h"
#include "akv/alloc/eviction.h"
#include "akv/alloc/knapsack.h"
#include "akv/attention/block_attention.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/io/dump.h"
#include "akv/io/file_hash.h"
#include "akv/kv/stored_head.h"
#include "akv/method/ggml_params.h"
#include "akv/quant/pack.h"

namespace akv {
namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Causal attention outputs [nq, d] of queries at positions first_qpos + i over rows at positions
// kpos (ascending).
MatF attend(const float* q, std::size_t nq, const float* k, const float* v, const std::size_t* kpos,
            std::size_t nk, std::size_t d, std::size_t first_qpos) {
  std::vector<std::size_t> visible(nq);
  for (std::size_t i = 0; i < nq; ++i) {
    visible[i] = static_cast<std::size_t>(std::upper_bound(kpos, kpos + nk, first_qpos + i) - kpos);
  }
  const CausalBlock b{q, k, visible.data(), nq, nk, d};
  MatF out(static_cast<Eigen::Index>(nq), static_cast<Eigen::Index>(d));
  causal_attention(b, v, out.data());
  return out;
}

void check_joint_options(const JointOptions& o) {
  if (!(o.bytes_fraction > 0 && o.bytes_fraction <= 1)) {
    throw InvalidInput("byte budget must be a fraction in (0, 1] of the f16 size", {"", "--bytes", format_number(o.bytes_fraction)});
  }
  if (o.bits.empty()) throw InvalidInput("empty candidate set", {"", "--bits", ""});
  for (int b : o.bits) check_bits(b, "--bits");
  if (o.keep.empty()) throw InvalidInput("empty candidate set", {"", "--keep", ""});
  for (double k : o.keep) {
    if (!(k > 0 && k <= 1)) throw InvalidInput("keep fractions must be in (0, 1]", {"", "--keep", format_number(k)});
  }
  if (o.group == 0 || o.residual % o.group != 0) {
    throw InvalidInput("residual must be a multiple of the group size", {"", "--residual", std::to_string(o.residual)});
  }
}

// A tensor's storage: kivi codes of `bits`, or the cache type `type` (bits 0; own_rotation: it
// names its rotation); f16 is bits 16.
struct JointStorage {
  int bits;
  std::string type;
  bool own_rotation = false;
};

// A candidate's storage of keys and values, and its rotation.
struct JointCandidate {
  JointStorage k, v;
  RotationKind rotate;
};

// Every {key storage, value storage} pair at the rotation (and unrotated too with
// rotate_choice; a pair of types with their own rotations once), then f16.
std::vector<JointCandidate> joint_candidates(const JointOptions& o, std::size_t d) {
  if (o.rotate_choice && o.rotate == RotationKind::none) {
    throw UsageError("a choice of rotation needs a rotation to choose: --rotate hadamard or random", {"", "--rotate", "none"});
  }
  std::vector<JointStorage> storage;
  for (int b : o.bits) storage.push_back({b, ""});
  for (const std::string& t : o.types) {
    const HeadType ht = parse_head_type(t, "", "--cache-types");
    const std::string field = "--cache-types " + t + ": head_dim";
    check_ggml_head_dim(ggml_cache_type(ht.name, d, "", field), d, "", field);
    storage.push_back({0, t, ht.rotate.has_value()});
  }
  std::vector<JointCandidate> pairs;
  for (const RotationKind r : o.rotate_choice ? std::vector<RotationKind>{RotationKind::none, o.rotate}
                                              : std::vector<RotationKind>{o.rotate}) {
    for (const JointStorage& sk : storage) {
      for (const JointStorage& sv : storage) {
        const bool fixed = sk.own_rotation && sv.own_rotation;
        if (!(fixed && r != o.rotate)) pairs.push_back({sk, sv, fixed ? o.rotate : r});
      }
    }
  }
  if (o.f16_option) pairs.push_back({{16, ""}, {16, ""}, RotationKind::none});
  return pairs;
}

QuantParams candidate_params(const JointCandidate& c, const JointOptions& o) {
  QuantParams p;
  if (c.k.bits == 16) {
    p.method = Quantizer::none;
    p.residual = 0;
    return p;
  }
  p.method = Quantizer::kivi;
  p.key = {c.k.bits, QuantAxis::channel, o.group, c.k.type};
  p.value = {c.v.bits, QuantAxis::token, o.group, c.v.type};
  p.residual = o.residual;
  p.rule = o.rule;
  p.rotate = c.rotate;
  p.rotate_seed = c.rotate == RotationKind::none ? 0 : o.rotate_seed;
  return p;
}

// KV head h's choices of a layer (query, key, value as JointSource reads them): for each keep
// fraction, the top-scored rows plus the last `window`, stored as each candidate, with its bytes
// and its query heads' attention-output error against the full cache's.
std::vector<JointChoice> head_choices(const KvWindow& m, const Tensor3& query, const Tensor3& key, const Tensor3& value,
                                      std::size_t h, const ScoreOptions& so, const JointOptions& o,
                                      const std::vector<JointCandidate>& pairs) {
  const std::size_t T = m.n_tokens, d = m.head_dim, W = o.window;
  const HeadScores sc = score_head(query, key, h, m, so);
  std::vector<std::size_t> order;
  for (std::size_t t = 0; t + W < T; ++t) order.push_back(t);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sc.score[a] > sc.score[b]; });
  std::vector<std::size_t> all(T);
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::vector<MatF> full;
  double norm2 = 0;
  for (std::size_t qh = h * m.group_size(); qh < (h + 1) * m.group_size(); ++qh) {
    full.push_back(attend(query.row(qh, 0), m.n_query, key.row(h, 0), value.row(h, 0), all.data(), T, d, m.first_query_pos()));
    norm2 += full.back().cast<double>().squaredNorm();
  }
  std::vector<JointChoice> choices;
  for (double f : o.keep) {
    const std::size_t n = std::min(T, std::max(W, static_cast<std::size_t>(std::llround(f * static_cast<double>(T)))));
    std::vector<std::size_t> kept(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n - std::min(n, W)));
    for (std::size_t t = T - std::min(T, W); t < T; ++t) kept.push_back(t);
    std::sort(kept.begin(), kept.end());
    std::vector<float> k(n * d), v(n * d);
    std::vector<std::int32_t> kept32;
    for (std::size_t i = 0; i < n; ++i) {
      std::copy_n(key.row(h, kept[i]), d, k.data() + i * d);
      std::copy_n(value.row(h, kept[i]), d, v.data() + i * d);
      kept32.push_back(static_cast<std::int32_t>(kept[i]));
    }
    HeadInput in;
    in.key = k.data();
    in.value = v.data();
    in.n = n;
    in.n_tokens = T;
    in.head_dim = d;
    if (n < T) in.kept = kept32;
    double mass = 0;
    for (std::size_t t : kept) mass += sc.mass[t];
    for (const JointCandidate& cand : pairs) {
      const HeadCache hc = compress_head(in, candidate_params(cand, o));
      std::vector<float> rk(n * d), rv(n * d);
      reconstruct_head(hc, {}, rk.data(), rv.data());
      double err2 = 0;
      for (std::size_t g = 0; g < full.size(); ++g) {
        const MatF out = attend(query.row(h * m.group_size() + g, 0), m.n_query, rk.data(), rv.data(), kept.data(), n, d,
                                m.first_query_pos());
        err2 += (out - full[g]).cast<double>().squaredNorm();
      }
      JointChoice& c = choices.emplace_back();
      c.kept = kept32;
      c.key_bits = cand.k.bits;
      c.value_bits = cand.v.bits;
      c.key_type = cand.k.type;
      c.value_type = cand.v.type;
      c.rotate = cand.rotate;
      c.bytes = hc.bytes().total();
      c.error = norm2 > 0 ? std::sqrt(err2 / norm2) : 0.0;
      c.err2 = err2;
      c.norm2 = norm2;
      c.retained_mass = mass;
    }
  }
  return choices;
}

}  // namespace

std::vector<JointChoice> plan_joint(const KvWindow& m, const JointSource& source, const JointOptions& o,
                                    const ProgressFn& progress) {
  check_joint_options(o);
  ScoreOptions so;
  so.window = o.window;
  validate_score_options(so, m);
  const std::size_t L = m.n_layers, H = m.n_kv_heads;
  const double f16_total = 4.0 * static_cast<double>(L * H * m.n_tokens * m.head_dim);
  const double budget = o.bytes_fraction * f16_total;
  const std::vector<JointCandidate> pairs = joint_candidates(o, m.head_dim);
  std::vector<std::vector<JointChoice>> cand(L * H);
  Tensor3 query, key, value;  // each layer in the previous one's storage
  for (std::size_t l = 0; l < L; ++l) {
    source(l, query, key, value);
    parallel_for(H, o.threads, [&](std::size_t h) { cand[l * H + h] = head_choices(m, query, key, value, h, so, o, pairs); });
    if (progress) progress(l + 1, L);
  }
  std::vector<std::vector<double>> err(L * H), cost(L * H);
  for (std::size_t i = 0; i < L * H; ++i) {
    for (const auto& c : cand[i]) {
      err[i].push_back(c.err2);
      cost[i].push_back(static_cast<double>(c.bytes));
    }
  }
  const auto pick = knapsack_real(err, cost, budget);
  std::vector<JointChoice> out;
  for (std::size_t i = 0; i < L * H; ++i) out.push_back(std::move(cand[i][pick[i]]));
  return out;
}

nlohmann::json allocate_joint(const std::string& dump_path, const JointOptions& o,
                              const ProgressFn& progress) {
  DumpReader dump(dump_path);
  const DumpMeta& m = dump.meta();
  require_windows_hold_tokens(m, dump_path, "the joint allocation");
  const std::size_t L = m.n_layers, H = m.n_kv_heads, T = m.n_tokens, d = m.head_dim, W = o.window;
  const std::vector<JointChoice> choice = plan_joint(
      m,
      [&](std::size_t l, Tensor3& q, Tensor3& k, Tensor3& v) {
        dump.read_into(q, l, DumpField::query);
        dump.read_into(k, l, DumpField::key);
        dump.read_into(v, l, DumpField::value);
      },
      o, progress);
  const double f16_total = 4.0 * static_cast<double>(L * H * T * d);
  ScoreOptions so;
  so.window = W;
  EvictionParams ep;
  ep.score = so;
  ep.alloc = AllocMethod::joint;
  BudgetsFile f;
  f.dump_path = dump_path;
  f.dump_hash = file_hash(dump_path);
  f.shape = m;
  std::uint64_t bytes = 0, tokens = 0;
  double err2 = 0, norm2 = 0;
  for (std::size_t l = 0; l < L; ++l) {
    const auto& kinds = dump.layer(l).head_kinds;
    auto& layer = f.heads.emplace_back();
    for (std::size_t h = 0; h < H; ++h) {
      const JointChoice& c = choice[l * H + h];
      BudgetHead b;
      b.tokens = c.kept.size();
      b.key_bits = c.key_bits;
      b.value_bits = c.value_bits;
      if (!c.key_type.empty()) b.key_type = c.key_type;
      if (!c.value_type.empty()) b.value_type = c.value_type;
      if (o.rotate != RotationKind::none) b.rotate = rotation_name(c.rotate);
      b.bytes = c.bytes;
      b.predicted_error = c.error;
      if (!kinds.empty()) b.kind = kinds[h];
      layer.push_back(b);
      bytes += c.bytes;
      tokens += c.kept.size();
      err2 += c.err2;
      norm2 += c.norm2;
    }
  }
  f.summary = {{"params", ep.to_json()},
               {"budget_tokens_per_head", tokens / (L * H)},
               {"forced_tokens_per_head", W},
               {"total_tokens", tokens},
               {"fraction", static_cast<double>(tokens) / static_cast<double>(L * H * T)}};
  f.joint = {{"bytes_fraction", o.bytes_fraction}, {"bytes_budget", o.bytes_fraction * f16_total},
             {"f16_bytes", f16_total}, {"predicted_bytes", bytes},
             {"predicted_error", norm2 > 0 ? std::sqrt(err2 / norm2) : 0.0}, {"bits", o.bits}, {"keep", o.keep},
             {"f16_option", o.f16_option}, {"group", o.group}, {"residual", o.residual},
             {"quant_rule", quant_rule_name(o.rule)}, {"quant", "kivi (keys per channel, values per token)"}};
  if (!o.types.empty()) f.joint["cache_types"] = o.types;
  if (o.rotate != RotationKind::none) {
    f.joint["rotate"] = rotation_name(o.rotate);
    f.joint["rotate_seed"] = o.rotate_seed;
    f.joint["rotate_choice"] = o.rotate_choice;
  }
  return budgets_to_json(f);
}

EvictionPlan joint_plan(const KvWindow& m, const JointSource& source, const CompressParams& params,
                        int threads, const ProgressFn& progress, CompressParams& per_head) {
  const EvictionParams& e = *params.eviction();
  if (params.method != Quantizer::kivi) {
    throw UsageError("joint chooses per-head bits: add --quant kivi (or a kivi preset)",
                     {"", "--quant", quantizer_name(params.method)});
  }
  if (!e.budget_fraction) {
    throw UsageError("joint takes its byte budget as --budget F (fraction of the f16 size)", {"", "--budget"});
  }
  JointOptions jo;
  jo.bytes_fraction = *e.budget_fraction;
  jo.window = e.score.window;
  jo.group = params.key.group;
  jo.residual = params.residual;
  jo.rule = params.rule;
  jo.rotate = params.rotate;
  jo.rotate_seed = params.rotate_seed;
  jo.rotate_choice = e.rotate_choice;
  jo.types = e.cache_types;
  jo.threads = threads;
  const std::vector<JointChoice> choice = plan_joint(m, source, jo, progress);
  EvictionPlan plan;
  plan.params = e;
  plan.n_tokens = m.n_tokens;
  plan.forced = std::min(m.n_tokens, e.score.window);
  plan.heads.assign(m.n_layers, std::vector<HeadPlan>(m.n_kv_heads));
  per_head.head_bits.clear();
  per_head.head_rotate.clear();
  per_head.head_tensor_types.clear();
  std::size_t total = 0;
  for (std::size_t i = 0; i < choice.size(); ++i) {
    HeadPlan& hp = plan.heads[i / m.n_kv_heads][i % m.n_kv_heads];
    hp.kept = choice[i].kept;
    hp.tokens = hp.kept.size();
    hp.retained_mass = choice[i].retained_mass;
    per_head.head_bits.emplace_back(choice[i].key_bits, choice[i].value_bits);
    if (jo.rotate_choice) per_head.head_rotate.push_back(choice[i].rotate);
    if (!jo.types.empty()) per_head.head_tensor_types.emplace_back(choice[i].key_type, choice[i].value_type);
    total += hp.tokens;
  }
  plan.budget_per_head = total / choice.size();
  return plan;
}

std::string render_joint(const nlohmann::json& j) {
  const auto& jt = j["joint"];
  std::string out = fmt::format(
      "joint allocation: budget {:.0f} bytes ({:.3f} of f16), predicted {} bytes, predicted "
      "attention output error {:.4g}; {} tokens kept ({:.3f} of the cache)\n",
      jt["bytes_budget"].get<double>(), jt["bytes_fraction"].get<double>(), jt["predicted_bytes"].get<std::uint64_t>(),
      jt["predicted_error"].get<double>(), j["summary"]["total_tokens"].get<std::size_t>(),
      j["summary"]["fraction"].get<double>());
  const bool rotated = jt.contains("rotate");  // each head's rotation, a column
  // A tensor's storage: its bits (f16 for 16) or, at bits 0, its cache type.
  auto storage = [](const nlohmann::json& h, const char* bits, const char* type) {
    const int b = h[bits].get<int>();
    return b == 0 ? h[type].get<std::string>() : b == 16 ? std::string("f16") : std::to_string(b);
  };
  std::size_t w = 5;
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) {
      w = std::max({w, storage(h, "key_bits", "key_type").size(), storage(h, "value_bits", "value_type").size()});
    }
  }
  out += fmt::format("{:>5} {:>4} {:>7} {:>{}} {:>{}} {}{:>10} {:>10}  {}\n", "layer", "head", "tokens", "K", w, "V", w,
                     rotated ? fmt::format("{:>8} ", "rotate") : "", "bytes", "error", "kind");
  for (const auto& l : j["layers"]) {
    for (const auto& h : l["heads"]) {
      out += fmt::format("{:>5} {:>4} {:>7} {:>{}} {:>{}} {}{:>10} {:>10.4g}  {}\n", l["layer"].get<int>(),
                         h["head"].get<int>(), h["tokens"].get<std::size_t>(), storage(h, "key_bits", "key_type"), w,
                         storage(h, "value_bits", "value_type"), w,
                         rotated ? fmt::format("{:>8} ", h.value("rotate", "none")) : "", h["bytes"].get<std::uint64_t>(),
                         h["predicted_error"].get<double>(), h.value("kind", "-"));
    }
  }
  return out;
}

}  // namespace akv
