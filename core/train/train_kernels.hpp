#pragma once
// The kernels of the training ops (train_ops_ref.cpp): the blocks of lanes, products and softmax
// rows the attention runs on, LayerNorm's float rows, GELU chunks and the fixed-order sums. Plain
// C++ with GCC/clang vector types, compiled with the ops once per instruction set (the compiler
// maps the same blocks onto SSE2, AVX2 or AVX-512 registers); the few that need intrinsics, for
// the floats of the vector builds, are overloads in train_kernels_x86.hpp. Internal linkage: each
// build keeps its own copy.
//
// Index
//   [SECTION] Build             the instruction set this copy is compiled for
//   [SECTION] Sums              lane_sum
//   [SECTION] LayerNorm rows    the float rows of layernorm_forward and layernorm_backward
//   [SECTION] Blocks of lanes   Lanes, FullIO, PartIO, lane_total, lane_max
//   [SECTION] Attention rows    exp_row, row_dot, copy_transposed_padded, scratch, prefetch
//   [SECTION] GELU              gelu_chunk, gelu_slope_values, gelu_slope_chunk
//   [SECTION] Small products    small_product and its blocks
//   [SECTION] Softmax           softmax_row
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // vectorised erf for the GELU

#include "core/cpu/cpu.hpp"

namespace vitlens::train {
namespace {

// [SECTION] Build
//
// The compiler's flags name the build (core/CMakeLists.txt compiles train_ops_ref.cpp with none,
// with -mavx2 -mfma and with -mavx512f -mavx2 -mfma). kAttnWidth: the columns of one block of the
// attention's products, one register of floats (AVX2, AVX-512; two SSE registers in the portable
// build).
#if defined(__AVX512F__)
constexpr KernelIsa kBuildIsa = KernelIsa::Avx512;
constexpr int kAttnWidth = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr KernelIsa kBuildIsa = KernelIsa::Avx2;
constexpr int kAttnWidth = 8;
#else
constexpr KernelIsa kBuildIsa = KernelIsa::Portable;
constexpr int kAttnWidth = 8;
#endif
// The vector builds' float GELU is the SGEMM tiles' own, so the fused epilogues give the separate
// ops' bits there; the portable build's (Eigen's erf) is not, and runs the separate ops.
constexpr bool kVectorBuild = kBuildIsa != KernelIsa::Portable;

// [SECTION] Sums

// Sums in kLanes independent partial sums, added in a fixed order at the end: the compiler turns
// the inner loop into vector adds (a single running sum is one long dependency chain it may not
// reorder), and the result is the same on every call and thread count (the order is fixed by the
// code, not by addresses or the vector width).
constexpr int kLanes = 8;

template <class Acc, class F>
Acc lane_sum(int n, F&& term) {
  Acc part[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += static_cast<Acc>(term(i + j));
  for (; i < n; ++i) part[i % kLanes] += static_cast<Acc>(term(i));
  Acc total = 0;
  for (int j = 0; j < kLanes; ++j) total += part[j];
  return total;
}

// [SECTION] LayerNorm rows

// The float rows of layernorm_forward and layernorm_backward, 8 values a step as GCC/clang vectors
// (one AVX register of floats, one AVX-512 or two AVX registers of the doubles; SSE registers in
// the portable build), the last D % 8 through zero-padded copies. A row is short (D = 48 in the
// default recipe) and its sums are chains: as scalar lane_sum loops each row was one long serial
// computation (about 6 % of a training step for both directions). Rows go G at a time, side by
// side, so the processor overlaps their chains (measured on the Zen 4 VM: the backward about a
// quarter faster, the forward little, being mostly memory traffic in a step). Each sum adds its 8
// lanes as a fixed tree (sum_lanes), the same order on every call.
typedef float Floats8 __attribute__((vector_size(8 * sizeof(float))));
typedef double Doubles8 __attribute__((vector_size(8 * sizeof(double))));

template <class V>
inline auto sum_lanes(const V& v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// x[i, i + 8) as a vector, the values past n (0 < n - i < 8 for the last) read as 0
inline void load8(Floats8& v, const float* x, int i, int n) {
  if (i + 8 <= n) {
    std::memcpy(&v, x + i, sizeof v);
  } else {
    Floats8 part = {};  // its own variable: v stays in a register
    std::memcpy(&part, x + i, static_cast<size_t>(n - i) * sizeof(float));
    v = part;
  }
}
inline void store8(float* y, int i, int n, const Floats8& v) {
  if (i + 8 <= n) {
    std::memcpy(y + i, &v, sizeof v);
  } else {
    const Floats8 part = v;
    std::memcpy(y + i, &part, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// Rows [r, r + G) of layernorm_forward, in lockstep: the G rows' chains (dependent adds, the
// divisions and the square root) are independent. Each row's arithmetic is the same whatever G.
template <int G>
void layernorm_group(const float* inp, const float* w, const float* b, double eps, int r, int D, float* out,
                     float* mean, float* rstd) {
  const float* x = inp + static_cast<int64_t>(r) * D;
  float* y = out + static_cast<int64_t>(r) * D;
  Doubles8 tail_keep = {};  // 1 in the lanes of the last step that are inside the row
  for (int j = 0; j < 8; ++j) tail_keep[j] = (D % 8 == 0 || j < D % 8) ? 1.0 : 0.0;
  Doubles8 acc[G];
  Floats8 f;
  double m[G];
  float mt[G], st[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) acc[g] = Doubles8{};
  for (int i = 0; i < D; i += 8) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      load8(f, x + static_cast<int64_t>(g) * D, i, D);
      acc[g] += __builtin_convertvector(f, Doubles8);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    m[g] = sum_lanes(acc[g]) / D;
    acc[g] = Doubles8{};
  }
  for (int i = 0; i < D; i += 8) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      load8(f, x + static_cast<int64_t>(g) * D, i, D);
      Doubles8 t = __builtin_convertvector(f, Doubles8) - m[g];
      if (i + 8 > D) t *= tail_keep;
      acc[g] += t * t;
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const double v = sum_lanes(acc[g]) / D;  // biased variance, as torch
    st[g] = static_cast<float>(1.0 / std::sqrt(v + eps));
    mt[g] = static_cast<float>(m[g]);
    mean[r + g] = mt[g];
    rstd[r + g] = st[g];
  }
  Floats8 wv, bv;
  for (int i = 0; i < D; i += 8) {
    load8(wv, w, i, D);
    load8(bv, b, i, D);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      load8(f, x + static_cast<int64_t>(g) * D, i, D);
      store8(y + static_cast<int64_t>(g) * D, i, D, (f - mt[g]) * st[g] * wv + bv);
    }
  }
}

void layernorm_rows(const float* inp, const float* w, const float* b, float eps, int r0, int r1, int D, float* out,
                    float* mean, float* rstd) {
  int r = r0;
  for (; r + 4 <= r1; r += 4) layernorm_group<4>(inp, w, b, eps, r, D, out, mean, rstd);
  for (; r < r1; ++r) layernorm_group<1>(inp, w, b, eps, r, D, out, mean, rstd);
}

// Rows [r, r + G) of layernorm_backward in lockstep, as layernorm_group: dinp += (dxhat -
// mean(dxhat) - xhat mean(dxhat xhat)) rstd, and each row's dy xhat and dy added to pw and pb (D
// each) one row after the other, as the generic loop does.
template <int G>
void layernorm_group_backward(const float* dout, const float* inp, const float* w, const float* mean,
                              const float* rstd, int r, int D, float* dinp, float* pw, float* pb) {
  const int64_t at = static_cast<int64_t>(r) * D;
  const float *x = inp + at, *dy = dout + at;
  float* dx = dinp + at;
  float m[G], s[G], mean_dxhat[G], mean_dxhat_xhat[G];
  Floats8 sum_dxhat[G], sum_dxhat_xhat[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    m[g] = mean[r + g];
    s[g] = rstd[r + g];
    sum_dxhat[g] = sum_dxhat_xhat[g] = Floats8{};
  }
  // xhat = (x - mean) * rstd; dxhat = dy * w (in the lanes past D: dy = 0, so both terms 0)
  Floats8 f, gv, wv, acc_w, acc_b, dxv;
  for (int i = 0; i < D; i += 8) {
    load8(wv, w, i, D);
    load8(acc_w, pw, i, D);
    load8(acc_b, pb, i, D);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      load8(f, x + static_cast<int64_t>(g) * D, i, D);
      load8(gv, dy + static_cast<int64_t>(g) * D, i, D);
      const Floats8 dxhat = gv * wv, xhat = (f - m[g]) * s[g];
      sum_dxhat[g] += dxhat;
      sum_dxhat_xhat[g] += dxhat * xhat;
      acc_w += gv * xhat;
      acc_b += gv;
    }
    store8(pw, i, D, acc_w);
    store8(pb, i, D, acc_b);
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    mean_dxhat[g] = sum_lanes(sum_dxhat[g]) / D;
    mean_dxhat_xhat[g] = sum_lanes(sum_dxhat_xhat[g]) / D;
  }
  for (int i = 0; i < D; i += 8) {
    load8(wv, w, i, D);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const int64_t row = static_cast<int64_t>(g) * D;
      load8(f, x + row, i, D);
      load8(gv, dy + row, i, D);
      load8(dxv, dx + row, i, D);
      const Floats8 xhat = (f - m[g]) * s[g];
      store8(dx + row, i, D, dxv + (gv * wv - mean_dxhat[g] - xhat * mean_dxhat_xhat[g]) * s[g]);
    }
  }
}

void layernorm_rows_backward(const float* dout, const float* inp, const float* w, const float* mean,
                             const float* rstd, int r0, int r1, int D, float* dinp, float* pw, float* pb) {
  int r = r0;
  for (; r + 4 <= r1; r += 4) layernorm_group_backward<4>(dout, inp, w, mean, rstd, r, D, dinp, pw, pb);
  for (; r < r1; ++r) layernorm_group_backward<1>(dout, inp, w, mean, rstd, r, D, dinp, pw, pb);
}


// [SECTION] Blocks of lanes

int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// One block of kAttnWidth values as a GCC/clang vector (one AVX register of floats, two of doubles;
// one and two AVX-512 registers in the AVX-512 build; two and four SSE registers in the portable
// build). Its arithmetic is the same in every lane, so the numbers never depend on how a loop over
// blocks is split. `a * b + c` on blocks compiles to one FMA (one rounding) in the vector builds
// with g++ 12 and clang 14 alike, to a multiply and an add in the portable build.
template <class T>
struct Lanes {
  typedef T type __attribute__((vector_size(kAttnWidth * sizeof(T))));
};

// Unaligned block load and store (by reference: g++ warns that returning a 32- or 64-byte vector
// by value changes the ABI in the portable build).
template <class T>
inline void load_lanes(typename Lanes<T>::type& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}
template <class T>
inline void store_lanes(T* p, const typename Lanes<T>::type& v) {
  std::memcpy(p, &v, sizeof v);
}

// Loads and stores of one block of a row of b or c in small_product: all kAttnWidth lanes
// (FullIO), or only the first n (PartIO: the lanes past n load as 0 and are never stored), so b and
// c may be a head's d columns inside the rows of qkv, ctx or dqkv, read and written in place with
// nothing past them touched.
template <class T>
struct FullIO {
  void load(typename Lanes<T>::type& v, const T* p) const { load_lanes(v, p); }
  void store(T* p, const typename Lanes<T>::type& v) const { store_lanes(p, v); }
};
template <class T>
struct PartIO {
  explicit PartIO(int lanes) : n(lanes) {}  // 0 < lanes < kAttnWidth
  void load(typename Lanes<T>::type& v, const T* p) const {
    v = typename Lanes<T>::type{};
    std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(T));
  }
  void store(T* p, const typename Lanes<T>::type& v) const { std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(T)); }
  int n;
};
// The sum and the largest of a block's lanes: one after the other in lane order, and for the floats
// of the vector builds as a tree (halves, then quarters, ...: also a fixed order, and a chain of 3
// or 4 steps where lane by lane was 7 or 15; the max is exact in any order).
template <class T>
T lane_total(const typename Lanes<T>::type& v) {
  T total = 0;
  for (int u = 0; u < kAttnWidth; ++u) total += v[u];
  return total;
}
template <class T>
T lane_max(const typename Lanes<T>::type& v) {
  T top = v[0];
  for (int u = 1; u < kAttnWidth; ++u) top = std::max(top, v[u]);
  return top;
}


