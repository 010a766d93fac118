// The attention's vector loops compiled for AVX-512 (see kernels_simd.h); CMake adds this file,
// with its flags, only for GCC or Clang on x86-64.
// GCC 12 reports the deliberately undefined pass-through operand inside several 512-bit
// intrinsics (permutexvar, cvtepu32, extract) as maybe-uninitialized: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define AKV_SIMD_NS avx512
#include "akv/attention/kernels_simd.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
