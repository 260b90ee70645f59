#pragma once
// Constants shared by the vector GELU kernels (gemm_avx2.cpp, gemm_avx512.cpp).
namespace vitlens::detail::gelu_erf {

// erfc(a) ~ (kA1 t + kA2 t^2 + ... + kA5 t^5) exp(-a^2), t = 1 / (1 + kP a), a >= 0: Abramowitz &
// Stegun, Handbook of Mathematical Functions, 7.1.26 (absolute error <= 1.5e-7). GELU multiplies
// the error by |x| / 2 and erfc(a) underflows for a > 9.2: the result is within 1e-6 of the
// std::erf formula (absolute below 1, relative above), which tests/test_gemm.cpp checks on a
// sweep of all floats. Why this form: erfc directly, so x * Phi(x) for x < 0 has no cancellation.
constexpr float kP = 0.3275911f;
constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f,
                kA5 = 1.061405429f;
constexpr float kInvSqrt2 = 0.70710678118654752f;

}  // namespace vitlens::detail::gelu_erf
