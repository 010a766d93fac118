#pragma once
// Structure-aware mutation of akv's HDF5 containers (dumps, caches). libhdf5 is not the target
// (it is not built with the fuzzer's instrumentation and has fuzzers of its own); akv's readers
// are. So the input does not become the file's bytes: it drives edits of a copy of a valid file
// through the HDF5 API - attributes set to edge-case integers, reals or strings or removed,
// elements of datasets overwritten (NaN, Inf, out-of-range integers, raw bytes), datasets
// replaced by others of another rank, shape or type (declared sizes up to 2^40 elements with no
// data), links removed or duplicated - and the reader then opens the edited file.
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

namespace akv::fuzz {

// Copies `template_path` to `out_path` and applies 1-4 edits chosen by `fdp`.
void mutate_h5_copy(const std::string& template_path, const std::string& out_path,
                    FuzzedDataProvider& fdp);

}  // namespace akv::fuzz