// [SECTION] Attention rows

// row[j] = exp(row[j] - top) for a padded row (n a multiple of kAttnWidth, aligned) with Eigen's
// vectorised exp on its all-packet path (the row is aligned).
template <class T>
void exp_shifted(T* row, int n, T top) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::Aligned32> e(row, n);
  e = (e - top).exp();
}

// row[j] = exp(row[j] - top) over a padded row (Np a multiple of kAttnWidth, aligned) with the
// masked and padded keys exactly 0 (keep: 1 or 0), and sum = the lanes' sums of the exps: Eigen's
// vectorised exp over the whole row, then the mask (its exp of -inf is tiny but finite, so times
// 0 is 0). The vector builds' floats: train_kernels_x86.hpp (its exp gives exactly 0 for -inf).
template <class T>
void exp_row(T* row, const T* keep, int Np, T top, typename Lanes<T>::type& sum) {
  using V = typename Lanes<T>::type;
  exp_shifted(row, Np, top);
  V x, m;
  sum = V{};
  for (int j0 = 0; j0 < Np; j0 += kAttnWidth) {
    std::memcpy(&x, row + j0, sizeof x);
    std::memcpy(&m, keep + j0, sizeof m);
    x *= m;
    std::memcpy(row + j0, &x, sizeof x);
    sum += x;
  }
}

