// The body of a unit that compiles a header of vector loops (AKV_SIMD_HEADER, defined by the
// unit) once more, for AVX-512, in namespace avx512; CMake adds such units, with their flags,
// only for GCC or Clang on x86-64 (kernels_avx512.cpp, int8_avx512.cpp).
// GCC 12 reports the deliberately undefined pass-through operand inside several 512-bit
// intrinsics (permutexvar, cvtepu32, extract, unpack, shuffle_i32x4) as maybe-uninitialized: a
// false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define AKV_SIMD_NS avx512
#include AKV_SIMD_HEADER
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
