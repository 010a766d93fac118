#include "akv/eval/ruler.h"

#include <fmt/format.h>

#include <algorithm>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/eval/lanes.h"
#include "akv/eval/parts.h"
#include "akv/io/json_file.h"

namespace akv {

namespace {

// Mean of score[first, first + n)[method] in percent.
double mean_score(const std::vector<std::vector<double>>& score, std::size_t first, std::size_t n, std::size_t method) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += score[first + i][method];
  return n ? 100.0 * s / static_cast<double>(n) : 0.0;
}

}  // namespace

double RulerReport::cell(std::size_t method, std::size_t task, std::size_t length) const {
  return mean_score(score, (task * lengths.size() + length) * cell_samples(), cell_samples(), method);
}

double RulerReport::depth_cell(std::size_t method, std::size_t task, std::size_t depth, std::size_t length) const {
  return mean_score(score, (task * lengths.size() + length) * cell_samples() + depth * samples, samples, method);
}

double RulerReport::average(std::size_t method) const {
  double s = 0.0;
  for (const auto& row : score) s += row[method];
  return score.empty() ? 0.0 : 100.0 * s / static_cast<double>(score.size());
}

double RulerReport::cell_bytes(std::size_t method, std::size_t task, std::size_t length) const {
  const std::size_t n = cell_samples(), first = (task * lengths.size() + length) * n;
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(kv_bytes[first + i][method]);
  return n ? s / static_cast<double>(n) : 0.0;
}

double RulerReport::mean_bytes(std::size_t method) const { return mean_of_method(kv_bytes, method); }

double RulerReport::mean_peak_bytes(std::size_t method) const { return mean_of_method(peak_kv_bytes, method); }

nlohmann::json RulerReport::to_json() const {
  nlohmann::json j = {{"format", "akv-ruler"}, {"version", 1},         {"tasks", tasks},
                      {"lengths", lengths},    {"samples", samples},   {"answer_prefix", prefix},
                      {"question", query_aware ? "compressed with the context" : "decoded after compression"},
                      {"metric", "string_match_all, percent"}};
  j["prompt_tokens"] = json_grid(tasks.size(), lengths.size(), [&](std::size_t t, std::size_t l) {  // mean of each cell
    const std::size_t n = cell_samples();
    std::size_t s = 0;
    for (std::size_t i = 0; i < n; ++i) s += prompt_tokens[(t * lengths.size() + l) * n + i];
    return n ? static_cast<double>(s) / static_cast<double>(n) : 0.0;
  });
  if (!depths.empty()) j["depths"] = depths;
  nlohmann::json ms = nlohmann::json::array();
  for (std::size_t m = 0; m < specs.size(); ++m) {
    const std::size_t T = tasks.size(), L = lengths.size();
    ms.push_back({{"method", specs[m]},
                  {"base", bases[m]},
                  {"ratio", ratios[m] ? nlohmann::json(*ratios[m]) : nlohmann::json()},
                  {"description", descriptions[m]},
                  {"score", json_grid(T, L, [&](std::size_t t, std::size_t l) { return cell(m, t, l); })},
                  {"average", average(m)},
                  {"kv_bytes", json_grid(T, L, [&](std::size_t t, std::size_t l) { return cell_bytes(m, t, l); })},
                  {"mean_kv_bytes", mean_bytes(m)},
                  {"mean_peak_kv_bytes", mean_peak_bytes(m)}});
    if (!depths.empty()) {  // the needle-in-a-haystack heatmap of each task: [task][depth][length]
      nlohmann::json& heat = ms.back()["depth_score"] = nlohmann::json::array();
      for (std::size_t t = 0; t < T; ++t) {
        heat.push_back(json_grid(depths.size(), L, [&](std::size_t d, std::size_t l) { return depth_cell(m, t, d, l); }));
      }
    }
  }
  j["methods"] = ms;
  return j;
}

std::string RulerReport::leaderboard() const {
  std::vector<double> columns;
  std::vector<std::string> rows;
  for (std::size_t m = 0; m < specs.size(); ++m) {
    if (ratios[m] && std::find(columns.begin(), columns.end(), *ratios[m]) == columns.end()) columns.push_back(*ratios[m]);
    if (std::find(rows.begin(), rows.end(), bases[m]) == rows.end()) rows.push_back(bases[m]);
  }
  if (columns.empty()) return {};
  std::sort(columns.begin(), columns.end());
  std::size_t width = 16;
  for (const std::string& b : rows) width = std::max(width, b.size());
  std::string out = fmt::format("leaderboard: average score (percent, every task and length) by method (rows) x compression "
                                "ratio (columns; none: a method without one)\n{:<{}} {:>7}", "method", width, "none");
  for (double c : columns) out += fmt::format(" {:>7}", format_number(c));
  out += "\n";
  for (const std::string& b : rows) {
    std::vector<std::string> cell(columns.size() + 1);
    for (std::size_t m = 0; m < specs.size(); ++m) {
      if (bases[m] != b) continue;
      const std::size_t col = ratios[m] ? 1 + static_cast<std::size_t>(std::find(columns.begin(), columns.end(), *ratios[m]) - columns.begin()) : 0;
      cell[col] = fmt::format("{:.1f}", average(m));
    }
    out += fmt::format("{:<{}}", b, width);
    for (const std::string& c : cell) out += fmt::format(" {:>7}", c.empty() ? "-" : c);
    out += "\n";
  }
  return out;
}