// sum_j a_j b_j for j < n, in kLanes partial sums added in a fixed order (lane_sum). Reads a and b
// only up to n: a may be a row of the caller's unpadded attention weights.
template <class T>
T row_dot(const T* a, const T* b, int n) {
  return lane_sum<T>(n, [&](int j) { return a[j] * b[j]; });
}

// dst (cols, rows_padded) = src^T for src (rows, cols) with row stride ld, the padding zero (the
// vector builds' floats: train_kernels_x86.hpp).
template <class T>
void copy_transposed_padded(const T* src, int64_t ld, int rows, int cols, int rows_padded, T* dst) {
  for (int t = 0; t < cols; ++t) std::fill(dst + static_cast<int64_t>(t) * rows_padded + rows,
                                           dst + static_cast<int64_t>(t + 1) * rows_padded, T(0));
  for (int j = 0; j < rows; ++j)  // src's rows in order: each read once, front to back
    for (int t = 0; t < cols; ++t) dst[static_cast<int64_t>(t) * rows_padded + j] = src[j * ld + t];
}

// Per-thread scratch for one (image, head), carved into 64-byte aligned pieces. Thread-local and
// kept between calls (the pool's threads live as long as the process), so a training step does
// not allocate; the aligned start keeps Eigen's vectorised exp on its all-packet path (its scalar
// and packet exp round differently, so a start that moved with the address would move the bits).
template <class T>
class AttentionScratch {
 public:
  // Makes room for `values` values (the sum of the pieces, each rounded by piece()) and returns
  // the aligned start of the first.
  T* reserve(size_t values) {
    if (store_.size() < values + kAlignValues) store_.assign(values + kAlignValues, T(0));
    const uintptr_t at = reinterpret_cast<uintptr_t>(store_.data());
    const uintptr_t aligned = (at + kAlign - 1) / kAlign * kAlign;
    return store_.data() + (aligned - at) / sizeof(T);
  }
  static size_t piece(size_t values) { return (values + kAlignValues - 1) / kAlignValues * kAlignValues; }

