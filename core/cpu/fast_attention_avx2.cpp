// AVX2 + FMA leaf kernels for fast_attention.hpp (the phases are run by fast_attention.cpp).
// Each function carries a target attribute instead of a global -mavx2, so the rest of the binary
// stays baseline x86-64; kLeafKernels hands them out only where cpu.hpp found the ISA.
//
// Index
//   [SECTION] Vector helpers    horizontal sums (exp, max8: avx2_math.hpp)
//   [SECTION] Phase A           scores of 4 query rows (or 1) against a panel of 16 keys
//   [SECTION] Phase B           softmax of one row in place
//   [SECTION] Phase C           e v and the column sums
//   [SECTION] Phase C in rows   e v for heads of 32 channels or more
//   [SECTION] Table
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "core/cpu/avx2_math.hpp"  // exp8, max8, VITLENS_AVX2
#include "core/cpu/fast_attention.hpp"

namespace vitlens::detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kSumChunk = 64;  // keys per float partial sum of exps (8 terms per lane), then double

// [SECTION] Vector helpers

// sums[0..3] += the lane sums of a, b, c, d.
VITLENS_AVX2 inline void add_sums_of_4(__m256 a, __m256 b, __m256 c, __m256 d, double* sums) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // halves of each sum
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  _mm256_storeu_pd(sums, _mm256_add_pd(_mm256_loadu_pd(sums), _mm256_cvtps_pd(four)));
}

// [SECTION] Phase A: s = scale * q . k (+ key bias), keys [j0, j1), multiples of 16

template <bool kBias>
VITLENS_AVX2 inline __m256 finish_scores(__m256 a, __m256 vscale, const float* bias) {
  if constexpr (kBias) return _mm256_fmadd_ps(a, vscale, _mm256_loadu_ps(bias));  // rounds as a * scale
  else return _mm256_mul_ps(a, vscale);
}

// Four query rows and one panel (16 keys) per step: each key vector loaded serves 4 rows (8
// accumulators). Every score is the FMA chain over c = 0 .. d-1 in order, as in scores_1row, so a
// row alone (the attention_row path) gets bit-identical scores. With kMax, each stored score below
// max_end also goes into its row's running maximum (row_max), so phase B need not read the row
// once more for it. The row pointers are taken out of
// q and s once, before the loops (1.13x to 1.20x phase A against indexing them inside, on AMD
// Zen 3; six rows at a time with 12 accumulators measured the same as this: bench/README.md, "The
// AVX2 attention's phases A and C").
// m = max(m, v) over v's first `valid` lanes (all 8 when valid >= 8, none when valid <= 0).
VITLENS_AVX2 inline __m256 max_of_valid(__m256 m, __m256 v, int valid) {
  if (valid >= 8) return _mm256_max_ps(m, v);
  if (valid <= 0) return m;
  const __m256 keep = _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  return _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(kNegInf), v, keep));
}

template <bool kBias, bool kMax>
VITLENS_AVX2 void scores_4rows(const float* const q[4], const float* key_panels, int d, float scale,
                               const float* bias, float* const s[4], int j0, int j1, int max_end, float* row_max) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
  float *s0 = s[0], *s1 = s[1], *s2 = s[2], *s3 = s[3];
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0, m2 = m0, m3 = m0;
  for (int j = j0; j < j1; j += 16) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    const float* k = key_panels + (j / 16) * 16 * d;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m256 k0 = _mm256_loadu_ps(k), k1 = _mm256_loadu_ps(k + 8);
#define VITLENS_SCORE_ROW(r)                        \
  {                                                 \
    const __m256 b = _mm256_broadcast_ss(q##r + c); \
    a##r##0 = _mm256_fmadd_ps(b, k0, a##r##0);      \
    a##r##1 = _mm256_fmadd_ps(b, k1, a##r##1);      \
  }
      VITLENS_SCORE_ROW(0) VITLENS_SCORE_ROW(1) VITLENS_SCORE_ROW(2) VITLENS_SCORE_ROW(3)
#undef VITLENS_SCORE_ROW
    }
    const float* b0 = kBias ? bias + j : nullptr;
    const float* b1 = kBias ? bias + j + 8 : nullptr;
