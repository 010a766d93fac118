#include "akv/core/isa.h"

#include <algorithm>
#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

// AMD family 0x19 (Zen 3 and Zen 4; only Zen 4 has AVX-512) with AVX-512.
bool detect_avx512_halves() {
#if defined(__x86_64__) || defined(__i386__)
  if (best_isa() != Isa::avx512 || !__builtin_cpu_is("amd")) return false;  // best_isa ran __builtin_cpu_init
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const unsigned base = (a >> 8) & 0xF, family = base == 0xF ? base + ((a >> 20) & 0xFF) : base;
  return family == 0x19;
#else
  return false;
#endif
}

std::atomic<bool>& halves_setting() {
  static std::atomic<bool> halves{detect_avx512_halves()};
  return halves;
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

bool avx512_halves() { return halves_setting().load(std::memory_order_relaxed); }

void set_avx512_halves(bool on) { halves_setting().store(on); }

const char* kernel_arithmetic() { return active_isa() == Isa::generic ? "generic" : "vector"; }

}  // namespace akv
