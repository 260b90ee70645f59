// AVX2 + FMA kernels for gemm.hpp: the 6 x 16 SGEMM tile, exact GELU, LayerNorm rows.
// Each function carries a target attribute instead of a global -mavx2 (as fast_attention_avx2.cpp),
// so the rest of the binary stays baseline x86-64; kGemmKernels hands them out only where cpu.hpp
// found the ISA.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "core/cpu/avx2_math.hpp"  // exp8, gelu8, VITLENS_AVX2
#include "core/cpu/gemm.hpp"

namespace vitlens::detail {
namespace {

constexpr int kMr = 6, kNr = 16;  // 12 accumulators + 2 B vectors + 1 broadcast of 16 registers
// K in blocks of 384 (a B micro-panel of 24 KiB in a 32 KiB L1), not 256: a product whose K is 384
// (ViT-S's qkv, proj, fc1) then writes C once instead of writing its partial sums and reading them
// back; at 3601 rows (ViT-S/8 at 480 px) C is up to 22 MB. On AMD Zen 3, one thread, ViT-S/8's four
// products took 164 to 180 ms with blocks of 256 (0.93x to 0.94x oneDNN's speed in the same runs)
// and 155 to 170 ms with 384 (0.97x to 0.99x); on two threads, and at 197 rows, no change was
// resolved (bench/results/2026-12-07-avx2-k-block-384-zen3.md).
constexpr int kKc = 384;

// kRowSums: also the sums of A's 6 rows (a_rs = 1: adjacent; a masked load, so nothing past the
// 6th is read), one vector add per step of k. kAps, kBrs: A's and B's steps of k fixed at compile
// time (0: a_ps and b_rs at run time). The forward's layout (A's rows in place, a_ps = 1; B packed,
// b_rs = 16) then addresses every load at a constant offset from 6 row pointers and one panel
// pointer; with both steps at run time GCC 12 ran out of registers for the 4 unrolled steps'
// addresses and reloaded them from the stack inside the loop (1.01x to 1.12x per ViT-S/16 product
// on AMD Zen 3: bench/README.md, "... the AVX2 tile's fixed steps").
template <bool kRowSums, int64_t kAps, int64_t kBrs>
VITLENS_AVX2 inline void tile_body(int kc, const float* a, int64_t a_rs, int64_t a_ps_in, const float* b,
                                   int64_t b_rs_in, float* c, int64_t ldc, const TileEpilogue& e) {
  const int64_t a_ps = kAps ? kAps : a_ps_in, b_rs = kBrs ? kBrs : b_rs_in;
  // Twelve named accumulators, not an array: with an array, GCC 12 kept it in memory and stored
  // every accumulator on every step of k (the epilogue's loop indexes it), which halved the speed.
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
  // Row r of A starts at a_r; element p at a_r + p * a_ps.
  const float *a0 = a, *a1 = a + 1 * a_rs, *a2 = a + 2 * a_rs, *a3 = a + 3 * a_rs, *a4 = a + 4 * a_rs,
              *a5 = a + 5 * a_rs;
  // One step of k: B's row p (two vectors) times A's column p, broadcast row by row.
#define VITLENS_TILE_ROW(r, q)                        \
  {                                                   \
    const __m256 ar = _mm256_broadcast_ss(a##r + (q)); \
    c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);       \
    c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);       \
  }
  const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  __m256 row_sums = _mm256_setzero_ps();
#define VITLENS_TILE_STEP(q, bp)                                                                 \
  {                                                                                              \
    if constexpr (kRowSums) row_sums = _mm256_add_ps(row_sums, _mm256_maskload_ps(a + (q), six)); \
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps((bp) + 8);                       \
    VITLENS_TILE_ROW(0, q) VITLENS_TILE_ROW(1, q) VITLENS_TILE_ROW(2, q) VITLENS_TILE_ROW(3, q) \
    VITLENS_TILE_ROW(4, q) VITLENS_TILE_ROW(5, q)                                                \
  }
  // The epilogue's C (a later k block's) and residual rows are asked for now, while the k loop runs:
  // a Linear layer's C (ViT-B/16's fc1: 2.4 MB) is swept once per k block and is out of cache by
  // the next sweep (a forward streams its weights through L3), and the epilogue's loads waited for
  // it at the end of the tile: 5 % of the tile's samples in ViT-B/16's forward on AMD Zen 3.
  for (int r = 0; r < kMr; ++r) {
    if (e.load_c) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNr - 1), _MM_HINT_T0);
    }
    if (e.residual) {
      _mm_prefetch(reinterpret_cast<const char*>(e.residual + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(e.residual + r * ldc + kNr - 1), _MM_HINT_T0);
    }
  }
  // Four steps per iteration, with B's next four rows fetched ahead: the loop's own instructions
  // and the wait for B's next lines no longer take FMA slots. The same FMAs in the same order as
  // one step at a time, so the same bits.
  int64_t p = 0, q = 0;
  // (The addresses are computed as integers: the last iteration's lie past the panel's end, where a
  // prefetch is harmless but a pointer may not point.)
  const uintptr_t row_bytes = static_cast<uintptr_t>(b_rs) * sizeof(float);
  for (; p + 4 <= kc; p += 4, q += 4 * a_ps, b += 4 * b_rs) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(b) + 4 * row_bytes;
    for (int row = 0; row < 4; ++row) _mm_prefetch(reinterpret_cast<const char*>(ahead + row * row_bytes), _MM_HINT_T0);
    VITLENS_TILE_STEP(q, b)
    VITLENS_TILE_STEP(q + a_ps, b + b_rs)
    VITLENS_TILE_STEP(q + 2 * a_ps, b + 2 * b_rs)
    VITLENS_TILE_STEP(q + 3 * a_ps, b + 3 * b_rs)
  }
  for (; p < kc; ++p, q += a_ps, b += b_rs) VITLENS_TILE_STEP(q, b)
