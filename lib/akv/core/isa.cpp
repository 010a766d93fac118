#include "akv/core/isa.h"

#include <algorithm>
#include <atomic>

namespace akv {
namespace {

Isa detect_isa() {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#ifdef AKV_AVX512_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
    return Isa::avx512;
  }
#endif
  return Isa::avx2;
#else
  return Isa::generic;
#endif
}

std::atomic<Isa>& isa_setting() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

}  // namespace

Isa best_isa() {
  static const Isa best = detect_isa();
  return best;
}

Isa active_isa() { return isa_setting().load(std::memory_order_relaxed); }

void set_isa(Isa isa) { isa_setting().store(std::min(isa, best_isa())); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "generic";
  }
}

const char* kernel_arithmetic() { return active_isa() == Isa::generic ? "generic" : "vector"; }

}  // namespace akv
