#pragma once
// exp in f64 for the softmaxes of the fidelity, calibration and scoring passes (their
// probabilities are f64): within 1 ulp of glibc's exp (tests/unit/test_core.cpp), exactly 0
// below -745.14 (where exp rounds to 0), +inf above 709.79, denormals rounded once, NaN kept.
// x = k ln2 + r with |r| <= ln2 / 2 (k by rounding x log2(e); ln2 in two parts), e^r by its
// degree-13 Taylor polynomial (Horner, fused multiply-adds; the remainder is below 1e-17), then
// times 2^k as two powers of two. The vector loop (AVX2, four lanes) and the scalar one run the
// same correctly rounded operations, so every element gets the same bits whichever runs it, on
// any instruction set or position in the array.
#include <cstddef>

namespace akv {

double exp_f64(double x);
// y[i] = exp_f64(x[i]) for i < n; y may be x.
void exp_f64(const double* x, std::size_t n, double* y);

}  // namespace akv