#undef VITLENS_TILE_STEP
#undef VITLENS_TILE_ROW
  const __m256 acc[kMr][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < kMr; ++r)
    for (int h = 0; h < 2; ++h) {
      const int64_t at = r * ldc + 8 * h;
      __m256 v = acc[r][h];
      if (e.load_c) v = _mm256_add_ps(v, _mm256_loadu_ps(c + at));
      if (e.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(e.bias + 8 * h));
      if (e.residual) v = _mm256_add_ps(_mm256_loadu_ps(e.residual + at), v);
      switch (e.act) {
        case TileAct::None: break;
        case TileAct::Gelu: v = gelu8(v); break;
        case TileAct::GeluAndSlope: {
          const ErfcParts parts = erfc_parts8(v);
          _mm256_storeu_ps(e.slope_out + at, gelu_slope8_from(v, parts));
          v = gelu8_from(v, parts);
          break;
        }
        case TileAct::Scale: v = _mm256_mul_ps(_mm256_loadu_ps(e.scale + at), v); break;
      }
      _mm256_storeu_ps(c + at, v);
    }
  if constexpr (kRowSums) {
    float sums[8];
    _mm256_storeu_ps(sums, row_sums);
    for (int r = 0; r < kMr; ++r) e.a_row_sums[r] += sums[r];
  }
}

VITLENS_AVX2 void tile(int kc, const float* a, int64_t a_rs, int64_t a_ps, const float* b, int64_t b_rs, float* c,
                       int64_t ldc, const TileEpilogue& e) {
  if (e.a_row_sums) tile_body<true, 0, 0>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);  // A adjacent rows (a_rs = 1)
  else if (a_ps == 1 && b_rs == kNr) tile_body<false, 1, kNr>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);
  else tile_body<false, 0, 0>(kc, a, a_rs, a_ps, b, b_rs, c, ldc, e);
}

VITLENS_AVX2 void gelu(float* x, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(x + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < count) {  // the tail through a padded vector, so every element rounds the same way
    float pad[8] = {};
    for (int64_t j = i; j < count; ++j) pad[j - i] = x[j];
    _mm256_storeu_ps(pad, gelu8(_mm256_loadu_ps(pad)));
    for (int64_t j = i; j < count; ++j) x[j] = pad[j - i];
  }
}

