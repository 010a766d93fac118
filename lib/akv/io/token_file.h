#pragma once
// Token sequences for the model commands: a text file with one sequence of integer ids per
// line (separated by spaces or commas; empty lines skipped), or an HDF5 file (e.g. a dump)
// whose 1-D integer dataset /tokens is one sequence.
#include <cstdint>
#include <string>
#include <vector>

namespace akv {

// Throws IoError (cannot read) or InvalidInput naming the file, line and the bad field.
std::vector<std::vector<std::int32_t>> read_token_file(const std::string& path);

// The whole content of a text file (for tokenizing); IoError when it cannot be read, InvalidInput
// above 1 GiB.
std::string read_text_file(const std::string& path);

}  // namespace akv