#define VITLENS_STORE_ROW(r)                                                 \
  {                                                                          \
    const __m256 v0 = finish_scores<kBias>(a##r##0, vscale, b0);             \
    const __m256 v1 = finish_scores<kBias>(a##r##1, vscale, b1);             \
    _mm256_storeu_ps(s##r + j, v0);                                          \
    _mm256_storeu_ps(s##r + j + 8, v1);                                      \
    if constexpr (kMax) {                                                    \
      m##r = max_of_valid(m##r, v0, max_end - j);                            \
      m##r = max_of_valid(m##r, v1, max_end - j - 8);                        \
    }                                                                        \
  }
    VITLENS_STORE_ROW(0) VITLENS_STORE_ROW(1) VITLENS_STORE_ROW(2) VITLENS_STORE_ROW(3)
#undef VITLENS_STORE_ROW
  }
  if constexpr (kMax) {
    row_max[0] = std::max(row_max[0], max8(m0));
    row_max[1] = std::max(row_max[1], max8(m1));
    row_max[2] = std::max(row_max[2], max8(m2));
    row_max[3] = std::max(row_max[3], max8(m3));
  }
}

// One query row over [0, end), two panels (32 keys) per step with 4 independent FMA chains, then
// one panel.
template <bool kBias>
VITLENS_AVX2 void scores_1row(const float* q, const float* key_panels, int d, float scale, const float* bias,
                              float* s, int end) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const int panel = 16 * d;
  int j = 0;
  for (; j + 32 <= end; j += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m256 b = _mm256_broadcast_ss(q + c);
      a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k), a0);
      a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k + 8), a1);
      a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k + panel), a2);
      a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k + panel + 8), a3);
    }
    _mm256_storeu_ps(s + j, finish_scores<kBias>(a0, vscale, kBias ? bias + j : nullptr));
    _mm256_storeu_ps(s + j + 8, finish_scores<kBias>(a1, vscale, kBias ? bias + j + 8 : nullptr));
    _mm256_storeu_ps(s + j + 16, finish_scores<kBias>(a2, vscale, kBias ? bias + j + 16 : nullptr));
    _mm256_storeu_ps(s + j + 24, finish_scores<kBias>(a3, vscale, kBias ? bias + j + 24 : nullptr));
  }
  if (j < end) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const float* k = key_panels + (j / 16) * panel;
    for (int c = 0; c < d; ++c, k += 16) {
      const __m256 b = _mm256_broadcast_ss(q + c);
      a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k), a0);
      a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(k + 8), a1);
    }
    _mm256_storeu_ps(s + j, finish_scores<kBias>(a0, vscale, kBias ? bias + j : nullptr));
    _mm256_storeu_ps(s + j + 8, finish_scores<kBias>(a1, vscale, kBias ? bias + j + 8 : nullptr));
  }
}

// [SECTION] Phase B

// e = exp(s - max) for the 8 scores at s, in place; returns acc + e.
VITLENS_AVX2 inline __m256 exp_in_place(float* s, __m256 vmax, __m256 acc) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s), vmax));
  _mm256_storeu_ps(s, e);
  return _mm256_add_ps(acc, e);
}

// Row of scores over [0, end), end a multiple of 16: e = exp(s - max) in place, the max given
// (known_max: phase A's) or found here. Returns 1 / sum e
// as the reference computes it (float(1.0 / double sum)), or 0 for a row with every key masked,
// which is then all zero. The sum: float lanes over 64 keys, then double.
VITLENS_AVX2 float row_max_of(const float* s, int end) {
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
  for (int j = 0; j < end; j += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(s + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + j + 8));
  }
  return max8(_mm256_max_ps(m0, m1));
}

