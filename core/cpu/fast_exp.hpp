#pragma once
// The constants of vitlens' vectorised exp (fast_attention.hpp's kernels, core/cpu/avx2_math.hpp),
// alone in this header so that code built for another instruction set (the AVX2 build of the
// training ops, whose Eigen namespace is renamed) can use them without including Eigen types.

namespace vitlens {

// exp(x) for x <= 0 (softmax arguments): n = round(x / ln 2), r = x - n ln 2 with ln 2 split in a
// high part (12 low bits zero, so n * hi is exact) and a low part, exp(r) on [-ln2/2, ln2/2] by a
// degree-6 polynomial, times 2^n. The coefficients are a minimax fit of the relative error,
// computed for vitlens with a Remez exchange (error 4.3e-9 before float rounding); measured
// against double-precision exp the result is within 1 ulp with FMA, 1.5 without. Below kExpMin
// (= ln FLT_MIN) the result is 0, so exp(-inf) = 0 and no denormal appears.
namespace fast_exp {
constexpr float kLog2e = 1.44269502f;
constexpr float kLn2Hi = 0.693115234f;     // 0x3f317000
constexpr float kLn2Lo = 3.19461833e-05f;  // ln 2 - kLn2Hi
constexpr float kC2 = 0.49999997f, kC3 = 0.166665062f, kC4 = 0.0416670889f, kC5 = 0.00837026257f,
                kC6 = 0.00138934026f;     // exp(r) ~ 1 + r + kC2 r^2 + ... + kC6 r^6
constexpr float kExpMin = -87.3365402f;    // ln(FLT_MIN): 2^n stays a normal float
}  // namespace fast_exp

}  // namespace vitlens