std::string RulerReport::to_table() const {
  std::string out = fmt::format("ruler: {} samples per cell{}, answer prefix {}, question {}; scores: RULER's string_match_all in percent\n\n",
                                samples, depths.empty() ? "" : fmt::format(" and needle depth ({} depths)", depths.size()), prefix,
                                query_aware ? "compressed with the context" : "decoded after compression");
  const std::string board = leaderboard();
  if (!board.empty()) out += board + "\n";
  out += "by task (rows) x prompt length (columns):\n";
  for (std::size_t m = 0; m < specs.size(); ++m) {
    out += fmt::format("\n{} ({}); cache after the answer {:.2f} MiB, peak resident {:.2f} MiB (means)\n{:<16}", specs[m],
                       descriptions[m], mean_bytes(m) / 1048576.0, mean_peak_bytes(m) / 1048576.0, "task");
    for (std::size_t l : lengths) out += fmt::format(" {:>7}", l);
    out += "\n";
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      out += fmt::format("{:<16}", tasks[t]);
      for (std::size_t l = 0; l < lengths.size(); ++l) out += fmt::format(" {:>7.1f}", cell(m, t, l));
      out += "\n";
    }
    out += fmt::format("{:<16} {:>7.1f}\n", "average", average(m));
    for (std::size_t t = 0; !depths.empty() && t < tasks.size(); ++t) {
      out += fmt::format("{} by needle depth (rows) x prompt length (columns):\n{:<16}", tasks[t], "depth");
      for (std::size_t l : lengths) out += fmt::format(" {:>7}", l);
      out += "\n";
      for (std::size_t d = 0; d < depths.size(); ++d) {
        out += fmt::format("{:<16}", format_number(depths[d]));
        for (std::size_t l = 0; l < lengths.size(); ++l) out += fmt::format(" {:>7.1f}", depth_cell(m, t, d, l));
        out += "\n";
      }
    }
  }
  return out;
}

std::string RulerReport::to_csv() const {
  // With depths, one row per depth (its score; kv_bytes of the whole (task, length)).
  std::string out = depths.empty() ? "method,base,ratio,task,length,samples,score,kv_bytes\n"
                                   : "method,base,ratio,task,length,depth,samples,score,kv_bytes\n";
  for (std::size_t m = 0; m < specs.size(); ++m) {
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      for (std::size_t l = 0; l < lengths.size(); ++l) {
        const std::string head = fmt::format("{},{},{},{},{}", specs[m], bases[m], ratios[m] ? format_number(*ratios[m]) : "",
                                             tasks[t], lengths[l]);
        if (depths.empty()) {
          out += fmt::format("{},{},{},{}\n", head, samples, format_number(cell(m, t, l)), format_number(cell_bytes(m, t, l)));
        }
        for (std::size_t d = 0; d < depths.size(); ++d) {
          out += fmt::format("{},{},{},{},{}\n", head, format_number(depths[d]), samples,
                             format_number(depth_cell(m, t, d, l)), format_number(cell_bytes(m, t, l)));
        }
      }
    }
  }
  return out;
}

