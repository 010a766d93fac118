#include "akv/tensor/dtype.h"

#include "akv/core/errors.h"

namespace akv {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  throw InvalidInput("unknown dtype (expected f32, f16 or bf16)", {"", "dtype", s});
}

}  // namespace akv
