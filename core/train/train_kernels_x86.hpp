#pragma once
// The training ops' kernels (train_kernels.hpp) for the floats of the vector builds, with AVX2 +
// FMA or AVX-512 intrinsics: masked loads and stores of a block's tail, the lanes' sum and max as
// trees, the exp of a block, row_dot, copy_transposed_padded through 8 x 8 squares and GELU's
// chunks. Overloads and specializations of train_kernels.hpp's templates, picked for float by
// the compiler; included by it where the build has AVX2 (__AVX2__), 16 lanes where it has AVX-512F.
#if defined(__AVX512F__)
#include "core/cpu/avx512_math.hpp"  // first: its pragmas; gelu16, gelu_slope16, exp16
#endif
#include "core/cpu/avx2_math.hpp"  // gelu8, gelu_slope8, exp8, transpose8x8, sum8, max8

namespace vitlens::train {
namespace {

// [SECTION] One block of floats in a register: the instruction set's few primitives

#if defined(__AVX512F__)
using FloatBlock = __m512;
using TailMask = __mmask16;  // the first n lanes
inline TailMask tail_mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
inline FloatBlock load_block(const float* p) { return _mm512_loadu_ps(p); }
inline FloatBlock masked_load(const float* p, TailMask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void masked_store(float* p, TailMask m, FloatBlock x) { _mm512_mask_storeu_ps(p, m, x); }
inline FloatBlock fma_block(FloatBlock a, FloatBlock b, FloatBlock c) { return _mm512_fmadd_ps(a, b, c); }
inline float block_sum(FloatBlock x) { return _mm512_reduce_add_ps(x); }
inline float block_max(FloatBlock x) { return _mm512_reduce_max_ps(x); }
// exp16, a NaN lane kept NaN (the exp alone would give 0)
inline FloatBlock exp_block(FloatBlock x) {
  return _mm512_mask_mov_ps(detail::exp16(x), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
#else
using FloatBlock = __m256;
using TailMask = __m256i;
inline TailMask tail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline FloatBlock load_block(const float* p) { return _mm256_loadu_ps(p); }
inline FloatBlock masked_load(const float* p, TailMask m) { return _mm256_maskload_ps(p, m); }
inline void masked_store(float* p, TailMask m, FloatBlock x) { _mm256_maskstore_ps(p, m, x); }
inline FloatBlock fma_block(FloatBlock a, FloatBlock b, FloatBlock c) { return _mm256_fmadd_ps(a, b, c); }
inline float block_sum(FloatBlock x) { return detail::sum8(x); }
inline float block_max(FloatBlock x) { return detail::max8(x); }
inline FloatBlock exp_block(FloatBlock x) {
  return _mm256_blendv_ps(detail::exp8(x), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif
static_assert(sizeof(FloatBlock) == sizeof(Lanes<float>::type));

inline FloatBlock as_block(const Lanes<float>::type& v) {
  FloatBlock b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
inline void from_block(Lanes<float>::type& v, FloatBlock b) { std::memcpy(&v, &b, sizeof v); }

// [SECTION] train_kernels.hpp's blocks for floats

// A last block of fewer than kAttnWidth floats: one masked load or store.
template <>
struct PartIO<float> {
  explicit PartIO(int lanes) : mask(tail_mask(lanes)) {}
  void load(Lanes<float>::type& v, const float* p) const { from_block(v, masked_load(p, mask)); }
  void store(float* p, const Lanes<float>::type& v) const { masked_store(p, mask, as_block(v)); }
  TailMask mask;
};

// The lanes' sum and max as a tree (halves, then quarters, ...).
template <>
float lane_total<float>(const Lanes<float>::type& v) {
  return block_sum(as_block(v));
}
template <>
float lane_max<float>(const Lanes<float>::type& v) {
  return block_max(as_block(v));
}

// exp of every lane (x <= 0): exp16 / exp8 (the viewer's softmax exp: within 1 ulp, exactly 0 for
// -inf), a NaN lane kept NaN.
inline void exp_lanes(Lanes<float>::type& v) { from_block(v, exp_block(as_block(v))); }

// exp_row for the floats of the vector builds: exp_lanes gives exactly 0 for -inf, no mask needed.
inline void exp_row(float* row, const float*, int Np, float top, Lanes<float>::type& sum) {
  Lanes<float>::type x;
  sum = Lanes<float>::type{};
  for (int j0 = 0; j0 < Np; j0 += kAttnWidth) {
    std::memcpy(&x, row + j0, sizeof x);
    x -= top;
    exp_lanes(x);
    std::memcpy(row + j0, &x, sizeof x);
    sum += x;
  }
}

// row_dot for the floats of the vector builds: FMA into one block of lanes, the last through masked
// loads, the lanes' sum as a tree (lane_total).
inline float row_dot(const float* a, const float* b, int n) {
  int j0 = 0;
  FloatBlock part = FloatBlock{};
  for (; j0 + kAttnWidth <= n; j0 += kAttnWidth) part = fma_block(load_block(a + j0), load_block(b + j0), part);
  if (j0 < n) {
    const TailMask tail = tail_mask(n - j0);
    part = fma_block(masked_load(a + j0, tail), masked_load(b + j0, tail), part);
  }
  Lanes<float>::type lanes;
  from_block(lanes, part);
  return lane_total<float>(lanes);
}

// copy_transposed_padded for the floats of the vector builds: 8 x 8 squares through registers
// (transpose8x8). Element by element, reading down a column of k or v (one cache line per value,
// row stride 3D) took about a tenth of the attention forward.
inline void copy_transposed_padded(const float* src, int64_t ld, int rows, int cols, int rows_padded, float* dst) {
  for (int j0 = 0; j0 < rows_padded; j0 += 8) {  // rows_padded: a multiple of kAttnWidth (8 or 16)
    const int here = std::min(8, rows - j0);      // rows of src in this square (the rest are zero)
    for (int t0 = 0; t0 < cols; t0 += 8) {
      const int width = std::min(8, cols - t0);
      const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(width), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256 square[8];
      for (int u = 0; u < 8; ++u)
        square[u] = u < here ? _mm256_maskload_ps(src + (j0 + u) * ld + t0, lanes) : _mm256_setzero_ps();
      detail::transpose8x8(square);
      for (int u = 0; u < width; ++u) _mm256_storeu_ps(dst + static_cast<int64_t>(t0 + u) * rows_padded + j0, square[u]);
    }
  }
}

// out[i] = f(x[i]) or, with g, f(x[i]) * g[i], for count floats; the tail through padded vectors.
template <class F>
void map8(F f, const float* x, const float* g, int64_t count, float* out) {
  const auto value = [&](const float* xs, const float* gs) {
    const __m256 v = f(_mm256_loadu_ps(xs));
    return g ? _mm256_mul_ps(v, _mm256_loadu_ps(gs)) : v;
  };
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, value(x + i, g ? g + i : nullptr));
  if (i < count) {
    float px[8] = {}, pg[8] = {};
    std::copy(x + i, x + count, px);
    if (g) std::copy(g + i, g + count, pg);
    _mm256_storeu_ps(px, value(px, pg));
    std::copy(px, px + (count - i), out + i);
  }
}
#if defined(__AVX512F__)
// map8 at 16 lanes, the tail through masked loads and stores.
template <class F>
void map16(F f, const float* x, const float* g, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 v = f(_mm512_loadu_ps(x + i));
    _mm512_storeu_ps(out + i, g ? _mm512_mul_ps(v, _mm512_loadu_ps(g + i)) : v);
  }
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512 v = f(_mm512_maskz_loadu_ps(tail, x + i));
    _mm512_mask_storeu_ps(out + i, tail, g ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(tail, g + i)) : v);
  }
}
#endif

// gelu_chunk and gelu_slope_times_chunk for the floats of the vector builds.
inline void gelu_chunk(const float* x, int64_t len, float* out) {
#if defined(__AVX512F__)
  map16([](__m512 v) { return detail::gelu16(v); }, x, nullptr, len, out);
#else
  map8([](__m256 v) { return detail::gelu8(v); }, x, nullptr, len, out);
#endif
}
inline void gelu_slope_times_chunk(const float* x, const float* g, int64_t len, float* out) {
#if defined(__AVX512F__)
  map16([](__m512 v) { return detail::gelu_slope16(v); }, x, g, len, out);
#else
  map8([](__m256 v) { return detail::gelu_slope8(v); }, x, g, len, out);
#endif
}

}  // namespace
}  // namespace vitlens::train
