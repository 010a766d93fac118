#pragma once
// Command-line flags of the method registry (method/registry.h): one --NAME per parameter, its
// help and range from the registry, its value parsed and checked there.
#include <CLI/CLI.hpp>

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "akv/method/registry.h"

namespace akv::cli {

template <typename T>
void add_optional(CLI::App* sub, const std::string& name, std::optional<T>& target,
                  const std::string& help) {
  sub->add_option_function<T>(name, [&target](const T& v) { target = v; }, help);
}

// Adds every registry parameter of the given scopes (except those named in `skip`) as a flag
// writing into `request` (which must outlive the parse).
inline void add_method_flags(CLI::App* sub, CompressRequest& request, std::initializer_list<ParamScope> scopes,
                             std::initializer_list<std::string> skip = {}) {
  const char* prefix[] = {"", "", "tiered: ", "ggml: "};
  for (const ParamInfo& p : param_registry()) {
    bool wanted = false;
    for (ParamScope s : scopes) wanted = wanted || s == p.scope;
    for (const std::string& s : skip) wanted = wanted && s != p.name;
    if (!wanted) continue;
    const std::string flag = std::string("--") + p.name;
    const std::string help = prefix[static_cast<int>(p.scope)] + param_help(p);
    const ParamInfo* info = &p;
    if (std::holds_alternative<ParamInfo::Flag>(p.field)) {
      sub->add_flag_callback(flag, [&request, info, flag] { set_param(request, *info, "", flag); }, help);
    } else {
      const char* type = std::holds_alternative<ParamInfo::Integer>(p.field) ? "INT"
                         : std::holds_alternative<ParamInfo::Real>(p.field)  ? "NUMBER"
                                                                              : "TEXT";
      sub->add_option_function<std::string>(
             flag, [&request, info, flag](const std::string& v) { set_param(request, *info, v, flag); }, help)
          ->type_name(type);
    }
  }
}

}  // namespace akv::cli
