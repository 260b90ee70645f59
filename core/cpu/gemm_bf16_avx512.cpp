// The AVX512-BF16 kernel of bf16.hpp: the 8 x 48 tile with vdpbf16ps, and X's rounding with
// vcvtneps2bf16. A target attribute keeps the rest of the binary baseline; bf16_kernel() selects
// this only where the CPU has avx512_bf16.
#if defined(__x86_64__)
// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own _mm512_undefined_*
// placeholders when inlined (a known false positive, see fast_attention_avx512.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/cpu/bf16.hpp"

#define VITLENS_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

namespace vitlens::detail {
namespace {

static_assert(kBf16Mr == 8 && kBf16Nr == 48, "the tile below is written for 8 x 48");

// One 32-bit pair (A's elements 2p, 2p+1 of one row) in every lane.
VITLENS_AVX512_BF16 inline __m512bh broadcast_pair(const bf16_t* a) {
  uint32_t pair;
  std::memcpy(&pair, a, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
}

// 24 accumulators + 3 B vectors + 1 broadcast of 32 registers, as the float32 tile (gemm_avx512.cpp),
// with a pair of k per instruction: each lane runs the emulation's two adds (bf16.hpp).
VITLENS_AVX512_BF16 void tile(int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b, float* c, int64_t ldc,
                              bool load_c, const float* bias) {
  // Named accumulators, not an array: GCC 12 kept an array in memory (see gemm_avx2.cpp).
  const __m512 z = _mm512_setzero_ps();
  __m512 c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z, c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z,
         c40 = z, c41 = z, c42 = z, c50 = z, c51 = z, c52 = z, c60 = z, c61 = z, c62 = z, c70 = z, c71 = z, c72 = z;
#define VITLENS_LOAD_ROW(r)                        \
  c##r##0 = _mm512_loadu_ps(c + (r) * ldc);        \
  c##r##1 = _mm512_loadu_ps(c + (r) * ldc + 16);   \
  c##r##2 = _mm512_loadu_ps(c + (r) * ldc + 32);
  if (load_c) {
    VITLENS_LOAD_ROW(0) VITLENS_LOAD_ROW(1) VITLENS_LOAD_ROW(2) VITLENS_LOAD_ROW(3)
    VITLENS_LOAD_ROW(4) VITLENS_LOAD_ROW(5) VITLENS_LOAD_ROW(6) VITLENS_LOAD_ROW(7)
  }
#undef VITLENS_LOAD_ROW
  const bf16_t *a0 = a, *a1 = a + 1 * a_rs, *a2 = a + 2 * a_rs, *a3 = a + 3 * a_rs, *a4 = a + 4 * a_rs,
               *a5 = a + 5 * a_rs, *a6 = a + 6 * a_rs, *a7 = a + 7 * a_rs;
#define VITLENS_TILE_ROW(r)                                 \
  {                                                         \
    const __m512bh ar = broadcast_pair(a##r + 2 * p);       \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, ar, b0);            \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, ar, b1);            \
    c##r##2 = _mm512_dpbf16_ps(c##r##2, ar, b2);            \
  }
  for (int p = 0; p < k_pairs; ++p, b += 2 * kBf16Nr) {
    _mm_prefetch(reinterpret_cast<const char*>(b) + 8 * 2 * 2 * kBf16Nr, _MM_HINT_T0);
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32),
                   b2 = (__m512bh)_mm512_loadu_si512(b + 64);
    VITLENS_TILE_ROW(0) VITLENS_TILE_ROW(1) VITLENS_TILE_ROW(2) VITLENS_TILE_ROW(3)
    VITLENS_TILE_ROW(4) VITLENS_TILE_ROW(5) VITLENS_TILE_ROW(6) VITLENS_TILE_ROW(7)
  }
#undef VITLENS_TILE_ROW
  __m512 bias0 = z, bias1 = z, bias2 = z;
  if (bias) bias0 = _mm512_loadu_ps(bias), bias1 = _mm512_loadu_ps(bias + 16), bias2 = _mm512_loadu_ps(bias + 32);
#define VITLENS_STORE_ROW(r)                                                                     \
  if (bias) c##r##0 = _mm512_add_ps(c##r##0, bias0), c##r##1 = _mm512_add_ps(c##r##1, bias1),     \
            c##r##2 = _mm512_add_ps(c##r##2, bias2);                                             \
  _mm512_storeu_ps(c + (r) * ldc, c##r##0);                                                      \
  _mm512_storeu_ps(c + (r) * ldc + 16, c##r##1);                                                 \
  _mm512_storeu_ps(c + (r) * ldc + 32, c##r##2);
  VITLENS_STORE_ROW(0) VITLENS_STORE_ROW(1) VITLENS_STORE_ROW(2) VITLENS_STORE_ROW(3)
  VITLENS_STORE_ROW(4) VITLENS_STORE_ROW(5) VITLENS_STORE_ROW(6) VITLENS_STORE_ROW(7)
#undef VITLENS_STORE_ROW
}

}  // namespace

VITLENS_AVX512_BF16 void convert_row_avx512bf16(const float* x, int k, int padded, bf16_t* out) {
  int p = 0;
  for (; p + 16 <= k; p += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + p)));
  for (; p < k; ++p) out[p] = float_to_bf16(x[p]);
  for (; p < padded; ++p) out[p] = 0;
}

const Bf16GemmKernels kAvx512Bf16Gemm{kBf16Mr, tile, convert_row_avx512bf16};

}  // namespace vitlens::detail
#endif  // __x86_64__
