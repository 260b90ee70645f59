#pragma once
// 8-lane AVX2 + FMA math shared by the vector kernels: lane sum and max, exp (fast_exp.hpp's constants), exact
// GELU (gemm_simd.hpp's erfc form) and GELU's derivative. Included by fast_attention_avx2.cpp and
// gemm_avx2.cpp (baseline x86-64 files: the target attribute makes these AVX2 code) and by the
// AVX2 build of train_ops.cpp. Internal linkage: each file keeps its own copy.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "core/cpu/gemm_simd.hpp"
#include "core/cpu/fast_exp.hpp"  // constants only: no Eigen types in the AVX2 build of train_ops.cpp

#define VITLENS_AVX2 __attribute__((target("avx2,fma")))

namespace vitlens::detail {
namespace {

// The 8 lanes of v folded 8 -> 4 -> 2 -> 1 by op (_mm_add_ps or _mm_max_ps); lane 0 is the result.
template <class Op>
VITLENS_AVX2 inline float fold8(__m256 v, Op op) {
  __m128 s = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = op(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(op(s, _mm_movehdup_ps(s)));
}
VITLENS_AVX2 inline float sum8(__m256 v) {
  return fold8(v, [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
}
VITLENS_AVX2 inline float max8(__m256 v) {
  return fold8(v, [](__m128 a, __m128 b) { return _mm_max_ps(a, b); });
}

// fast_exp at 8 lanes: n = round(x log2 e), r = x - n ln 2, 2^n exp(r); x <= 0 here.
VITLENS_AVX2 inline __m256 exp8(__m256 x) {
  using namespace fast_exp;
  // Below kExpMin (and for -inf, where r is NaN) the lanes are garbage until the final mask.
  const __m256 in_range = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kC6), r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // p is in [0.70, 1.42] and n >= -126: adding n to the exponent field is the exact product 2^n p.
  const __m256i two_n = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), two_n));
  return _mm256_and_ps(p, in_range);
}

// r[u][v] <- r[v][u]: the 8 x 8 square of floats in 8 registers transposed (pairs interleaved,
// then quads, then the 128-bit halves exchanged).
VITLENS_AVX2 inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int u = 0; u < 8; u += 2) {
    t[u] = _mm256_unpacklo_ps(r[u], r[u + 1]);      // r_u0 r_w0 r_u1 r_w1 | r_u4 r_w4 r_u5 r_w5 (w = u + 1)
    t[u + 1] = _mm256_unpackhi_ps(r[u], r[u + 1]);  // columns 2, 3 | 6, 7
  }
  for (int u = 0; u < 8; u += 4) {
    s[u] = _mm256_shuffle_ps(t[u], t[u + 2], 0x44);      // column 0 of four rows | column 4
    s[u + 1] = _mm256_shuffle_ps(t[u], t[u + 2], 0xEE);  // 1 | 5
    s[u + 2] = _mm256_shuffle_ps(t[u + 1], t[u + 3], 0x44);  // 2 | 6
    s[u + 3] = _mm256_shuffle_ps(t[u + 1], t[u + 3], 0xEE);  // 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);      // column c of rows 0-3, then of rows 4-7
    r[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);  // column c + 4
  }
}

// With a = |x| / sqrt 2: erfc(a) ~ poly e, poly = poly(t), t = 1 / (1 + kP a), e = exp(-a^2) =
// exp(-x^2 / 2). erfc(a) / 2 is Phi(x) for x < 0 and 1 - Phi(x) for x >= 0.
struct ErfcParts {
  __m256 poly, e;
};

VITLENS_AVX2 inline ErfcParts erfc_parts8(__m256 x) {
  using namespace gelu_erf;
  const __m256 a =
      _mm256_and_ps(_mm256_mul_ps(x, _mm256_set1_ps(kInvSqrt2)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(kP), a, _mm256_set1_ps(1.0f)));
  __m256 poly = _mm256_fmadd_ps(_mm256_set1_ps(kA5), t, _mm256_set1_ps(kA4));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA3));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA2));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA1));
  poly = _mm256_mul_ps(poly, t);
  return {poly, exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a)))};
}

// GELU(x) = x Phi(x): x - x y / 2 for x >= 0 and x y / 2 below, y = erfc(a) (no cancellation on
// either side). gelu8_from: on erfc_parts8(x), shared with the slope.
VITLENS_AVX2 inline __m256 gelu8_from(__m256 x, const ErfcParts& p) {
  const __m256 y = _mm256_mul_ps(p.poly, p.e);
  // y = 0 (|x| beyond ~13, or infinite): the half product is exactly 0, even for x = +-inf.
  const __m256 half = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), y),
                                    _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256 positive = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_blendv_ps(half, _mm256_sub_ps(x, half), positive);
}
VITLENS_AVX2 inline __m256 gelu8(__m256 x) { return gelu8_from(x, erfc_parts8(x)); }

// GELU'(x) = Phi(x) + x phi(x), phi(x) = e / sqrt(2 pi): one exp for both terms. Where e = 0
// (|x| beyond ~13, or infinite) the second term is exactly 0 (x e would be inf * 0 at +-inf).
VITLENS_AVX2 inline __m256 gelu_slope8_from(__m256 x, const ErfcParts& p) {
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const __m256 half_erfc = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_mul_ps(p.poly, p.e));
  const __m256 positive = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  const __m256 cdf = _mm256_blendv_ps(half_erfc, _mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), positive);
  const __m256 density = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(kInvSqrt2Pi)), p.e),
                                       _mm256_cmp_ps(p.e, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  return _mm256_add_ps(cdf, density);
}
VITLENS_AVX2 inline __m256 gelu_slope8(__m256 x) { return gelu_slope8_from(x, erfc_parts8(x)); }

}  // namespace
}  // namespace vitlens::detail

#endif  // __x86_64__