 private:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kAlignValues = kAlign / sizeof(T);
  std::vector<T> store_;
};

template <class T>
AttentionScratch<T>& attention_scratch() {
  thread_local AttentionScratch<T> scratch;
  return scratch;
}

// Asks for the cache lines of p[0, count) a share at a time: share `part` of `parts`. The
// attention tasks run over images in order and read their operands from activations written long
// before (the backward) or by the product just before (the forward), megabytes away, as 48-byte
// head slices of 576-byte rows, a stride the hardware prefetcher does not follow: fetched on demand
// they cost about a fifth of the attention's time (microbenchmark, cold buffers). Each task asks
// for its share of the next image's, into the L2 cache (a hint: never changes a number).
template <class T>
void prefetch_share(const T* p, int64_t count, int part, int parts) {
  const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
  const int64_t lines = (bytes + 63) / 64, first = lines * part / parts, last = lines * (part + 1) / parts;
  const char* at = reinterpret_cast<const char*>(p);
  for (int64_t line = first; line < last; ++line) __builtin_prefetch(at + line * 64, 0, 2);
}


// [SECTION] GELU

// The float ops of the vector builds run avx2_math.hpp's vector GELU (train_kernels_x86.hpp) (the viewer's forward, within
// 1e-6 of std::erf's formula; avx512_math.hpp's 16-lane copy in the AVX-512 build, the same
// values but below about 1e-38, where exp16 rounds a subnormal correctly and exp8 does not) and
// its derivative, one exp for both terms. The other builds work on
// Eigen-owned scratch copies of each chunk: Eigen starts its vector loop where the data is aligned,
// so on the caller's buffers the scalar (std::erf) / vector (polynomial erf) split, and with it the
// last bits, would depend on the buffer's address. Both tails go through a padded vector for the
// same reason.

