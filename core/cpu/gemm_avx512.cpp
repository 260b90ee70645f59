// AVX-512F kernels for gemm.hpp: the 8 x 48 SGEMM tile, exact GELU, LayerNorm rows. The same
// steps as gemm_avx2.cpp at 16 lanes; target attributes keep the rest of the binary baseline.
#if defined(__x86_64__)
#include "core/cpu/avx512_math.hpp"  // first: its pragmas, <immintrin.h>, gelu16, VITLENS_AVX512

#include <cmath>
#include <cstdint>

#include "core/cpu/gemm.hpp"
#include "core/cpu/gemm_simd.hpp"

namespace vitlens::detail {
namespace {

// 24 accumulators + 3 B vectors + 1 broadcast of 32 registers. 48 columns: every width of the
// card's model (48, 96, 144) and of ViT-S and ViT-B (384, 768, 1152, 1536, 2304, 3072) is a whole
// number of panels, where 32 left a padded edge tile on every product 48 or 144 wide.
constexpr int kMr = 8, kNr = 48;
constexpr int kKc = 256;  // a B micro-panel of 48 KiB

// kRowSums: also the sums of A's 8 rows (a_rs = 1: adjacent), one vector add per step of k.
// kAps, kBrs: A's and B's steps of k fixed at compile time (0: a_ps and b_rs at run time), as in
// gemm_avx2.cpp: the forward's layout (a_ps = 1, B packed with b_rs = 48) then addresses every
// load at a constant offset from 8 row pointers and one panel pointer (bench/README.md, "The
// AVX-512 attention and tile on an Intel Xeon with AMX").
template <bool kRowSums, int64_t kAps, int64_t kBrs>
VITLENS_AVX512 inline void tile_body(int kc, const float* a, int64_t a_rs, int64_t a_ps_in, const float* b,
                                     int64_t b_rs_in, float* c, int64_t ldc, const TileEpilogue& e) {
  const int64_t a_ps = kAps ? kAps : a_ps_in, b_rs = kBrs ? kBrs : b_rs_in;
  // Named accumulators, not an array: GCC 12 kept an array in memory (see gemm_avx2.cpp).
  const __m512 z = _mm512_setzero_ps();
  __m512 c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z, c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z,
         c40 = z, c41 = z, c42 = z, c50 = z, c51 = z, c52 = z, c60 = z, c61 = z, c62 = z, c70 = z, c71 = z, c72 = z;
  // Row r of A starts at a_r; element p at a_r + p * a_ps.
  const float *a0 = a, *a1 = a + 1 * a_rs, *a2 = a + 2 * a_rs, *a3 = a + 3 * a_rs, *a4 = a + 4 * a_rs,
              *a5 = a + 5 * a_rs, *a6 = a + 6 * a_rs, *a7 = a + 7 * a_rs;
  __m256 row_sums = _mm256_setzero_ps();
  // One step of k: B's row p (three vectors) times the 8 rows' element p. Four steps per pass,
  // each first asking for B's row kPrefetchRows ahead (three cache lines), then the steps left:
  // on an Intel Xeon (two 512-bit FMA units) the plain one-step loop ran the tile at about 75 % of
  // the FMA limit, this one at about 82 % (bench/README.md, "The SGEMM tile on an Intel Xeon").
  // Every accumulator is still one FMA chain in p order: the same bits.
#define VITLENS_TILE_ROW(r)                         \
  {                                                 \
    const __m512 ar = _mm512_set1_ps(a##r[q]);      \
    c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);     \
    c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);     \
    c##r##2 = _mm512_fmadd_ps(ar, b2, c##r##2);     \
  }
#define VITLENS_TILE_STEP                                                                                 \
  {                                                                                                       \
    if constexpr (kRowSums) row_sums = _mm256_add_ps(row_sums, _mm256_loadu_ps(a + q));                   \
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32);     \
    VITLENS_TILE_ROW(0) VITLENS_TILE_ROW(1) VITLENS_TILE_ROW(2) VITLENS_TILE_ROW(3) VITLENS_TILE_ROW(4)   \
    VITLENS_TILE_ROW(5) VITLENS_TILE_ROW(6) VITLENS_TILE_ROW(7)                                           \
  }
  constexpr int kPrefetchRows = 16;
  int64_t p = 0, q = 0;
  for (; p + 4 <= kc; p += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u, q += a_ps, b += b_rs) {
      // An address (perhaps past B's end: a prefetch never faults), not a pointer into B.
      const char* ahead = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(b) +
                                                        static_cast<uintptr_t>(kPrefetchRows * b_rs) * sizeof(float));
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      VITLENS_TILE_STEP
    }
  }
  for (; p < kc; ++p, q += a_ps, b += b_rs) VITLENS_TILE_STEP
