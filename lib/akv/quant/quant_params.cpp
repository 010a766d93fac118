#include "akv/quant/quant_params.h"

#include <algorithm>

namespace akv {

std::size_t quantized_rows(std::size_t n, QuantAxis axis, std::size_t group, std::size_t residual,
                           QuantRule rule) {
  if (axis == QuantAxis::token) return n - std::min(n, residual);
  if (rule == QuantRule::kivi) return residual > 0 ? n - n % residual : n / group * group;
  return (n - std::min(n, residual)) / group * group;
}

std::string quantizer_name(Quantizer q) {
  switch (q) {
    case Quantizer::none: return "none";
    case Quantizer::uniform: return "uniform";
    case Quantizer::kivi: return "kivi";
    case Quantizer::nuq: return "nuq";
  }
  return "?";
}

}  // namespace akv