// out = GELU(x) for len values, on an Eigen-owned copy of the chunk (see above); out may be x.
template <class T>
void gelu_chunk(const T* x, int64_t len, T* out) {
  const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
  Eigen::Array<T, Eigen::Dynamic, 1> v = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, len);
  v = T(0.5) * v * (T(1) + (v * inv_sqrt2).erf());
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out, len) = v;
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x) for len values, on an Eigen-owned copy (see above).
template <class T>
Eigen::Array<T, Eigen::Dynamic, 1> gelu_slope_values(const T* inp, int64_t len) {
  const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
  const T inv_sqrt_2pi = static_cast<T>(0.39894228040143267794);
  const Eigen::Array<T, Eigen::Dynamic, 1> x = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(inp, len);
  return T(0.5) * (T(1) + (x * inv_sqrt2).erf()) + x * inv_sqrt_2pi * (T(-0.5) * x.square()).exp();
}
// out = gelu_slope_values(inp, len); out may be inp.
template <class T>
void gelu_slope_chunk(const T* inp, int64_t len, T* out) {
  const Eigen::Array<T, Eigen::Dynamic, 1> slope = gelu_slope_values(inp, len);
  for (int64_t i = 0; i < len; ++i) out[i] = slope[i];
}

// out = GELU'(x) * g for len values (gelu_backward's dinp); out may be g.
template <class T>
void gelu_slope_times_chunk(const T* x, const T* g, int64_t len, T* out) {
  Eigen::Array<T, Eigen::Dynamic, 1> slope = gelu_slope_values(x, len);
  slope *= Eigen::Array<T, Eigen::Dynamic, 1>(Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(g, len));
  for (int64_t i = 0; i < len; ++i) out[i] = slope[i];
}

}  // namespace
}  // namespace vitlens::train

#if defined(__AVX2__) && defined(__FMA__)
#include "core/train/train_kernels_x86.hpp"  // the vector builds' float overloads
#endif

