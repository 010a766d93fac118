#pragma once
// Element types that akv stores on disk. In memory akv computes in f32.
#include <cstddef>
#include <string>

namespace akv {

enum class DType { f32, f16, bf16 };

std::string dtype_name(DType t);         // "f32", "f16", "bf16"
std::size_t dtype_size(DType t);         // bytes per element
DType parse_dtype(const std::string& s);  // throws InvalidInput naming the value

}  // namespace akv
