// AVX-512 leaf kernels for fast_attention.hpp: the AVX2 kernels (fast_attention_avx2.cpp) on
// 16 lanes. Same target-attribute scheme: nothing here runs unless the CPU reported avx512f.
// On cores with full-width 512-bit units (AMD Zen 5, Intel server parts) this halves the
// instruction count of every phase.
//
// Index
//   [SECTION] Vector helpers    horizontal max / sums (exp16: avx512_math.hpp)
//   [SECTION] Phase A           scores of 4 query rows (or 1) against 32 keys at a time
//   [SECTION] Phase B           softmax of one row in place
//   [SECTION] Phase C           e v and the column sums
//   [SECTION] Table
#if defined(__x86_64__)
#include "core/cpu/avx512_math.hpp"  // first: its pragmas, <immintrin.h>, exp16, VITLENS_AVX512

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/cpu/fast_attention.hpp"

namespace vitlens::detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kSumChunk = 128;  // keys per float partial sum of exps (8 terms per lane), then double

// [SECTION] Vector helpers

VITLENS_AVX512 inline __m256 upper_half(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// sums[0..3] += the lane sums of a, b, c, d.
VITLENS_AVX512 inline void add_sums_of_4(__m512 a, __m512 b, __m512 c, __m512 d, double* sums) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), upper_half(a));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), upper_half(b));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), upper_half(c));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), upper_half(d));
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  _mm256_storeu_pd(sums, _mm256_add_pd(_mm256_loadu_pd(sums), _mm256_cvtps_pd(four)));
}

// [SECTION] Phase A: s = scale * q . k (+ key bias), keys [j0, j1), multiples of 16

template <bool kBias>
VITLENS_AVX512 inline __m512 finish_scores(__m512 a, __m512 vscale, const float* bias) {
  if constexpr (kBias) return _mm512_fmadd_ps(a, vscale, _mm512_loadu_ps(bias));  // rounds as a * scale
  else return _mm512_mul_ps(a, vscale);
}

// m = max(m, v) over v's first `valid` lanes (all 16 when valid >= 16, none when valid <= 0).
VITLENS_AVX512 inline __m512 max_of_valid(__m512 m, __m512 v, int valid) {
  if (valid >= 16) return _mm512_max_ps(m, v);
  if (valid <= 0) return m;
  return _mm512_mask_max_ps(m, static_cast<__mmask16>((1u << valid) - 1u), m, v);
}

// Four query rows, 64 keys (four panels) per step with 16 accumulators, then a panel at a time.
// 16 FMA chains hide the FMA latency with room to spare; 8 (32 keys) are exactly latency x
// throughput on two 512-bit FMA units. Every score is the FMA chain over c = 0 .. d-1 in order, as
// in scores_1row. The row pointers are taken out of q and s once, before the loops. With kMax,
// each stored score below max_end also goes into its row's running maximum (row_max), so phase B
// need not read the row once more for it. (bench/README.md, "The AVX-512 attention and tile on
// an Intel Xeon with AMX".)
template <bool kBias, bool kMax>
VITLENS_AVX512 void scores_4rows(const float* const q[4], const float* key_panels, int d, float scale,
                                 const float* bias, float* const s[4], int j0, int j1, int max_end, float* row_max) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
  float *s0 = s[0], *s1 = s[1], *s2 = s[2], *s3 = s[3];
  __m512 m0 = _mm512_set1_ps(kNegInf), m1 = m0, m2 = m0, m3 = m0;
  const int panel = 16 * d;
  // Score vector h (16 keys from j + 16 h) of row r: finish, store, and take into the maximum.
#define VITLENS_STORE(r, h, acc)                                                                 \
  {                                                                                              \
    const __m512 v = finish_scores<kBias>(acc, vscale, kBias ? bias + j + 16 * (h) : nullptr);   \
    _mm512_storeu_ps(s##r + j + 16 * (h), v);                                                     \
    if constexpr (kMax) m##r = max_of_valid(m##r, v, max_end - j - 16 * (h));                    \
  }
  int j = j0;
  for (; j + 64 <= j1; j += 64) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z,
           a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m512 k0 = _mm512_loadu_ps(k), k1 = _mm512_loadu_ps(k + panel), k2 = _mm512_loadu_ps(k + 2 * panel),
                   k3 = _mm512_loadu_ps(k + 3 * panel);
#define VITLENS_SCORE_ROW(r)                   \
  {                                            \
    const __m512 b = _mm512_set1_ps(q##r[c]);  \
    a##r##0 = _mm512_fmadd_ps(b, k0, a##r##0); \
    a##r##1 = _mm512_fmadd_ps(b, k1, a##r##1); \
    a##r##2 = _mm512_fmadd_ps(b, k2, a##r##2); \
    a##r##3 = _mm512_fmadd_ps(b, k3, a##r##3); \
  }
      VITLENS_SCORE_ROW(0) VITLENS_SCORE_ROW(1) VITLENS_SCORE_ROW(2) VITLENS_SCORE_ROW(3)
#undef VITLENS_SCORE_ROW
    }
#define VITLENS_STORE_ROW(r) \
  VITLENS_STORE(r, 0, a##r##0) VITLENS_STORE(r, 1, a##r##1) VITLENS_STORE(r, 2, a##r##2) VITLENS_STORE(r, 3, a##r##3)
    VITLENS_STORE_ROW(0) VITLENS_STORE_ROW(1) VITLENS_STORE_ROW(2) VITLENS_STORE_ROW(3)
#undef VITLENS_STORE_ROW
  }
  for (; j < j1; j += 16) {  // at most three panels left (only a row's last key chunk has them)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m512 k0 = _mm512_loadu_ps(k);
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[c]), k0, a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[c]), k0, a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[c]), k0, a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[c]), k0, a3);
    }
    VITLENS_STORE(0, 0, a0) VITLENS_STORE(1, 0, a1) VITLENS_STORE(2, 0, a2) VITLENS_STORE(3, 0, a3)
  }
