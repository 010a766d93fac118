#pragma once
// Build identity of akv, fixed at configure time.
#include <string>

namespace akv {

std::string version();     // semantic version, e.g. "0.1.0"
std::string git_commit();  // short commit hash, or "unknown" outside a git checkout

}  // namespace akv
