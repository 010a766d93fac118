#pragma once
// Content hash of a file: XXH3-64 of its bytes (libxxhash), as "xxh3-64:<16 hex digits>".
// `xxhsum -H3 FILE` prints the same 16 digits. Used to tie a compressed cache to its dump.
#include <string>

namespace akv {

std::string file_hash(const std::string& path);  // throws IoError naming the file
// file_hash of a file; of a directory (a Hugging Face model): XXH3-64 of the listing
// "name\0file_hash\n" of its regular files in name order (subdirectories are not read).
std::string path_hash(const std::string& path);

}  // namespace akv