VITLENS_AVX2 inline double sum4(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// The portable row (gemm.cpp) 8 channels at a time: sums in double, (x - mean) * inv in double
// rounded to float, then * weight + bias in float (a multiply and an add, as the portable code).
VITLENS_AVX2 void layer_norm_row(const float* x, int dim, const float* weight, const float* bias, float eps,
                                 float* out) {
  int c = 0;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  for (; c + 8 <= dim; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  double mean = sum4(_mm256_add_pd(s0, s1));
  for (int t = c; t < dim; ++t) mean += x[t];
  mean /= dim;
  const __m256d vmean = _mm256_set1_pd(mean);
  s0 = _mm256_setzero_pd(), s1 = s0;
  for (c = 0; c + 8 <= dim; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vmean);
    const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vmean);
    s0 = _mm256_fmadd_pd(d0, d0, s0);
    s1 = _mm256_fmadd_pd(d1, d1, s1);
  }
  double var = sum4(_mm256_add_pd(s0, s1));
  for (int t = c; t < dim; ++t) var += (x[t] - mean) * (x[t] - mean);
  var /= dim;  // biased, as torch.nn.LayerNorm
  const double inv = 1.0 / std::sqrt(var + static_cast<double>(eps));
  const __m256d vinv = _mm256_set1_pd(inv);
  for (c = 0; c + 8 <= dim; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    const __m128 n0 = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vmean), vinv));
    const __m128 n1 = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vmean), vinv));
    const __m256 normed = _mm256_insertf128_ps(_mm256_castps128_ps256(n0), n1, 1);
    _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_mul_ps(normed, _mm256_loadu_ps(weight + c)), _mm256_loadu_ps(bias + c)));
  }
  for (; c < dim; ++c) out[c] = static_cast<float>((x[c] - mean) * inv) * weight[c] + bias[c];
}

}  // namespace

// Eight rows of W, eight k at a time, into eight panel rows: the classic 8 x 8 transpose in
// registers (pairs of rows interleaved, then quads, then the 128-bit halves swapped), so each load
// and store moves 32 contiguous bytes. Only moves floats: the panels are the same whoever packs them.
VITLENS_AVX2 void pack_wt_squares_avx2(const float* w, int64_t ldw, int kc8, int nr, float* dst) {
  for (int p = 0; p < kc8; p += 8)
    for (int j = 0; j < nr; j += 8) {
      const float* src = w + j * ldw + p;
      // r_i = W row j + i, k [p, p + 8): (a0..a7), (b0..b7), ...
      const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ldw);
      const __m256 r2 = _mm256_loadu_ps(src + 2 * ldw), r3 = _mm256_loadu_ps(src + 3 * ldw);
      const __m256 r4 = _mm256_loadu_ps(src + 4 * ldw), r5 = _mm256_loadu_ps(src + 5 * ldw);
      const __m256 r6 = _mm256_loadu_ps(src + 6 * ldw), r7 = _mm256_loadu_ps(src + 7 * ldw);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);  // a0 b0 a1 b1 | a4 b4 a5 b5
      const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));  // a0 b0 c0 d0 | a4 b4 c4 d4
      const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));  // k 1 | 5
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));  // k 2 | 6
      const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));  // k 3 | 7
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));  // e0 f0 g0 h0 | e4 f4 g4 h4
      const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      float* out = dst + static_cast<int64_t>(p) * nr + j;
      _mm256_storeu_ps(out, _mm256_permute2f128_ps(s0, s4, 0x20));           // k p:     a0 .. h0
      _mm256_storeu_ps(out + nr, _mm256_permute2f128_ps(s1, s5, 0x20));      // k p + 1
      _mm256_storeu_ps(out + 2 * nr, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_storeu_ps(out + 3 * nr, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_storeu_ps(out + 4 * nr, _mm256_permute2f128_ps(s0, s4, 0x31));  // k p + 4: a4 .. h4
      _mm256_storeu_ps(out + 5 * nr, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_storeu_ps(out + 6 * nr, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_storeu_ps(out + 7 * nr, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
}

const GemmKernels kAvx2Gemm{kMr, kNr, kKc, tile, gelu, layer_norm_row};

}  // namespace vitlens::detail
#endif  // __x86_64__
