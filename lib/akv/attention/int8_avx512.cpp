// The integer attention loops compiled for AVX-512 VL + VNNI (see int8_simd.h); int8.cpp calls
// it only when the CPU has AVX-512 VNNI and the avx512 instruction set is active.
#define AKV_SIMD_HEADER "akv/attention/int8_simd.h"
#include "akv/attention/avx512_unit.h"
