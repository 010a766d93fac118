#pragma once
// `akv info`: identifies an akv file by its root `format` attribute and describes it.
#include <nlohmann/json.hpp>
#include <string>

#include "akv/io/dump.h"

namespace akv {

// The root `format` attribute of an HDF5 file ("akv-dump", "akv-cache"); InvalidInput if absent.
std::string read_file_format(const std::string& path);
// True when the file starts with HDF5's signature (no other check).
bool is_hdf5(const std::string& path);

// Structured description of a dump (schema in docs/formats.md, "akv info --json"). Throws like the
// format's reader: IoError, CorruptData, InvalidInput.
// With `stats`, also reads every tensor (a head at a time) and adds per-layer statistics:
// min, max, mean, std, absmax of each dataset, and for keys the outlier-channel ratio
// (largest channel absmax / median channel absmax, worst head).
nlohmann::json inspect_file(const std::string& path, bool stats = false);

// The shape fields that akv info gives dumps and caches alike (model, n_layers, n_heads,
// n_kv_heads, head_dim, n_tokens, n_query), set in j.
void shape_json(const DumpMeta& m, nlohmann::json& j);

// Human-readable rendering of inspect_file()'s result: summary lines and a per-layer table.
std::string render_info(const nlohmann::json& info);

}  // namespace akv
