#include "akv/io/inspect.h"

#include <cstring>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "akv/core/errors.h"
#include "akv/io/dump.h"
#include "akv/io/json_file.h"

namespace akv {

void shape_json(const DumpMeta& m, nlohmann::json& j) {
  j.update({{"model", m.model}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"n_kv_heads", m.n_kv_heads},
            {"head_dim", m.head_dim}, {"n_tokens", m.n_tokens}, {"n_query", m.n_query}});
}

namespace {

nlohmann::json dataset_json(const DumpDatasetInfo& d, std::size_t d0, std::size_t d1,
                            std::size_t d2) {
  if (!d.present) return nullptr;
  return {{"shape", {d0, d1, d2}},
          {"dtype", h5::disk_float_name(d.dtype)},
          {"bytes", d.storage_bytes}};
}

// Statistics of one dataset of one layer, accumulated head by head in double precision.
nlohmann::json dataset_stats(const DumpReader& r, std::size_t layer, DumpField f) {
  const DumpMeta& m = r.meta();
  const std::size_t heads = f == DumpField::query ? m.n_heads : m.n_kv_heads;
  double lo = INFINITY, hi = -INFINITY, sum = 0.0, sum2 = 0.0, count = 0.0, worst_ratio = 0.0;
  for (std::size_t h = 0; h < heads; ++h) {
    Tensor3 t = r.read(layer, f, h, 1);
    std::vector<double> chan_absmax(m.head_dim, 0.0);
    for (std::size_t row = 0; row < t.dim1(); ++row) {
      const float* x = t.row(0, row);
      for (std::size_t c = 0; c < m.head_dim; ++c) {
        const double v = x[c];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        sum += v;
        sum2 += v * v;
        chan_absmax[c] = std::max(chan_absmax[c], std::fabs(v));
      }
    }
    count += static_cast<double>(t.size());
    std::vector<double> sorted = chan_absmax;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2),
                     sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double top = *std::max_element(chan_absmax.begin(), chan_absmax.end());
    if (median > 0) worst_ratio = std::max(worst_ratio, top / median);
  }
  const double mean = sum / count;
  nlohmann::json j = {{"min", lo},
                      {"max", hi},
                      {"mean", mean},
                      {"std", std::sqrt(std::max(0.0, sum2 / count - mean * mean))},
                      {"absmax", std::max(std::fabs(lo), std::fabs(hi))}};
  if (f != DumpField::query) j["outlier_ratio"] = worst_ratio;
  return j;
}

nlohmann::json inspect_dump(const std::string& path, bool stats) {
  DumpReader r(path);
  const DumpMeta& m = r.meta();
  nlohmann::json j = {{"file", path}, {"kind", "dump"}, {"format", kDumpFormat}, {"version", kDumpVersion},
                      {"bytes_on_disk", r.file_bytes()}, {"group_size", m.group_size()}, {"rope_theta", m.rope_theta},
                      {"rope_layout", rope_layout_name(m.rope_layout)}};
  shape_json(m, j);
  if (!m.rope_variant.empty()) j["rope_variant"] = m.rope_variant;
  if (m.windowed()) j["layer_window"] = m.layer_window;  // 0: a global layer
  // Size of the K/V cache stored as f16: the reference point for compression ratios.
  j["kv_bytes_f16"] = 2ull * 2ull * m.n_layers * m.n_kv_heads * m.n_tokens * m.head_dim;
  bool any_kinds = false;
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    const DumpLayerInfo& li = r.layer(l);
    nlohmann::json lj;
    lj["layer"] = l;
    lj["key"] = dataset_json(li.key, m.n_kv_heads, m.n_tokens, m.head_dim);
    lj["value"] = dataset_json(li.value, m.n_kv_heads, m.n_tokens, m.head_dim);
    lj["query"] = dataset_json(li.query, m.n_heads, m.n_query, m.head_dim);
    lj["key_pre_rope"] = dataset_json(li.key_pre_rope, m.n_kv_heads, m.n_tokens, m.head_dim);
    if (stats) {
      nlohmann::json sj;
      for (DumpField f : {DumpField::key, DumpField::value, DumpField::query,
                          DumpField::key_pre_rope}) {
        if (li.field(f).present) sj[dump_field_name(f)] = dataset_stats(r, l, f);
      }
      lj["stats"] = sj;
    }
    if (!li.head_kinds.empty()) {
      lj["head_kinds"] = li.head_kinds;
      any_kinds = true;
    }
    layers.push_back(lj);
  }
  j["layers"] = layers;
  j["optional"] = {{"key_pre_rope", r.has_key_pre_rope()},
                   {"head_kind", any_kinds},
                   {"tokens", r.tokens().has_value()},
                   {"needles", r.needles().has_value()},
                   {"o_proj", r.has_out_proj()},
                   {"attn_input", r.has_matrix(DumpMatrix::attn_input)},
                   {"kvzip_plus", r.has_matrix(DumpMatrix::kvzip_plus)}};
  if (r.needles()) j["needles"] = *r.needles();
  return j;
}

