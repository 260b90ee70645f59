// The AVX2 + FMA kernel of bf16.hpp, for CPUs without bfloat16 dot products: the emulation's
// arithmetic (bf16.hpp) with float32 FMAs. A product of two bfloat16 values is exact in float32,
// so acc = fma(a, b, acc) rounds once, as the emulation's acc + a * b does; each accumulator takes
// the odd element of a pair, then the even one, as vdpbf16ps does. Denormals: the kernel runs with
// MXCSR's DAZ and FTZ set, so a denormal input reads as zero and a denormal sum is flushed, as the
// emulation's flush_denormal does; the bias is added after MXCSR is restored (the emulation adds it
// unflushed). tests/test_gemm_bf16.cpp holds it to the emulation bit for bit. Where they could
// differ: a product of two normal bfloat16 values below 2^-126 (operands near 1e-19), which the
// emulation rounds before its add and the FMA does not; and K = 0 onto a denormal already in C
// (no FMA reads it, so it stays, where the emulation flushes it).
//
// Only the 8 x 48 tile differs from the other kernels (gemm_bf16.cpp runs blocking, padding,
// threads); a target attribute keeps the rest of the binary baseline, and bf16_kernel() selects
// this only where cpu.hpp found AVX2 and FMA.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "core/cpu/avx2_math.hpp"  // VITLENS_AVX2
#include "core/cpu/bf16.hpp"

namespace vitlens::detail {
namespace {

static_assert(kBf16Mr == 8 && kBf16Nr == 48, "the tile below is written for 8 x 48");

constexpr int kWidenPairs = 128;          // pairs of A widened to float32 at a time (8 KB for 8 rows)
// Sub-tiles of 4 x 16: 8 accumulators, 4 B vectors, a broadcast and the mask. (4 x 24, with 12
// accumulators to hide more of the FMA latency, left GCC 12 a register short: it spilled three
// accumulators, whose store and reload inside their FMA chains made the tile twice as slow.)
constexpr int kSubRows = 4, kSubCols = 16;
constexpr unsigned kDazFtz = 0x8040;      // MXCSR bits: flush to zero (15), denormals are zero (6)

// c (4, 16) at c, row stride ldc, = (load_c ? c : 0) + the sub-tile's rows of A (float32, a_rs
// apart, element 2p + 1 the pair's odd one) times the panel's columns [col0, col0 + 16), pairs
// [0, pairs). The panel's pair p of column j is the 32-bit word at b + (p * 48 + j) * 2: the even
// element in the low half, so as float32 the odd one is the word with its low half cleared and the
// even one is the word shifted up by 16.
VITLENS_AVX2 inline void sub_tile(int pairs, const float* a, int64_t a_rs, const bf16_t* b, int col0, float* c,
                                  int64_t ldc, bool load_c) {
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
  if (load_c) {
    c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
    c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
  }
  const float *a0 = a, *a1 = a + a_rs, *a2 = a + 2 * a_rs, *a3 = a + 3 * a_rs;
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const bf16_t* bp = b;  // + 2 * col0 once there is a pair to read (b is null when K = 0)
  if (pairs > 0) bp += 2 * col0;
  for (int p = 0; p < pairs; ++p, bp += 2 * kBf16Nr) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp));       // columns 0-7
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 16));  // columns 8-15
    const __m256 odd0 = _mm256_castsi256_ps(_mm256_and_si256(w0, high_half));
    const __m256 odd1 = _mm256_castsi256_ps(_mm256_and_si256(w1, high_half));
    const __m256 even0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
    const __m256 even1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
#define VITLENS_BF16_ROW(r, e, v0, v1)                  \
  {                                                     \
    const __m256 x = _mm256_broadcast_ss(a##r + 2 * p + (e)); \
    c##r##0 = _mm256_fmadd_ps(x, v0, c##r##0);          \
    c##r##1 = _mm256_fmadd_ps(x, v1, c##r##1);          \
  }
    VITLENS_BF16_ROW(0, 1, odd0, odd1) VITLENS_BF16_ROW(1, 1, odd0, odd1)
    VITLENS_BF16_ROW(2, 1, odd0, odd1) VITLENS_BF16_ROW(3, 1, odd0, odd1)
    VITLENS_BF16_ROW(0, 0, even0, even1) VITLENS_BF16_ROW(1, 0, even0, even1)
    VITLENS_BF16_ROW(2, 0, even0, even1) VITLENS_BF16_ROW(3, 0, even0, even1)
#undef VITLENS_BF16_ROW
  }
  _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
  _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
}

// The 8 x 48 tile: A's rows widened to float32 (exact: a bfloat16 is a float32's top half) up to
// kWidenPairs pairs at a time, then six 4 x 16 sub-tiles over them. Between chunks the sums pass
// through c as float32, which changes no bit.
VITLENS_AVX2 void tile(int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b, float* c, int64_t ldc,
                       bool load_c, const float* bias) {
  alignas(32) float wide[kBf16Mr][2 * kWidenPairs];
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kDazFtz);
  for (int p0 = 0; p0 < k_pairs || p0 == 0; p0 += kWidenPairs) {  // once for k_pairs = 0: c = 0 or c
    const int pairs = k_pairs - p0 < kWidenPairs ? k_pairs - p0 : kWidenPairs;
    for (int r = 0; r < kBf16Mr; ++r) {
      const bf16_t* src = a + r * a_rs + 2 * p0;
      float* dst = wide[r];
      int e = 0;
      for (; e + 8 <= 2 * pairs; e += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e));
        _mm256_store_ps(dst + e, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
      for (; e < 2 * pairs; ++e) dst[e] = bf16_to_float(src[e]);
    }
    const bool load = load_c || p0 > 0;
    for (int r0 = 0; r0 < kBf16Mr; r0 += kSubRows)
      for (int col0 = 0; col0 < kBf16Nr; col0 += kSubCols)
        sub_tile(pairs, wide[r0], 2 * kWidenPairs, b + static_cast<int64_t>(p0) * 2 * kBf16Nr, col0,
                 c + r0 * ldc + col0, ldc, load);
  }
  _mm_setcsr(saved);
  if (bias)
    for (int r = 0; r < kBf16Mr; ++r)
      for (int j = 0; j < kBf16Nr; j += 8) {
        float* row = c + r * ldc + j;
        _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), _mm256_loadu_ps(bias + j)));
      }
}

// float_to_bf16 (bf16.hpp) eight at a time: round to nearest even, a NaN made quiet.
VITLENS_AVX2 void convert_row(const float* x, int k, int padded, bf16_t* out) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  int p = 0;
  for (; p + 8 <= k; p += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + p));
    const __m256i round_bias = _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(bits, 16), one));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, round_bias), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet);
    const __m256i halves = _mm256_blendv_epi8(rounded, quieted, nan);  // each < 2^16
    // Pack the eight 32-bit lanes to 16 bits (packus works within 128-bit halves: lanes 0-3 and
    // 4-7 land in the low 64 bits of each half), then gather the two halves' low quadwords.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + p), _mm256_castsi256_si128(packed));
  }
  for (; p < k; ++p) out[p] = float_to_bf16(x[p]);
  for (; p < padded; ++p) out[p] = 0;
}

}  // namespace

const Bf16GemmKernels kAvx2Bf16Gemm{kBf16Mr, tile, convert_row};

}  // namespace vitlens::detail
#endif  // __x86_64__
