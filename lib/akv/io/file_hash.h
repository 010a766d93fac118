#pragma once
// Content hash of a file: XXH3-64 of its bytes (libxxhash), as "xxh3-64:<16 hex digits>".
// `xxhsum -H3 FILE` prints the same 16 digits. Used to tie a compressed cache to its dump.
#include <string>

namespace akv {

std::string file_hash(const std::string& path);  // throws IoError naming the file

}  // namespace akv