VITLENS_AVX2 float softmax_row(float* s, int end, const float* known_max) {
  const float row_max = known_max ? *known_max : row_max_of(s, end);
  if (row_max == kNegInf) {
    std::fill(s, s + end, 0.0f);
    return 0.0f;
  }
  const __m256 vmax = _mm256_set1_ps(row_max);
  // Each chunk's float sum waits in chunk_sums and goes into the double sum after every kGroup
  // chunks, in chunk order: the same additions as adding it when its chunk ends. Added there, the
  // loop kept 17 vectors live, GCC 12 spilled the double sum, and each chunk's end waited on its
  // store and load; now that happens once a group (with a full chunk's 8 steps written out: 1.08x
  // phase B alone on AMD Zen 3, bench/results/2026-12-07-softmax-sums-and-ort-profile-zen3.md).
  constexpr int kGroup = 16;
  float chunk_sums[kGroup][8];
  __m256d sum = _mm256_setzero_pd();  // 4 double lanes; each chunk's float lanes are added in pairs
  for (int j0 = 0; j0 < end;) {
    int chunks = 0;
    for (; chunks < kGroup && j0 < end; ++chunks, j0 += kSumChunk) {
      __m256 acc = _mm256_setzero_ps();
      if (j0 + kSumChunk <= end) {
#pragma GCC unroll 8
        for (int j = j0; j < j0 + kSumChunk; j += 8) acc = exp_in_place(s + j, vmax, acc);
      } else {
        for (int j = j0; j < end; j += 8) acc = exp_in_place(s + j, vmax, acc);
      }
      _mm256_storeu_ps(chunk_sums[chunks], acc);
    }
    for (int c = 0; c < chunks; ++c) {
      const __m256 acc = _mm256_loadu_ps(chunk_sums[c]);
      sum = _mm256_add_pd(sum, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(acc)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(acc, 1))));
    }
  }
  __m128d pair = _mm_add_pd(_mm256_castpd256_pd128(sum), _mm256_extractf128_pd(sum, 1));
  pair = _mm_add_sd(pair, _mm_unpackhi_pd(pair, pair));
  return static_cast<float>(1.0 / _mm_cvtsd_f64(pair));
}

// [SECTION] Phase C

// C channels of one row over keys [j0, j1), at most 512 (64 float terms per lane, then double):
// sums[c] += sum_j e_j v_cj, and with kColumns block_sums[j] += e_j * weight. The accumulators are
// set one by one (a zeroing loop here becomes a memset of a stack array).
template <int C, bool kColumns>
VITLENS_AVX2 void weighted_values(const float* e_row, float weight, float* block_sums, const float* values,
                                  int panel_stride, int j0, int j1, double* sums) {
  __m256 acc[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const __m256 w = _mm256_set1_ps(weight);
  for (int j = j0; j < j1; j += 8) {
    const float* v = values + (j / 16) * panel_stride + j % 16;  // channel c of these 8 keys at v + 16 c
    const __m256 e = _mm256_loadu_ps(e_row + j);
    if constexpr (kColumns) _mm256_storeu_ps(block_sums + j, _mm256_fmadd_ps(e, w, _mm256_loadu_ps(block_sums + j)));
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(e, _mm256_loadu_ps(v + 16 * c), acc[c]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < C; c += 4) add_sums_of_4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3], sums + c);
}

template <int C>
VITLENS_AVX2 void weighted_values_of(const float* e_row, float weight, float* block_sums, const float* values,
                                     int panel_stride, int j0, int j1, double* sums) {
  if (block_sums) weighted_values<C, true>(e_row, weight, block_sums, values, panel_stride, j0, j1, sums);
  else weighted_values<C, false>(e_row, weight, nullptr, values, panel_stride, j0, j1, sums);
}

