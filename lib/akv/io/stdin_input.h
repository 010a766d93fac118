#pragma once
// "-" as the path of a text input: standard input, read whole at its first use and kept for the
// run, so that every reader sees the same bytes (a side file is read more than once: its method,
// its fields, its hash). Takes "-": the JSON side files (budgets, calibration: io/json_file.h),
// --text and --tokens (io/token_file.h) and their hashes (io/file_hash.h). HDF5 files (dumps,
// caches) need a seekable file and take no "-".
#include <string>

namespace akv {

inline bool is_stdin_path(const std::string& path) { return path == "-"; }

// Standard input's bytes, read to its end on the first call (thread-safe); IoError naming "-"
// when it cannot be read, InvalidInput above 1 GiB.
const std::string& stdin_bytes();

}  // namespace akv
