#include "akv/kv/inspect_cache.h"

#include <fmt/format.h>

#include "akv/io/inspect.h"
#include "akv/kv/compress.h"

namespace akv {

nlohmann::json inspect_cache(const std::string& path) {
  CacheReader cache(path);
  const DumpMeta& m = cache.meta();
  const MemoryReport mem = cache_memory(cache);
  nlohmann::json j = mem.to_json();
  j["file"] = path;
  j["kind"] = "cache";
  j["format"] = kCacheFormat;
  j["version"] = cache.version();
  j["bytes_on_disk"] = cache.file_bytes();
  shape_json(m, j);
  return j;
}

std::string render_cache_info(const nlohmann::json& j) {
  std::string out;
  auto line = [&](const char* k, const std::string& v) { out += fmt::format("{:<12} {}\n", k, v); };
  const auto& p = j["params"];
  line("file", j["file"].get<std::string>());
  line("format", fmt::format("akv-cache v{}", j["version"].get<int>()));
  line("method", p.dump());
  line("source", fmt::format("{} ({}, {} bytes)", j["source"]["path"].get<std::string>(),
                             j["source"]["hash"].get<std::string>(),
                             j["source"]["bytes"].get<std::uint64_t>()));
  line("model", fmt::format("{}: {} layers, {} heads / {} kv heads, head_dim {}, {} tokens",
                            j["model"].get<std::string>(), j["n_layers"].get<int>(),
                            j["n_heads"].get<int>(), j["n_kv_heads"].get<int>(),
                            j["head_dim"].get<int>(), j["n_tokens"].get<int>()));
  line("stored", fmt::format("{} bytes = {:.3f} bits/element, {:.2f}x smaller than f16 ({} bytes)",
                             j["bytes"]["total"].get<std::uint64_t>(),
                             j["bits_per_element"].get<double>(),
                             j["compression_ratio"].get<double>(),
                             j["f16_bytes"].get<std::uint64_t>()));
  line("on disk", fmt::format("{} bytes (stored data plus HDF5 metadata)",
                              j["bytes_on_disk"].get<std::uint64_t>()));
  out += "\n";
  const char* cols[] = {"codes", "scales", "zeros", "residual", "outliers", "indices", "total"};
  out += fmt::format("{:>5}", "layer");
  for (const char* c : cols) out += fmt::format(" {:>12}", c);
  out += "\n";
  auto row = [&](const std::string& name, const nlohmann::json& b) {
    out += fmt::format("{:>5}", name);
    for (const char* c : cols) out += fmt::format(" {:>12}", b[c].get<std::uint64_t>());
    out += "\n";
  };
  for (const auto& l : j["layers"]) row(std::to_string(l["layer"].get<int>()), l);
  row("all", j["bytes"]);
  return out;
}

}  // namespace akv