// sums[0..1] += the lane sums of a, b: each the same additions as add_sums_of_4's.
VITLENS_AVX2 inline void add_sums_of_2(__m256 a, __m256 b, double* sums) {
  const __m256 h = _mm256_hadd_ps(a, b);
  const __m256 ab = _mm256_hadd_ps(h, h);  // lanes 0, 1 (and 4, 5): the halves of each sum
  const __m128 two = _mm_add_ps(_mm256_castps256_ps128(ab), _mm256_extractf128_ps(ab, 1));
  _mm_storeu_pd(sums, _mm_add_pd(_mm_loadu_pd(sums), _mm_cvtps_pd(two)));
}

// Two rows and C channels (C even, at most 6) over keys [j0, j1): each value vector loaded serves
// both rows (12 accumulators, 2 e vectors and 1 value vector of 16 registers), where
// weighted_values loads C values for each row's C FMAs. Each accumulator is the chain
// weighted_values runs for its row and channel, so the sums are the same bits. With kColumns
// (weights and block_sums then given), also block_sums[j] += e0_j w0, then += e1_j w1 (weights =
// {w0, w1}): column_sums_2rows' FMAs on the e vectors already loaded, where a pass of its own
// loaded them again and ran its own loop (phase C alone 1.05x to 1.08x, the card's attention about
// 1.02x, on AMD Zen 3: bench/results/2026-12-07-fused-column-sums-zen3.md).
template <int C, bool kColumns = false>
VITLENS_AVX2 void weighted_values_2rows(const float* e0, const float* e1, const float* values, int panel_stride,
                                        int j0, int j1, double* sums0, double* sums1, const float* weights = nullptr,
                                        float* block_sums = nullptr) {
  static_assert(C % 2 == 0 && C <= 6, "two rows of at most 6 channels fill the 16 registers");
  __m256 a[C], b[C];
#pragma GCC unroll 6
  for (int c = 0; c < C; ++c) a[c] = _mm256_setzero_ps(), b[c] = _mm256_setzero_ps();
  // j0 and j1 are multiples of 16 (key chunks of whole panels): one panel per iteration, its two
  // halves of 8 keys in turn, as the 8-key steps of weighted_values, with the panel's address
  // stepped instead of computed from j (the division and remainder cost as much as the FMAs).
  const float* panel = values + static_cast<int64_t>(j0 / 16) * panel_stride;
  for (int j = j0; j < j1; j += 16, panel += panel_stride)
    for (int half = 0; half < 16; half += 8) {
      const float* v = panel + half;  // channel c of these 8 keys at v + 16 c
      const __m256 x0 = _mm256_loadu_ps(e0 + j + half), x1 = _mm256_loadu_ps(e1 + j + half);
#pragma GCC unroll 6
      for (int c = 0; c < C; ++c) {
        __m256 vc = _mm256_loadu_ps(v + 16 * c);
        // Keep the loaded vector in a register: GCC 12 otherwise folds the load into both FMAs
        // (two loads of each value vector, 14 loads for 12 FMAs at C = 6, more than the two
        // 256-bit loads a cycle of AMD Zen 3 feed). The empty asm changes nothing else.
        __asm__("" : "+x"(vc));
        a[c] = _mm256_fmadd_ps(x0, vc, a[c]);
        b[c] = _mm256_fmadd_ps(x1, vc, b[c]);
      }
      if constexpr (kColumns) {
        // The weights are broadcast from memory at each step (a load, no FP pipe): the store to
        // block_sums may alias them as far as the compiler knows, so it reloads them rather than
        // keep them in two more registers than the 16 the products use (none are spilled).
        const __m256 once = _mm256_fmadd_ps(x0, _mm256_broadcast_ss(weights), _mm256_loadu_ps(block_sums + j + half));
        _mm256_storeu_ps(block_sums + j + half, _mm256_fmadd_ps(x1, _mm256_broadcast_ss(weights + 1), once));
      }
    }
  if constexpr (C >= 4) {
    add_sums_of_4(a[0], a[1], a[2], a[3], sums0);
    add_sums_of_4(b[0], b[1], b[2], b[3], sums1);
  }
  if constexpr (C % 4 == 2) {
    add_sums_of_2(a[C - 2], a[C - 1], sums0 + C - 2);
    add_sums_of_2(b[C - 2], b[C - 1], sums1 + C - 2);
  }
}