#undef VITLENS_STORE
  if constexpr (kMax) {
    row_max[0] = std::max(row_max[0], _mm512_reduce_max_ps(m0));
    row_max[1] = std::max(row_max[1], _mm512_reduce_max_ps(m1));
    row_max[2] = std::max(row_max[2], _mm512_reduce_max_ps(m2));
    row_max[3] = std::max(row_max[3], _mm512_reduce_max_ps(m3));
  }
}

// One query row over [0, end), 64 keys (four panels) per step with 4 independent FMA chains,
// then a panel at a time.
template <bool kBias>
VITLENS_AVX512 void scores_1row(const float* q, const float* key_panels, int d, float scale, const float* bias,
                                float* s, int end) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const int panel = 16 * d;
  int j = 0;
  for (; j + 64 <= end; j += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m512 b = _mm512_set1_ps(q[c]);
      a0 = _mm512_fmadd_ps(b, _mm512_loadu_ps(k), a0);
      a1 = _mm512_fmadd_ps(b, _mm512_loadu_ps(k + panel), a1);
      a2 = _mm512_fmadd_ps(b, _mm512_loadu_ps(k + 2 * panel), a2);
      a3 = _mm512_fmadd_ps(b, _mm512_loadu_ps(k + 3 * panel), a3);
    }
    _mm512_storeu_ps(s + j, finish_scores<kBias>(a0, vscale, kBias ? bias + j : nullptr));
    _mm512_storeu_ps(s + j + 16, finish_scores<kBias>(a1, vscale, kBias ? bias + j + 16 : nullptr));
    _mm512_storeu_ps(s + j + 32, finish_scores<kBias>(a2, vscale, kBias ? bias + j + 32 : nullptr));
    _mm512_storeu_ps(s + j + 48, finish_scores<kBias>(a3, vscale, kBias ? bias + j + 48 : nullptr));
  }
  for (; j < end; j += 16) {
    __m512 a0 = _mm512_setzero_ps();
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[c]), _mm512_loadu_ps(k), a0);
    _mm512_storeu_ps(s + j, finish_scores<kBias>(a0, vscale, kBias ? bias + j : nullptr));
  }
}

// [SECTION] Phase B

// As the AVX2 softmax_row: e = exp(s - max) in place over [0, end), the max given (known_max) or
// found here; returns float(1.0 / sum), or 0 for a row with every key masked (then all zero).
VITLENS_AVX512 float row_max_of(const float* s, int end) {
  __m512 m0 = _mm512_set1_ps(kNegInf), m1 = m0;
  int j = 0;
  for (; j + 32 <= end; j += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
  }
  if (j < end) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

VITLENS_AVX512 float softmax_row(float* s, int end, const float* known_max) {
  const float row_max = known_max ? *known_max : row_max_of(s, end);
  if (row_max == kNegInf) {
    std::fill(s, s + end, 0.0f);
    return 0.0f;
  }
  const __m512 vmax = _mm512_set1_ps(row_max);
  __m512d sum = _mm512_setzero_pd();  // 8 double lanes; each chunk's float lanes are added in pairs
  for (int j0 = 0; j0 < end; j0 += kSumChunk) {
    const int j1 = std::min(j0 + kSumChunk, end);
    __m512 acc = _mm512_setzero_ps();
    for (int i = j0; i < j1; i += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmax));
      _mm512_storeu_ps(s + i, e);
      acc = _mm512_add_ps(acc, e);
    }
    const __m512d halves = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc)), _mm512_cvtps_pd(upper_half(acc)));
    sum = _mm512_add_pd(sum, halves);
  }
  return static_cast<float>(1.0 / _mm512_reduce_add_pd(sum));
}

// [SECTION] Phase C

