// The attention's vector loops compiled for AVX-512 (see kernels_simd.h).
#define AKV_SIMD_HEADER "akv/attention/kernels_simd.h"
#include "akv/attention/avx512_unit.h"
