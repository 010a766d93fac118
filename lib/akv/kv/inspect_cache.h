#pragma once
// `akv info` on a compressed cache: method and parameters, source dump, and bytes per component
// (from the stored dataset sizes) per layer and in total, next to the f16 size.
#include <nlohmann/json.hpp>
#include <string>

namespace akv {

nlohmann::json inspect_cache(const std::string& path);
std::string render_cache_info(const nlohmann::json& info);

}  // namespace akv