namespace vitlens::train {
namespace {

// [SECTION] Small products

// c (M, 2 kAttnWidth) = a (M, K) @ b (K, 2 kAttnWidth), b's rows b_row apart, c's c_row, a read
// through strides (a(i, k) = a[i * a_row + k * a_col]: a transposed operand needs no copy). Each
// c(i, w) is the chain acc = a(i, k) * b(k, w) + acc for k = 0, 1, ..., K - 1 from acc = 0, the
// same in every kind of block here and in product_block (4 rows x 2 blocks of columns, 1 x 2;
// 8 x 1, 4 x 1, 1 x 1). The 4 x 2 blocks keep 8 FMA chains in flight for 2 loads and 4 broadcasts
// per k, as do product_block's 8 x 1 blocks for 1 load and 8 broadcasts. The accumulators are
// named variables, not arrays: g++ clears an array with `rep stos` on the stack.
template <class T>
void product_two_blocks(int M, int K, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t b_row, T* c,
                        int64_t c_row) {
  using V = typename Lanes<T>::type;
  constexpr int kW = kAttnWidth;
  int i = 0;
  for (; i + 4 <= M; i += 4) {
    V c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
    const T* ai = a + i * a_row;
    for (int k = 0; k < K; ++k) {
      const T* bk = b + k * b_row;
      V b0, b1;
      load_lanes(b0, bk);
      load_lanes(b1, bk + kW);
      const T* aik = ai + k * a_col;
      const T x0 = aik[0], x1 = aik[a_row], x2 = aik[2 * a_row], x3 = aik[3 * a_row];
      c00 = x0 * b0 + c00;
      c01 = x0 * b1 + c01;
      c10 = x1 * b0 + c10;
      c11 = x1 * b1 + c11;
      c20 = x2 * b0 + c20;
      c21 = x2 * b1 + c21;
      c30 = x3 * b0 + c30;
      c31 = x3 * b1 + c31;
    }
    T* ci = c + i * c_row;
    store_lanes(ci, c00);
    store_lanes(ci + kW, c01);
    store_lanes(ci + c_row, c10);
    store_lanes(ci + c_row + kW, c11);
    store_lanes(ci + 2 * c_row, c20);
    store_lanes(ci + 2 * c_row + kW, c21);
    store_lanes(ci + 3 * c_row, c30);
    store_lanes(ci + 3 * c_row + kW, c31);
  }
  for (; i < M; ++i) {
    V c0 = {}, c1 = {};
    for (int k = 0; k < K; ++k) {
      const T* bk = b + k * b_row;
      const T x = a[i * a_row + k * a_col];
      V b0, b1;
      load_lanes(b0, bk);
      load_lanes(b1, bk + kW);
      c0 = x * b0 + c0;
      c1 = x * b1 + c1;
    }
    store_lanes(c + i * c_row, c0);
    store_lanes(c + i * c_row + kW, c1);
  }
}

// c (M, kAttnWidth) = a (M, K) @ b (K, kAttnWidth) as product_two_blocks, b's and c's blocks
// through io (FullIO, or PartIO for a last block of fewer columns). 8 rows at a time where a single
// block of columns is left (4 rows would keep only 4 FMA chains in flight, fewer than the FMA
// latency needs).
template <class T, class IO>
void product_block(int M, int K, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t b_row, T* c,
                   int64_t c_row, const IO& io) {
  using V = typename Lanes<T>::type;
  int i = 0;
  for (; i + 8 <= M; i += 8) {
    V c0 = {}, c1 = {}, c2 = {}, c3 = {}, c4 = {}, c5 = {}, c6 = {}, c7 = {};
    const T* ai = a + i * a_row;
    for (int k = 0; k < K; ++k) {
      V bk;
      io.load(bk, b + k * b_row);
      const T* aik = ai + k * a_col;
      c0 = aik[0] * bk + c0;
      c1 = aik[a_row] * bk + c1;
      c2 = aik[2 * a_row] * bk + c2;
      c3 = aik[3 * a_row] * bk + c3;
      c4 = aik[4 * a_row] * bk + c4;
      c5 = aik[5 * a_row] * bk + c5;
      c6 = aik[6 * a_row] * bk + c6;
      c7 = aik[7 * a_row] * bk + c7;
    }
    T* ci = c + i * c_row;
    io.store(ci, c0);
    io.store(ci + c_row, c1);
    io.store(ci + 2 * c_row, c2);
    io.store(ci + 3 * c_row, c3);
    io.store(ci + 4 * c_row, c4);
    io.store(ci + 5 * c_row, c5);
    io.store(ci + 6 * c_row, c6);
    io.store(ci + 7 * c_row, c7);
  }
  for (; i + 4 <= M; i += 4) {
    V c0 = {}, c1 = {}, c2 = {}, c3 = {};
    const T* ai = a + i * a_row;
    for (int k = 0; k < K; ++k) {
      V bk;
      io.load(bk, b + k * b_row);
      const T* aik = ai + k * a_col;
      c0 = aik[0] * bk + c0;
      c1 = aik[a_row] * bk + c1;
      c2 = aik[2 * a_row] * bk + c2;
      c3 = aik[3 * a_row] * bk + c3;
    }
    T* ci = c + i * c_row;
    io.store(ci, c0);
    io.store(ci + c_row, c1);
    io.store(ci + 2 * c_row, c2);
    io.store(ci + 3 * c_row, c3);
  }
  for (; i < M; ++i) {
    V c0 = {};
    for (int k = 0; k < K; ++k) {
      V bk;
      io.load(bk, b + k * b_row);
      c0 = a[i * a_row + k * a_col] * bk + c0;
    }
    io.store(c + i * c_row, c0);
  }
}

// c (M, W) = a (M, K) @ b (K, W) for any W: b's rows b_row apart, c's c_row apart (a head's d
// columns of qkv or dqkv, or a padded local buffer), a read through strides (product_two_blocks).
// Pairs of whole blocks of columns, then a whole block, then the rest through masked loads and
// stores; every c(i, w) is the same chain whichever kind of block it falls in.
template <class T>
void small_product(int M, int K, int W, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t b_row, T* c,
                   int64_t c_row) {
  constexpr int kW = kAttnWidth;
  int w0 = 0;
  for (; w0 + 2 * kW <= W; w0 += 2 * kW) product_two_blocks(M, K, a, a_row, a_col, b + w0, b_row, c + w0, c_row);
  for (; w0 + kW <= W; w0 += kW) product_block(M, K, a, a_row, a_col, b + w0, b_row, c + w0, c_row, FullIO<T>{});
  if (w0 < W) product_block(M, K, a, a_row, a_col, b + w0, b_row, c + w0, c_row, PartIO<T>(W - w0));
}


// [SECTION] Softmax

// One row of the attention softmax in place: row (Np, aligned) holds the scores q . k of one query,
// bias (Np) is 0 for a key that may be attended to and -inf for a masked or padded one, keep (Np)
// 1 or 0 alike. Leaves the weights softmax(score * scale + bias) in p[0, N) (row then holds the
// unnormalised exps); a row whose keys are all masked is all 0, never NaN. A NaN score makes the whole row
// NaN in every build rather than a finite map that hides it, unless it is the row's only unmasked
// key (the max then ignores it and the row is taken for all masked: all 0).
template <class T>
void softmax_row(T* row, const T* bias, const T* keep, int N, int Np, T scale, T* p) {
  using V = typename Lanes<T>::type;
  // x = score * scale, -inf where masked; its largest value (x > top: a NaN x leaves top as it was)
  V top_lanes = V{} - std::numeric_limits<T>::infinity(), x, m;
  for (int j0 = 0; j0 < Np; j0 += kAttnWidth) {
    std::memcpy(&x, row + j0, sizeof x);
    std::memcpy(&m, bias + j0, sizeof m);
    x = x * scale + m;
    std::memcpy(row + j0, &x, sizeof x);
    top_lanes = x > top_lanes ? x : top_lanes;
  }
  const T top = lane_max<T>(top_lanes);
  if (top == -std::numeric_limits<T>::infinity()) {  // every key masked
    std::fill(row, row + Np, T(0));
    std::fill(p, p + N, T(0));
    return;
  }
  V sum_lanes;
  exp_row(row, keep, Np, top, sum_lanes);
  const T inv_sum = T(1) / lane_total<T>(sum_lanes);
  int j0 = 0;
  for (; j0 + kAttnWidth <= N; j0 += kAttnWidth) {
    std::memcpy(&x, row + j0, sizeof x);
    x *= inv_sum;
    std::memcpy(p + j0, &x, sizeof x);
  }
  if (j0 < N) {
    std::memcpy(&x, row + j0, sizeof x);
    x *= inv_sum;
    PartIO<T>(N - j0).store(p + j0, x);
  }
}

}  // namespace
}  // namespace vitlens::train
