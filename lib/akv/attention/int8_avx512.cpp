// The integer attention loops compiled for AVX-512 VL + VNNI (see int8_simd.h); CMake adds this
// file, with its flags, only for GCC or Clang on x86-64; int8.cpp calls it only when the CPU has
// AVX-512 VNNI and the avx512 instruction set is active.
// GCC 12 reports the deliberately undefined pass-through operand inside several 512-bit
// intrinsics (unpack, shuffle_i32x4) as maybe-uninitialized: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define AKV_SIMD_NS avx512
#include "akv/attention/int8_simd.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
