#pragma once
// `akv evaluate --dump D --methods A,B,...`: several methods' fidelity on one dump in one run.
// Each method is compressed from the dump into a scratch cache (a temporary file in the system's
// temporary directory, $TMPDIR, removed once evaluated and on a fatal signal; up to eight at a
// time) and evaluated against the dump with the others of its batch (evaluate_caches): the
// figures `akv compress` then `akv evaluate --dump --cache` give, without a cache path.
#include <string>
#include <vector>

#include "akv/core/progress.h"
#include "akv/eval/fidelity.h"
#include "akv/eval/model_run.h"
#include "akv/eval/perplexity.h"

namespace akv {

struct MethodFidelity {
  std::string spec;        // as given: name[:flag=value...]
  FidelityReport report;   // cache_path empty
};

// Each spec resolved, before any work: UsageError / InvalidInput naming a bad one; the reference
// `full` has no cache and is refused (UsageError naming it).
std::vector<PplMethod> resolve_dump_methods(const std::vector<std::string>& specs);

// Each method in order (every one with parameters: resolve_dump_methods), on `threads`.
std::vector<MethodFidelity> evaluate_methods(const std::string& dump_path, const std::vector<PplMethod>& methods,
                                             int threads, const ProgressFn& progress);

// The reports: a table (one row per method: bytes, bits per element, ratio to f16, the overall
// metrics, retained attention mass and needle survival when the method evicts), CSV (the same
// columns) or JSON (format akv-fidelity-methods v1: the dump, then per method its spec and its
// evaluate --json report).
std::string render_method_fidelity(const std::string& dump_path, const std::vector<MethodFidelity>& rows,
                                   ReportFormat format);

}  // namespace akv
