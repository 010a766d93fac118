#pragma once
// One switch for every vector kernel (decode attention, int8 attention, weight products): the
// instruction set they run. avx2: x86-64-v3 (AVX2, FMA, F16C: the build's baseline); avx512: the
// same loops compiled again for AVX-512 F/VL/BW/DQ, chosen at run time when the CPU has them
// (the int8 loops also need VNNI, else they run their AVX2 form). AVX2 and AVX-512 give bitwise
// identical results; the plain loops (generic) sum in another order and agree within float
// rounding.
namespace akv {

enum class Isa { generic, avx2, avx512 };

Isa best_isa();                 // what this build and CPU support
Isa active_isa();               // in use: best_isa() unless set_isa chose a lower one
void set_isa(Isa isa);          // clamps to best_isa(); process-wide (`akv --max-isa`, benchmarks, tests)
const char* isa_name(Isa isa);  // "generic", "avx2", "avx512"
// The arithmetic of the active kernels, for the params of a sharded run's part: "generic" (the
// plain loops of --max-isa generic sum in another order) or "vector" (AVX2 and AVX-512 give the
// same bits), so parts of the two do not merge into one report.
const char* kernel_arithmetic();
// Whether the CPU runs AVX-512 on 256-bit units (AMD Zen 4, i.e. AMD family 0x19 with AVX-512:
// each 512-bit operation takes two passes). There the attention loops that hold two rows per
// 512-bit register for two query heads run slower than the 256-bit loops, and faster on CPUs
// with 512-bit units (docs/attention.md); the two give the same bits. Detected once;
// set_avx512_halves overrides it process-wide (tests run both loops).
bool avx512_halves();
void set_avx512_halves(bool on);

}  // namespace akv