RulerReport evaluate_ruler(const Model& model, const Tokenizer& tok, const std::vector<PplMethod>& given,
                           const RulerOptions& o, const ProgressFn& progress) {
  const ModelConfig& c = model.config();
  const std::vector<PplMethod> methods = full_first(given);
  if (tok.vocab_size() > c.vocab_size) {
    throw InvalidInput("tokenizer has more pieces (" + std::to_string(tok.vocab_size()) +
                           ") than the model's vocabulary (" + std::to_string(c.vocab_size) + ")",
                       {tok.path(), "vocab_size", std::to_string(tok.vocab_size())});
  }
  RulerReport r;
  std::vector<const RulerTask*> tasks;
  if (o.tasks.empty()) {
    for (const RulerTask& t : ruler_tasks()) tasks.push_back(&t);
  } else {
    for (const std::string& name : o.tasks) tasks.push_back(&ruler_task(name));
  }
  for (const RulerTask* t : tasks) r.tasks.push_back(t->name);
  const AttentionMode attention = protocol_attention(o.prefill_mode, o.attention);
  for (const auto& m : methods) {
    r.specs.push_back(m.spec);
    r.descriptions.push_back(method_description(m, o.attention, o.prefill_mode));
  }
  for (const PplMethod& m : methods) {
    const auto sweep = std::find_if(o.ratio_specs.begin(), o.ratio_specs.end(), [&](const RatioSpec& x) { return x.spec == m.spec; });
    const bool swept = m.params && sweep != o.ratio_specs.end();
    r.bases.push_back(swept ? sweep->base : m.spec);
    r.ratios.push_back(swept ? sweep->ratio : std::nullopt);
  }
  r.lengths = o.lengths;
  r.depths = o.depths;
  for (double d : o.depths) {
    if (!(d >= 0.0 && d <= 1.0)) throw InvalidInput("a depth outside [0, 1]", {"", "--depths", format_number(d)});
  }
  for (const RulerTask* t : tasks) {
    if (!o.depths.empty() && !ruler_task_has_depth(t->name)) {
      throw InvalidInput("--depths place the needles of the niah_* tasks; this task has none", {"", "--tasks", t->name});
    }
  }
  r.samples = o.samples;
  r.prefix = answer_prefix_name(o.prefix);
  r.query_aware = o.query_aware;
  auto answer_tokens = [&](std::size_t t) { return o.answer_tokens ? o.answer_tokens : tasks[t]->answer_tokens; };
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    for (std::size_t len : o.lengths) {
      if (len > model.position_limit() || answer_tokens(t) > model.position_limit() - len) {
        throw InvalidInput("prompt plus answer longer than " + model.limit_text(),
                           {"", "--lengths", std::to_string(len)});
      }
    }
  }
  const std::size_t per_cell = r.cell_samples();  // samples x depths of one (task, length)
  const std::size_t total = checked_product({tasks.size(), o.lengths.size(), std::max<std::size_t>(o.depths.size(), 1), o.samples},
                                            {"", "--samples", std::to_string(o.samples)});
  const auto [lo, hi] = o.shard.range(total);
  r.first_sample = lo;
  r.total_samples = total;
  // Grid order: task, length, [depth,] sample. Every (task, length) builds its first sample
  // before any work, so that a length too short for a task fails at once.
  auto sample = [&](std::size_t j) {
    const std::size_t t = j / (per_cell * o.lengths.size()), l = j / per_cell % o.lengths.size(), k = j % per_cell;
    const std::optional<double> depth = o.depths.empty() ? std::nullopt : std::optional<double>(o.depths[k / o.samples]);
    return make_ruler_sample(tok, *tasks[t], o.lengths[l], k % o.samples, o.seed, o.prefix, depth);
  };
  if (o.samples) {
    for (std::size_t j = 0; j < total; j += per_cell) sample(j);
  }
  r.score.assign(hi - lo, std::vector<double>(methods.size(), 0.0));
  r.kv_bytes.assign(hi - lo, std::vector<std::uint64_t>(methods.size(), 0));
  r.peak_kv_bytes.assign(hi - lo, std::vector<std::uint64_t>(methods.size(), 0));
  r.prompt_tokens.assign(hi - lo, 0);
  std::vector<std::optional<CompressParams>> params;
  for (const auto& m : methods) params.push_back(m.params);
  std::size_t longest = 0;
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    for (std::size_t len : o.lengths) longest = std::max(longest, len + answer_tokens(t));
  }
  const std::size_t batch = resolve_batch(o.batch, hi - lo, methods.size(), c, longest);
  const KvzipPrompts zip = kvzip_prompts(tok);
  for (std::size_t b0 = lo; b0 < hi; b0 += batch) {
    const std::size_t nb = std::min(batch, hi - b0);
    std::vector<RulerSample> jobs;
    std::vector<std::vector<std::int32_t>> prompts(nb), questions(nb);
    std::vector<std::size_t> n(nb);
    for (std::size_t i = 0; i < nb; ++i) {
      jobs.push_back(sample(b0 + i));
      prompts[i] = jobs[i].tokens;
      if (!o.query_aware) {  // the context alone; the question goes through the compressed cache
        const auto q = prompts[i].begin() + static_cast<std::ptrdiff_t>(jobs[i].question_pos);
        questions[i].assign(q, prompts[i].end());
        prompts[i].erase(q, prompts[i].end());
      }
      n[i] = answer_tokens((b0 + i) / (per_cell * o.lengths.size()));
      r.prompt_tokens[b0 + i - lo] = jobs[i].tokens.size();
    }
    const Continuations out = continue_lanes(model, prompts, n, params, o.threads, attention, nullptr,
                                               o.query_aware ? nullptr : &questions, o.prefill_mode, &zip);
    for (std::size_t i = 0; i < nb; ++i) {
      for (std::size_t m = 0; m < methods.size(); ++m) {
        r.kv_bytes[b0 + i - lo][m] = out.bytes[i * methods.size() + m];
        r.peak_kv_bytes[b0 + i - lo][m] = out.peak_bytes[i * methods.size() + m];
        r.score[b0 + i - lo][m] = ruler_score(tok.decode(out.tokens[i * methods.size() + m]), jobs[i].expected);
      }
    }
    if (progress) progress(b0 + nb - lo, hi - lo);
  }
  return r;
}

}  // namespace akv