std::string bytes_human(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

std::string kinds_summary(const nlohmann::json& kinds) {
  std::map<std::string, int> count;
  std::vector<std::string> order;
  for (const auto& k : kinds) {
    std::string s = k.get<std::string>();
    if (count[s]++ == 0) order.push_back(s);
  }
  std::string out;
  for (const auto& s : order) out += fmt::format("{}{}x{}", out.empty() ? "" : " ", s, count[s]);
  return out;
}

std::string render_dump(const nlohmann::json& j) {
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) {
    out += fmt::format("{:<14} {}\n", k, v);
  };
  line("file", j["file"].get<std::string>());
  line("format", fmt::format("{} v{}", j["format"].get<std::string>(), j["version"].get<int>()));
  line("model", j["model"].get<std::string>());
  line("layers", std::to_string(j["n_layers"].get<std::size_t>()));
  line("heads", fmt::format("{} query / {} kv (group {})", j["n_heads"].get<std::size_t>(),
                            j["n_kv_heads"].get<std::size_t>(), j["group_size"].get<std::size_t>()));
  line("head_dim", std::to_string(j["head_dim"].get<std::size_t>()));
  line("rope", fmt::format("theta {} {}{}", j["rope_theta"].get<double>(), j["rope_layout"].get<std::string>(),
                           j.contains("rope_variant") ? " (" + j["rope_variant"].get<std::string>() + ")" : ""));
  if (j.contains("layer_window")) {
    std::map<std::size_t, std::vector<std::string>> layers;  // window -> its layers
    for (std::size_t l = 0; l < j["layer_window"].size(); ++l) {
      layers[j["layer_window"][l].get<std::size_t>()].push_back(std::to_string(l));
    }
    std::string s;
    for (const auto& [w, ls] : layers) {
      const std::string which = fmt::format("{} {}", ls.size() > 1 ? "layers" : "layer", fmt::join(ls, " "));
      s += (s.empty() ? "" : "; ") + (w ? fmt::format("{} tokens in {}", w, which) : "global in " + which);
    }
    line("windows", s);
  }
  line("tokens", fmt::format("{} ({} window queries)", j["n_tokens"].get<std::size_t>(),
                             j["n_query"].get<std::size_t>()));
  line("on disk", fmt::format("{} ({} bytes)", bytes_human(j["bytes_on_disk"].get<double>()),
                              j["bytes_on_disk"].get<std::uint64_t>()));
  line("kv as f16", bytes_human(j["kv_bytes_f16"].get<double>()));
  std::string opt;
  for (const auto& [k, v] : j["optional"].items()) {
    opt += fmt::format("{}{}={}", opt.empty() ? "" : " ", k, v.get<bool>() ? "yes" : "no");
  }
  line("optional", opt);
  if (j.contains("needles")) {
    std::string s;
    for (const auto& p : j["needles"]) s += (s.empty() ? "" : " ") + std::to_string(p.get<int>());
    line("needles", s);
  }
  out += "\n";
  out += fmt::format("{:>5}  {:<22} {:<22} {:<22} {:<12} {:>12}  {}\n", "layer", "key", "value",
                     "query", "key_pre_rope", "bytes", "head kinds");
  auto cell = [](const nlohmann::json& d) -> std::string {
    if (d.is_null()) return "-";
    const auto& s = d["shape"];
    return fmt::format("{} [{}x{}x{}]", d["dtype"].get<std::string>(), s[0].get<std::size_t>(),
                       s[1].get<std::size_t>(), s[2].get<std::size_t>());
  };
  for (const auto& l : j["layers"]) {
    std::uint64_t bytes = 0;
    for (const char* f : {"key", "value", "query", "key_pre_rope"}) {
      if (!l[f].is_null()) bytes += l[f]["bytes"].get<std::uint64_t>();
    }
    out += fmt::format("{:>5}  {:<22} {:<22} {:<22} {:<12} {:>12}  {}\n",
                       l["layer"].get<std::size_t>(), cell(l["key"]), cell(l["value"]),
                       cell(l["query"]), l["key_pre_rope"].is_null() ? "-" : "yes",
                       bytes_human(static_cast<double>(bytes)),
                       l.contains("head_kinds") ? kinds_summary(l["head_kinds"]) : "-");
  }
  if (!j["layers"].empty() && j["layers"][0].contains("stats")) {
    out += fmt::format("\n{:>5}  {:<12} {:>11} {:>11} {:>11} {:>11} {:>11}  {}\n", "layer",
                       "dataset", "min", "max", "mean", "std", "absmax", "outlier ratio");
    for (const auto& l : j["layers"]) {
      for (const auto& [name, s] : l["stats"].items()) {
        out += fmt::format("{:>5}  {:<12} {:>11.4g} {:>11.4g} {:>11.4g} {:>11.4g} {:>11.4g}  {}\n",
                           l["layer"].get<std::size_t>(), name, s["min"].get<double>(),
                           s["max"].get<double>(), s["mean"].get<double>(),
                           s["std"].get<double>(), s["absmax"].get<double>(),
                           s.contains("outlier_ratio")
                               ? fmt::format("{:.2f}", s["outlier_ratio"].get<double>())
                               : "-");
      }
    }
  }
  return out;
}

}  // namespace

bool is_hdf5(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, 8) && std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0;
}

std::string read_file_format(const std::string& path) {
  h5::File f = h5::open_read(path);
  if (!h5::attr_exists(f.get(), "format")) {
    throw InvalidInput("not an akv file (no format attribute)", {path, "format"});
  }
  return h5::read_attr_string(f.get(), "format", path, "format");
}

nlohmann::json inspect_file(const std::string& path, bool stats) {
  const std::string format = read_file_format(path);
  if (format == kDumpFormat) return inspect_dump(path, stats);
  throw InvalidInput("unknown akv file format (this akv knows akv-dump and akv-cache)",
                     {path, "format", format});
}

std::string render_info(const nlohmann::json& info) {
  if (info.value("kind", "") == "dump") return render_dump(info);
  return json_text(info);
}

}  // namespace akv
