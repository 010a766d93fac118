#include "akv/eval/fidelity_methods.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/params.h"

namespace akv {

std::vector<PplMethod> resolve_dump_methods(const std::vector<std::string>& specs) {
  if (specs.empty()) throw UsageError("no method to evaluate", {"", "--methods"});
  std::vector<PplMethod> out;
  for (const std::string& spec : specs) {
    std::optional<CompressParams> p = resolve_method_spec(spec);
    if (!p) throw UsageError("the reference full has no cache: --dump compares each method with the dump itself", {"", "--methods", spec});
    out.push_back({spec, std::move(p)});
  }
  return out;
}

std::vector<MethodFidelity> evaluate_methods(const std::string& dump_path, const std::vector<PplMethod>& methods,
                                             int threads, const ProgressFn& progress) {
  for (const PplMethod& m : methods) {
    if (!m.params) throw UsageError("the reference full has no cache", {"", "--methods", m.spec});
  }
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) {
    const char* env = std::getenv("TMPDIR");
    throw IoError("no temporary directory for the scratch caches: " + ec.message(), {"", "TMPDIR", env ? env : ""});
  }
  // Up to kBatch methods' caches first (scratch files, never committed: they go when evaluated;
  // the bound keeps the files in flight few), then one pass over the dump for all of them.
  constexpr std::size_t kBatch = 8;
  const std::string scratch_name = (dir / "akv-evaluate-cache.h5").string();
  std::vector<MethodFidelity> out;
  std::string dump_hash;  // the first cache's record of the dump's hash, given to the others
  for (std::size_t first = 0; first < methods.size(); first += kBatch) {
    const std::size_t end = std::min(methods.size(), first + kBatch);
    std::vector<std::unique_ptr<AtomicOutput>> scratch;
    std::vector<std::string> caches;
    for (std::size_t i = first; i < end; ++i) {
      scratch.push_back(std::make_unique<AtomicOutput>(scratch_name));
      const MemoryReport m =
          compress_dump(dump_path, scratch.back()->temp_path(), *methods[i].params, threads, progress, Shard{}, dump_hash);
      dump_hash = m.header.source_hash;
      caches.push_back(scratch.back()->temp_path());
    }
    std::vector<FidelityReport> reports = evaluate_caches(dump_path, caches, threads, true, progress);
    for (std::size_t i = first; i < end; ++i) {
      reports[i - first].cache_path.clear();
      out.push_back({methods[i].spec, std::move(reports[i - first])});
    }
  }
  return out;
}

namespace {

std::string cell(double v) { return fmt::format("{:.3e}", v); }

std::string render_table(const std::vector<MethodFidelity>& rows, bool csv) {
  std::size_t w = 6;
  for (const MethodFidelity& m : rows) w = std::max(w, m.spec.size());
  std::string out = csv ? "method,bytes,bits_per_element,ratio,key_rel_mse,value_rel_mse,attn_rel_err,kl,"
                          "recall_at_1,recall_at_8,recall_at_32,retained_mass,needle_survival\n"
                        : fmt::format("{:<{}} {:>11} {:>8} {:>6} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8}\n",
                                      "method", w, "bytes", "bits/el", "ratio", "key_mse", "value_mse", "attn_err", "kl",
                                      "top1", "top8", "top32", "retained", "needles");
  for (const MethodFidelity& m : rows) {
    const FidelityReport& r = m.report;
    const FidelityMetrics x = metrics(r.total());
    const bool evicts = x.evicted_mass > 1e-9;
    if (csv) {
      out += fmt::format("{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{}\n", m.spec,
                         r.memory.total.total(), r.memory.bits_per_element(), r.memory.ratio(), x.key_rel_mse,
                         x.value_rel_mse, x.attn_rel_err, x.kl, x.recall[0], x.recall[1], x.recall[2], x.retained_mass,
                         r.needles.empty() ? std::string() : fmt::format("{:.9g}", r.needle_survival()));
      continue;
    }
    out += fmt::format("{:<{}} {:>11} {:>8.3f} {:>6.2f} {:>10} {:>10} {:>10} {:>10} {:>7.4f} {:>7.4f} {:>7.4f} {:>8} {:>8}\n",
                       m.spec, w, r.memory.total.total(), r.memory.bits_per_element(), r.memory.ratio(), cell(x.key_rel_mse),
                       cell(x.value_rel_mse), cell(x.attn_rel_err), cell(x.kl), x.recall[0], x.recall[1], x.recall[2],
                       evicts ? fmt::format("{:.4f}", x.retained_mass) : "-",
                       evicts && !r.needles.empty() ? fmt::format("{:.4f}", r.needle_survival()) : "-");
  }
  return out;
}

}  // namespace

std::string render_method_fidelity(const std::string& dump_path, const std::vector<MethodFidelity>& rows,
                                   ReportFormat format) {
  if (format != ReportFormat::json) return render_table(rows, format == ReportFormat::csv);
  nlohmann::json methods = nlohmann::json::array();
  for (const MethodFidelity& m : rows) {
    nlohmann::json j = m.report.to_json();
    j.erase("format");
    j.erase("version");
    j.erase("dump");
    j.erase("cache");
    j["method"] = m.spec;
    methods.push_back(std::move(j));
  }
  return json_text(nlohmann::json{{"format", "akv-fidelity-methods"}, {"version", 1}, {"dump", dump_path}, {"methods", methods}});
}

}  // namespace akv