// block_sums[j] += e0_j w0, then += e1_j w1 over [j0, j1): the same FMAs, in the same order per
// key, as weighted_values<C, true> for row 0 and then row 1.
VITLENS_AVX2 void column_sums_2rows(const float* e0, const float* e1, float w0, float w1, float* block_sums, int j0,
                                    int j1) {
  const __m256 v0 = _mm256_set1_ps(w0), v1 = _mm256_set1_ps(w1);
  for (int j = j0; j < j1; j += 8) {
    const __m256 once = _mm256_fmadd_ps(_mm256_loadu_ps(e0 + j), v0, _mm256_loadu_ps(block_sums + j));
    _mm256_storeu_ps(block_sums + j, _mm256_fmadd_ps(_mm256_loadu_ps(e1 + j), v1, once));
  }
}

// A pair of rows shares each value vector (weighted_values_2rows, 6 channels at a time, the first
// six with the column sums; a head of 4 channels adds them in column_sums_2rows); a row alone runs
// weighted_values, whose 12 accumulators fill the registers by themselves.
VITLENS_AVX2 void weighted_values_avx2(int rows, const float* const e_rows[2], const float weights[2],
                                       float* block_sums, const float* values, int panel_stride, int channels, int j0,
                                       int j1, double* const sums[2]) {
  if (rows == 2) {
    int c = 0;
    if (block_sums && channels >= 6) {
      weighted_values_2rows<6, true>(e_rows[0], e_rows[1], values, panel_stride, j0, j1, sums[0], sums[1], weights,
                                     block_sums);
      c = 6;
    } else if (block_sums) {
      column_sums_2rows(e_rows[0], e_rows[1], weights[0], weights[1], block_sums, j0, j1);
    }
    for (; c + 6 <= channels; c += 6)
      weighted_values_2rows<6>(e_rows[0], e_rows[1], values + 16 * c, panel_stride, j0, j1, sums[0] + c, sums[1] + c);
    if (channels - c == 4)
      weighted_values_2rows<4>(e_rows[0], e_rows[1], values + 16 * c, panel_stride, j0, j1, sums[0] + c, sums[1] + c);
    else if (channels - c == 2)
      weighted_values_2rows<2>(e_rows[0], e_rows[1], values + 16 * c, panel_stride, j0, j1, sums[0] + c, sums[1] + c);
    return;
  }
  for (int r = 0; r < rows; ++r) {
    const float* e = e_rows[r];
    if (channels == 12) weighted_values_of<12>(e, weights[r], block_sums, values, panel_stride, j0, j1, sums[r]);
    else if (channels == 8) weighted_values_of<8>(e, weights[r], block_sums, values, panel_stride, j0, j1, sums[r]);
    else weighted_values_of<4>(e, weights[r], block_sums, values, panel_stride, j0, j1, sums[r]);
  }
}

// [SECTION] Phase C in rows (heads of kRowLayoutMinDim channels or more)