// C channels of R rows (1 or 2; 2 x 12 accumulators fit the 32 registers) over keys [j0, j1), at
// most 512 (32 float terms per lane, then double): sums[r][c] += sum_j e_rj v_cj, and with
// kColumns block_sums[j] += sum_r e_rj * weights[r]. Each value vector loaded serves R rows. The
// accumulators are set one by one (a zeroing loop here becomes a memset of a stack array).
template <int R, int C, bool kColumns>
VITLENS_AVX512 void weighted_values(const float* const e_rows[2], const float weights[2], float* block_sums,
                                    const float* values, int panel_stride, int j0, int j1, double* const sums[2]) {
  const float* e0 = e_rows[0];
  const float* e1 = R == 2 ? e_rows[1] : e_rows[0];
  __m512 acc[R][C];
#pragma GCC unroll 32
  for (int i = 0; i < R * C; ++i) acc[i / C][i % C] = _mm512_setzero_ps();
  const __m512 w0 = _mm512_set1_ps(weights[0]), w1 = _mm512_set1_ps(R == 2 ? weights[1] : 0.0f);
  // j0 is a multiple of 16: the panel's address is stepped, not computed from j.
  const float* v = values + static_cast<int64_t>(j0 / 16) * panel_stride;  // channel c of 16 keys at v + 16 c
  for (int j = j0; j < j1; j += 16, v += panel_stride) {
    __m512 e[R];
    e[0] = _mm512_loadu_ps(e0 + j);
    if constexpr (R == 2) e[R - 1] = _mm512_loadu_ps(e1 + j);
    if constexpr (kColumns) {
      __m512 column = _mm512_fmadd_ps(e[0], w0, _mm512_loadu_ps(block_sums + j));
      if constexpr (R == 2) column = _mm512_fmadd_ps(e[R - 1], w1, column);
      _mm512_storeu_ps(block_sums + j, column);
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      __m512 vc = _mm512_loadu_ps(v + 16 * c);
      // Keep the loaded vector in a register (as the AVX2 weighted_values_2rows): GCC 12 otherwise
      // folds the load into both rows' FMAs, two loads of each value vector. No other effect.
      if constexpr (R == 2) __asm__("" : "+v"(vc));
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(e[r], vc, acc[r][c]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; c += 4) add_sums_of_4(acc[r][c], acc[r][c + 1], acc[r][c + 2], acc[r][c + 3], sums[r] + c);
}

template <int R, int C>
VITLENS_AVX512 void weighted_values_of(const float* const e_rows[2], const float weights[2], float* block_sums,
                                       const float* values, int panel_stride, int j0, int j1, double* const sums[2]) {
  if (block_sums) weighted_values<R, C, true>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
  else weighted_values<R, C, false>(e_rows, weights, nullptr, values, panel_stride, j0, j1, sums);
}

VITLENS_AVX512 void weighted_values_avx512(int rows, const float* const e_rows[2], const float weights[2],
                                           float* block_sums, const float* values, int panel_stride, int channels,
                                           int j0, int j1, double* const sums[2]) {
  if (rows == 2) {
    if (channels == 12) weighted_values_of<2, 12>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
    else if (channels == 8) weighted_values_of<2, 8>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
    else weighted_values_of<2, 4>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
  } else {
    if (channels == 12) weighted_values_of<1, 12>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
    else if (channels == 8) weighted_values_of<1, 8>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
    else weighted_values_of<1, 4>(e_rows, weights, block_sums, values, panel_stride, j0, j1, sums);
  }
}

VITLENS_AVX512 void flush_column_sums(float* block_sums, int end, double* column_sums) {
  for (int j = 0; j < end; j += 16) {
    const __m512 f = _mm512_loadu_ps(block_sums + j);
    double* cs = column_sums + j;
    _mm512_storeu_pd(cs, _mm512_add_pd(_mm512_loadu_pd(cs), _mm512_cvtps_pd(_mm512_castps512_ps256(f))));
    _mm512_storeu_pd(cs + 8, _mm512_add_pd(_mm512_loadu_pd(cs + 8), _mm512_cvtps_pd(upper_half(f))));
    _mm512_storeu_ps(block_sums + j, _mm512_setzero_ps());
  }
}

VITLENS_AVX512 void exp_array_avx512(const float* x, float* out, int count) {
  int i = 0;
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(out + i, exp16(_mm512_loadu_ps(x + i)));
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, tail, exp16(_mm512_maskz_loadu_ps(tail, x + i)));
  }
}

}  // namespace

// [SECTION] Table

const LeafKernels kAvx512Kernels = {
    {{scores_4rows<false, false>, scores_4rows<false, true>}, {scores_4rows<true, false>, scores_4rows<true, true>}},
    {scores_1row<false>, scores_1row<true>},
    softmax_row,
    weighted_values_avx512,
    flush_column_sums,
    exp_array_avx512,
    // Phase C in rows: none yet for AVX-512 (not measured on an AVX-512 CPU); the panel kernels run it.
    nullptr,
    nullptr};

}  // namespace vitlens::detail

#endif  // __x86_64__
