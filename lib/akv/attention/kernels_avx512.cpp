// The attention's vector loops compiled for AVX-512 (see kernels_simd.h); CMake adds this file,
// with its flags, only for GCC or Clang on x86-64.
#define AKV_SIMD_NS avx512
#include "akv/attention/kernels_simd.h"