// R rows (1 .. 4) and V vectors of 8 channels (1 .. 3) from channel c0, keys [j0, j1): per key one
// load of each value vector and one broadcast of each row's e, R * V FMAs into R * V accumulators
// (12 of the 16 registers at most), each the chain over the keys in order; then added to the
// double sums, 4 channels at a time.
template <int R, int V>
VITLENS_AVX2 void context_tile(const float* const e[4], const float* values, int channels, int c0, int j0, int j1,
                               double* const sums[4]) {
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int k = 0; k < V; ++k) acc[r][k] = _mm256_setzero_ps();
  const float* v = values + static_cast<int64_t>(j0) * channels + c0;
  for (int j = j0; j < j1; ++j, v += channels) {
    __m256 x[V];
#pragma GCC unroll 3
    for (int k = 0; k < V; ++k) x[k] = _mm256_loadu_ps(v + 8 * k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(e[r] + j);
#pragma GCC unroll 3
      for (int k = 0; k < V; ++k) acc[r][k] = _mm256_fmadd_ps(b, x[k], acc[r][k]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int k = 0; k < V; ++k) {
      double* out = sums[r] + c0 + 8 * k;
      _mm256_storeu_pd(out, _mm256_add_pd(_mm256_loadu_pd(out), _mm256_cvtps_pd(_mm256_castps256_ps128(acc[r][k]))));
      _mm256_storeu_pd(out + 4,
                       _mm256_add_pd(_mm256_loadu_pd(out + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(acc[r][k], 1))));
    }
}

// Every channel of R rows: tiles of 24 channels, then one of 16 or 8.
template <int R>
VITLENS_AVX2 void context_rows_of(const float* const e[4], const float* values, int channels, int j0, int j1,
                                  double* const sums[4]) {
  int c = 0;
  for (; c + 24 <= channels; c += 24) context_tile<R, 3>(e, values, channels, c, j0, j1, sums);
  if (channels - c == 16) context_tile<R, 2>(e, values, channels, c, j0, j1, sums);
  else if (channels - c == 8) context_tile<R, 1>(e, values, channels, c, j0, j1, sums);
}

VITLENS_AVX2 void context_rows(int rows, const float* const e_rows[4], const float* values, int channels, int j0,
                               int j1, double* const sums[4]) {
  switch (rows) {
    case 4: context_rows_of<4>(e_rows, values, channels, j0, j1, sums); break;
    case 3: context_rows_of<3>(e_rows, values, channels, j0, j1, sums); break;
    case 2: context_rows_of<2>(e_rows, values, channels, j0, j1, sums); break;
    default: context_rows_of<1>(e_rows, values, channels, j0, j1, sums); break;
  }
}

// block_sums[j] += e_r[j] w_r, rows in turn: per key the FMAs column_sums_2rows runs.
VITLENS_AVX2 void add_column_sums(int rows, const float* const e_rows[4], const float weights[4], float* block_sums,
                                  int j0, int j1) {
  for (int j = j0; j < j1; j += 8) {
    __m256 sum = _mm256_loadu_ps(block_sums + j);
    for (int r = 0; r < rows; ++r)
      sum = _mm256_fmadd_ps(_mm256_loadu_ps(e_rows[r] + j), _mm256_set1_ps(weights[r]), sum);
    _mm256_storeu_ps(block_sums + j, sum);
  }
}

VITLENS_AVX2 void flush_column_sums(float* block_sums, int end, double* column_sums) {
  for (int j = 0; j < end; j += 8) {
    const __m256 f = _mm256_loadu_ps(block_sums + j);
    double* cs = column_sums + j;
    _mm256_storeu_pd(cs, _mm256_add_pd(_mm256_loadu_pd(cs), _mm256_cvtps_pd(_mm256_castps256_ps128(f))));
    _mm256_storeu_pd(cs + 4, _mm256_add_pd(_mm256_loadu_pd(cs + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
    _mm256_storeu_ps(block_sums + j, _mm256_setzero_ps());
  }
}

VITLENS_AVX2 void exp_array_avx2(const float* x, float* out, int count) {
  int i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(x + i)));
  if (i < count) {
    float in[8] = {}, res[8];
    std::copy(x + i, x + count, in);
    _mm256_storeu_ps(res, exp8(_mm256_loadu_ps(in)));
    std::copy(res, res + (count - i), out + i);
  }
}

}  // namespace

// [SECTION] Table

const LeafKernels kAvx2Kernels = {
    {{scores_4rows<false, false>, scores_4rows<false, true>}, {scores_4rows<true, false>, scores_4rows<true, true>}},
    {scores_1row<false>, scores_1row<true>},
    softmax_row,
    weighted_values_avx2,
    flush_column_sums,
    exp_array_avx2,
    context_rows,
    add_column_sums};

}  // namespace vitlens::detail

#endif  // __x86_64__