#undef VITLENS_TILE_STEP
#undef VITLENS_TILE_ROW
  const __m512 acc[kMr][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32},
                              {c40, c41, c42}, {c50, c51, c52}, {c60, c61, c62}, {c70, c71, c72}};
  for (int r = 0; r < kMr; ++r)
    for (int h = 0; h < 3; ++h) {
      const int64_t at = r * ldc + 16 * h;
      __m512 v = acc[r][h];
      if (e.load_c) v = _mm512_add_ps(v, _mm512_loadu_ps(c + at));
      if (e.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(e.bias + 16 * h));
      if (e.residual) v = _mm512_add_ps(_mm512_loadu_ps(e.residual + at), v);
      switch (e.act) {
        case TileAct::None: break;
        case TileAct::Gelu: v = gelu16(v); break;
        case TileAct::GeluAndSlope: {
          const ErfcParts16 parts = erfc_parts16(v);
          _mm512_storeu_ps(e.slope_out + at, gelu_slope16_from(v, parts));
          v = gelu16_from(v, parts);
          break;
        }
        case TileAct::Scale: v = _mm512_mul_ps(_mm512_loadu_ps(e.scale + at), v); break;
      }
      _mm512_storeu_ps(c + at, v);
    }
  if constexpr (kRowSums) _mm256_storeu_ps(e.a_row_sums, _mm256_add_ps(_mm256_loadu_ps(e.a_row_sums), row_sums));
}

VITLENS_AVX512 void tile(int kc, const float* a, int64_t a_rs, int64_t a_ps, const float* b, int64_t b_rs, float* c,
                         int64_t ldc, const TileEpilogue& e) {
  if (e.a_row_sums) tile_body<true, 0, 0>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);  // A adjacent rows (a_rs = 1)
  else if (a_ps == 1 && b_rs == kNr) tile_body<false, 1, kNr>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);
  else tile_body<false, 0, 0>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);
}

VITLENS_AVX512 void gelu(float* x, int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(x + i, gelu16(_mm512_loadu_ps(x + i)));
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1u);
    _mm512_mask_storeu_ps(x + i, tail, gelu16(_mm512_maskz_loadu_ps(tail, x + i)));
  }
}

VITLENS_AVX512 inline __m512d widen_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
VITLENS_AVX512 inline __m512d widen_hi(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// gemm_avx2.cpp's layer_norm_row at 16 channels.
VITLENS_AVX512 void layer_norm_row(const float* x, int dim, const float* weight, const float* bias, float eps,
                                   float* out) {
  int c = 0;
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (; c + 16 <= dim; c += 16) {
    const __m512 v = _mm512_loadu_ps(x + c);
    s0 = _mm512_add_pd(s0, widen_lo(v));
    s1 = _mm512_add_pd(s1, widen_hi(v));
  }
  double mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (int t = c; t < dim; ++t) mean += x[t];
  mean /= dim;
  const __m512d vmean = _mm512_set1_pd(mean);
  s0 = _mm512_setzero_pd(), s1 = s0;
  for (c = 0; c + 16 <= dim; c += 16) {
    const __m512 v = _mm512_loadu_ps(x + c);
    const __m512d d0 = _mm512_sub_pd(widen_lo(v), vmean), d1 = _mm512_sub_pd(widen_hi(v), vmean);
    s0 = _mm512_fmadd_pd(d0, d0, s0);
    s1 = _mm512_fmadd_pd(d1, d1, s1);
  }
  double var = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (int t = c; t < dim; ++t) var += (x[t] - mean) * (x[t] - mean);
  var /= dim;  // biased, as torch.nn.LayerNorm
  const double inv = 1.0 / std::sqrt(var + static_cast<double>(eps));
  const __m512d vinv = _mm512_set1_pd(inv);
  for (c = 0; c + 16 <= dim; c += 16) {
    const __m512 v = _mm512_loadu_ps(x + c);
    const __m256 n0 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(widen_lo(v), vmean), vinv));
    const __m256 n1 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(widen_hi(v), vmean), vinv));
    const __m512 normed =
        _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(n0)), _mm256_castps_pd(n1), 1));
    _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_mul_ps(normed, _mm512_loadu_ps(weight + c)), _mm512_loadu_ps(bias + c)));
  }
  for (; c < dim; ++c) out[c] = static_cast<float>((x[c] - mean) * inv) * weight[c] + bias[c];
}

}  // namespace

const GemmKernels kAvx512Gemm{kMr, kNr, kKc, tile, gelu, layer_norm_row};

}  // namespace vitlens::detail
#endif  // __x86_64__
