#pragma once
// 16-lane AVX-512F math shared by the vector kernels: avx2_math.hpp's exp, exact GELU and GELU's
// derivative at 16 lanes. Included by fast_attention_avx512.cpp and gemm_avx512.cpp (baseline
// x86-64 files: the target attribute makes these AVX-512 code) and by the AVX-512 build of
// train_ops.cpp. Internal linkage: each file keeps its own copy.
#if defined(__x86_64__)
// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own _mm512_undefined_*
// placeholders when inlined (a known false positive, gone in GCC 13); nothing of ours is
// uninitialised. Clang has no -Wmaybe-uninitialized (it would warn about the pragma itself). The
// pragmas hold to the end of the including file, so include this header before <immintrin.h>.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/cpu/gemm_simd.hpp"
#include "core/cpu/fast_exp.hpp"  // constants only

#define VITLENS_AVX512 __attribute__((target("avx512f,avx2,fma")))

namespace vitlens::detail {
namespace {

// fast_exp at 16 lanes: n = round(x log2 e), r = x - n ln 2, 2^n exp(r); x <= 0 here. vscalefps
// multiplies by 2^n in one instruction (exact: p is in [0.70, 1.42] and n >= -126, as in exp8),
// and its zero-masking form gives 0 below kExpMin (and for -inf, where r would be NaN).
VITLENS_AVX512 inline __m512 exp16(__m512 x) {
  using namespace fast_exp;
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kC6), r, _mm512_set1_ps(kC5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(in_range, p, n);
}

// avx2_math.hpp's erfc_parts8: with a = |x| / sqrt 2, erfc(a) ~ poly e, e = exp(-x^2 / 2).
struct ErfcParts16 {
  __m512 poly, e;
};

VITLENS_AVX512 inline ErfcParts16 erfc_parts16(__m512 x) {
  using namespace gelu_erf;
  const __m512 a = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(_mm512_mul_ps(x, _mm512_set1_ps(kInvSqrt2))), _mm512_set1_epi32(0x7fffffff)));
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(kP), a, _mm512_set1_ps(1.0f)));
  __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(kA5), t, _mm512_set1_ps(kA4));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA3));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA2));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA1));
  poly = _mm512_mul_ps(poly, t);
  return {poly, exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)))};
}

// avx2_math.hpp's gelu8 at 16 lanes (gelu16_from: on erfc_parts16(x), shared with the slope).
VITLENS_AVX512 inline __m512 gelu16_from(__m512 x, const ErfcParts16& p) {
  const __m512 y = _mm512_mul_ps(p.poly, p.e);
  const __mmask16 nonzero = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  const __m512 half = _mm512_maskz_mov_ps(nonzero, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), y));
  const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  return _mm512_mask_blend_ps(positive, half, _mm512_sub_ps(x, half));
}
VITLENS_AVX512 inline __m512 gelu16(__m512 x) { return gelu16_from(x, erfc_parts16(x)); }

// avx2_math.hpp's gelu_slope8 at 16 lanes: Phi(x) + x phi(x), one exp for both terms.
VITLENS_AVX512 inline __m512 gelu_slope16_from(__m512 x, const ErfcParts16& p) {
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const __m512 half_erfc = _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(p.poly, p.e));
  const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 cdf = _mm512_mask_blend_ps(positive, half_erfc, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc));
  const __mmask16 e_nonzero = _mm512_cmp_ps_mask(p.e, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  const __m512 density = _mm512_maskz_mov_ps(e_nonzero, _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(kInvSqrt2Pi)), p.e));
  return _mm512_add_ps(cdf, density);
}
VITLENS_AVX512 inline __m512 gelu_slope16(__m512 x) { return gelu_slope16_from(x, erfc_parts16(x)); }

}  // namespace
}  // namespace vitlens::detail

#endif  // __x86_64__
