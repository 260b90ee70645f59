// The training ops: forward and backward pairs (see train_ops.hpp for shapes and the legend).
//
// This file is compiled three times: as itself (namespace vitlens::train::portable, SSE2, any
// x86-64), through train_ops_avx2.cpp with -mavx2 -mfma (namespace ::avx2) and through
// train_ops_avx512.cpp with -mavx512f (namespace ::avx512), Eigen's namespace renamed in the last
// two so that no Eigen function compiled for AVX2 or AVX-512 can stand in for the portable one at
// link time. The public functions at the end pick one at run time.
#include "core/train/train_ops.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // vectorised erf for the GELU

#include "core/cpu/gemm.hpp"
#include "core/base/parallel.hpp"
#ifndef VITLENS_TRAIN_ISA
#include "core/cpu/fast_attention.hpp"  // kernel_isa(): the run-time choice at the end
#endif

#ifndef VITLENS_TRAIN_ISA
#define VITLENS_TRAIN_ISA portable
#define VITLENS_TRAIN_PORTABLE_BUILD 1
#else
#include "core/cpu/avx2_math.hpp"  // gelu8, gelu_slope8, exp8, transpose8x8, sum8, max8 (this build has -mavx2 -mfma)
#ifdef VITLENS_TRAIN_AVX512
#include "core/cpu/avx512_math.hpp"  // gelu16, gelu_slope16, exp16 (this build has -mavx512f)
#endif
#endif

namespace vitlens::train {

#ifdef VITLENS_TRAIN_PORTABLE_BUILD
void parallel_for(int tasks, int threads, const std::function<void(int)>& task) { run_tasks(tasks, threads, task); }
#endif

namespace VITLENS_TRAIN_ISA {

#include "core/train/train_ops_list.inc"

namespace {

// Fixed task sizes: the split of the work never depends on the thread count, so neither do the
// numbers (each task's arithmetic is the same whoever runs it).
constexpr int kRowChunk = 256;         // rows of a Linear / LayerNorm per task
constexpr int kFeatureChunk = 16;      // output features of a weight gradient per task
constexpr int64_t kElementChunk = 1 << 15;  // values of an elementwise op per task

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<Mat<T>>;
template <class T>
using ConstMap = Eigen::Map<const Mat<T>>;
template <class T>
using Strided = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstStrided = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

int chunks_of(int64_t n, int64_t chunk) { return static_cast<int>((n + chunk - 1) / chunk); }

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

// The packed SGEMM (gemm.hpp) the float Linear products run on: the portable kernels in the
// portable build, whatever the CPU, else the widest the CPU has (AVX2 + FMA or AVX-512, as
// kernel_isa() chose). Its threads split the output at fixed multiples of its tile and every
// output element is the same FMA chain wherever it falls, so the numbers do not depend on the
// thread count either.
const detail::GemmKernels& train_gemm() {
#ifdef VITLENS_TRAIN_PORTABLE_BUILD
  return detail::kPortableGemm;
#else
  return detail::active_gemm_kernels();
#endif
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// patchify: x = self.proj(x).flatten(2).transpose(1, 2) with proj = Conv2d(3, D, P, stride=P)

template <class T>
void patchify_forward(const T* images, int B, int H, int W, int P, T* patches) {
  const int gh = H / P, gw = W / P, K = 3 * P * P;
  for (int b = 0; b < B; ++b)
    for (int py = 0; py < gh; ++py)
      for (int px = 0; px < gw; ++px) {
        T* row = patches + ((static_cast<int64_t>(b) * gh + py) * gw + px) * K;
        for (int c = 0; c < 3; ++c)
          for (int y = 0; y < P; ++y) {
            const T* src = images + ((static_cast<int64_t>(b) * 3 + c) * H + py * P + y) * W + px * P;
            std::copy(src, src + P, row + (c * P + y) * P);
          }
      }
}

template <class T>
void patchify_backward(const T* dpatches, int B, int H, int W, int P, T* dimages) {
  const int gh = H / P, gw = W / P, K = 3 * P * P;
  for (int b = 0; b < B; ++b)
    for (int py = 0; py < gh; ++py)
      for (int px = 0; px < gw; ++px) {
        const T* row = dpatches + ((static_cast<int64_t>(b) * gh + py) * gw + px) * K;
        for (int c = 0; c < 3; ++c)
          for (int y = 0; y < P; ++y) {
            T* dst = dimages + ((static_cast<int64_t>(b) * 3 + c) * H + py * P + y) * W + px * P;
            for (int x = 0; x < P; ++x) dst[x] += row[(c * P + y) * P + x];
          }
      }
}

// ---------------------------------------------------------------------------------------------
// linear: nn.Linear, out = inp @ w^T + b, as whole (rows, features) GEMMs per row chunk.

namespace {
// The float forward product on the SGEMM, with the tiles' epilogue: out (R, O) = inp (R, I) @ B + b,
// B (I, O) = w^T (element (p, j) of B is w[j * I + p]), then what `epilogue` and `extras` ask for.
void linear_forward_product(const float* inp, const float* w, const float* b, int R, int I, int O, float* out,
                            LinearEpilogue epilogue, const detail::GemmExtras& extras, int threads) {
  detail::gemm_with(train_gemm(), R, O, I, GemmOperand{inp, I, 1}, GemmOperand{w, 1, I}, out, O, b, epilogue,
                    threads, extras);
}
}  // namespace

template <class T>
void linear_forward(const T* inp, const T* w, const T* b, int R, int I, int O, T* out, int threads) {
  if constexpr (std::is_same_v<T, float>) {
    linear_forward_product(inp, w, b, R, I, O, out, LinearEpilogue::Store, {}, threads);
    return;
  }
  ConstMap<T> weight(w, O, I);
  parallel_for(chunks_of(R, kRowChunk), threads, [&](int c) {
    const int r0 = c * kRowChunk, rows = std::min(R, r0 + kRowChunk) - r0;
    ConstMap<T> x(inp + static_cast<int64_t>(r0) * I, rows, I);
    Map<T> y(out + static_cast<int64_t>(r0) * O, rows, O);
    y.noalias() = x * weight.transpose();
    if (b) y.rowwise() += Eigen::Map<const RowVec<T>>(b, O);
  });
}


template <class T>
void linear_backward(const T* dout, const T* inp, const T* w, int R, int I, int O, T* dinp, T* dw, T* db,
                     int threads, bool write_dinp) {
  if constexpr (std::is_same_v<T, float>) {
    const detail::GemmKernels& kern = train_gemm();
    // dinp (R, I) += dout (R, O) @ w (O, I)  (or = with write_dinp)
    if (dinp)
      detail::gemm_with(kern, R, I, O, GemmOperand{dout, O, 1}, GemmOperand{w, I, 1}, dinp, I, nullptr,
                        write_dinp ? LinearEpilogue::Store : LinearEpilogue::Accumulate, threads);
    // dw (O, I) += dout^T (O, R) @ inp (R, I): element (i, p) of dout^T is dout[p * O + i]; and
    // db (O) += the row sums of dout^T, taken by the tiles that read it (a separate pass over dout
    // cost more than a hundredth of a training step).
    detail::GemmExtras extras;
    extras.a_row_sums = db;
    detail::gemm_with(kern, O, I, R, GemmOperand{dout, 1, O}, GemmOperand{inp, I, 1}, dw, I, nullptr,
                      LinearEpilogue::Accumulate, threads, extras);
    return;
  }
  ConstMap<T> weight(w, O, I);
  ConstMap<T> grad_out(dout, R, O);
  ConstMap<T> x(inp, R, I);
  Map<T> grad_w(dw, O, I);
  const int row_tasks = dinp ? chunks_of(R, kRowChunk) : 0;
  const int feature_tasks = chunks_of(O, kFeatureChunk);
  parallel_for(row_tasks + feature_tasks, threads, [&](int t) {
    if (t < row_tasks) {
      // dinp = dout @ w, row chunk by row chunk
      const int r0 = t * kRowChunk, rows = std::min(R, r0 + kRowChunk) - r0;
      Map<T> dx(dinp + static_cast<int64_t>(r0) * I, rows, I);
      if (write_dinp)
        dx.noalias() = grad_out.middleRows(r0, rows) * weight;
      else
        dx.noalias() += grad_out.middleRows(r0, rows) * weight;
    } else {
      // dw = dout^T @ inp, output features chunk by chunk (each a full reduction over R)
      const int o0 = (t - row_tasks) * kFeatureChunk, n = std::min(O, o0 + kFeatureChunk) - o0;
      grad_w.middleRows(o0, n).noalias() += grad_out.middleCols(o0, n).transpose() * x;
      if (db) {
        // Row by row in a plain loop: Eigen's column sums take a different order in vector lanes
        // than in its scalar edge, and where the edge falls depends on db's address.
        T acc[kFeatureChunk] = {};
        for (int r = 0; r < R; ++r) {
          const T* row = dout + static_cast<int64_t>(r) * O + o0;
          for (int k = 0; k < n; ++k) acc[k] += row[k];
        }
        for (int k = 0; k < n; ++k) db[o0 + k] += acc[k];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// embed: x = cat(cls_token.expand(B, -1, -1), x); x = x + pos_embed   (timm _pos_embed)

template <class T>
void embed_forward(const T* tokens, const T* cls, const T* pos, int B, int Np, int D, T* x) {
  const int prefix = cls ? 1 : 0, N = prefix + Np;
  for (int b = 0; b < B; ++b) {
    T* xb = x + static_cast<int64_t>(b) * N * D;
    if (cls)
      for (int c = 0; c < D; ++c) xb[c] = cls[c] + pos[c];
    const T* tb = tokens + static_cast<int64_t>(b) * Np * D;
    for (int64_t i = 0; i < static_cast<int64_t>(Np) * D; ++i) xb[prefix * D + i] = tb[i] + pos[prefix * D + i];
  }
}

template <class T>
void embed_backward(const T* dx, int B, int Np, int D, bool has_cls, T* dtokens, T* dcls, T* dpos) {
  const int prefix = has_cls ? 1 : 0, N = prefix + Np;
  for (int b = 0; b < B; ++b) {
    const T* db = dx + static_cast<int64_t>(b) * N * D;
    for (int64_t i = 0; i < static_cast<int64_t>(N) * D; ++i) dpos[i] += db[i];
    if (has_cls)
      for (int c = 0; c < D; ++c) dcls[c] += db[c];
    T* tb = dtokens + static_cast<int64_t>(b) * Np * D;
    for (int64_t i = 0; i < static_cast<int64_t>(Np) * D; ++i) tb[i] += db[prefix * D + i];
  }
}

// ---------------------------------------------------------------------------------------------
// layernorm: nn.LayerNorm(D, eps), statistics per row, biased variance (as torch).

namespace {

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

}  // namespace

template <class T>
void layernorm_forward(const T* inp, const T* w, const T* b, T eps, int R, int D, T* out, T* mean, T* rstd,
                       int threads) {
  parallel_for(chunks_of(R, kRowChunk), threads, [&](int c) {
    const int r0 = c * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    if constexpr (std::is_same_v<T, float>) {
      layernorm_rows(inp, w, b, eps, r0, r1, D, out, mean, rstd);
      return;
    }
    for (int r = r0; r < r1; ++r) {
      const T* x = inp + static_cast<int64_t>(r) * D;
      // Statistics in double (the float rows above do the same): D values of similar size.
      const double m = lane_sum<double>(D, [&](int i) { return static_cast<double>(x[i]); }) / D;
      const double v = lane_sum<double>(D, [&](int i) {
                         const double t = static_cast<double>(x[i]) - m;
                         return t * t;
                       }) / D;
      const T s = static_cast<T>(1.0 / std::sqrt(v + static_cast<double>(eps)));
      const T mt = static_cast<T>(m);
      T* y = out + static_cast<int64_t>(r) * D;
      for (int i = 0; i < D; ++i) y[i] = (x[i] - mt) * s * w[i] + b[i];
      mean[r] = mt;
      rstd[r] = s;
    }
  });
}

template <class T>
void layernorm_backward(const T* dout, const T* inp, const T* w, const T* mean, const T* rstd, int R, int D,
                        T* dinp, T* dw, T* db, int threads) {
  const int tasks = chunks_of(R, kRowChunk);
  // Each task sums its rows' dw and db into its own slot; the slots are added in task order.
  std::vector<T> partial(static_cast<size_t>(tasks) * 2 * D, T(0));
  parallel_for(tasks, threads, [&](int c) {
    const int r0 = c * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    T* pw = partial.data() + static_cast<size_t>(c) * 2 * D;
    T* pb = pw + D;
    if constexpr (std::is_same_v<T, float>) {
      layernorm_rows_backward(dout, inp, w, mean, rstd, r0, r1, D, dinp, pw, pb);
      return;
    }
    for (int r = r0; r < r1; ++r) {
      const T* x = inp + static_cast<int64_t>(r) * D;
      const T* dy = dout + static_cast<int64_t>(r) * D;
      T* dx = dinp + static_cast<int64_t>(r) * D;
      const T m = mean[r], s = rstd[r];
      // xhat = (x - mean) * rstd; dxhat = dy * w
      T mean_dxhat = lane_sum<T>(D, [&](int i) { return dy[i] * w[i]; });
      T mean_dxhat_xhat = lane_sum<T>(D, [&](int i) { return dy[i] * w[i] * ((x[i] - m) * s); });
      for (int i = 0; i < D; ++i) {
        const T xhat = (x[i] - m) * s;
        pw[i] += dy[i] * xhat;
        pb[i] += dy[i];
      }
      mean_dxhat /= D;
      mean_dxhat_xhat /= D;
      for (int i = 0; i < D; ++i) {
        const T xhat = (x[i] - m) * s;
        dx[i] += (dy[i] * w[i] - mean_dxhat - xhat * mean_dxhat_xhat) * s;
      }
    }
  });
  for (int c = 0; c < tasks; ++c) {
    const T* pw = partial.data() + static_cast<size_t>(c) * 2 * D;
    for (int i = 0; i < D; ++i) {
      dw[i] += pw[i];
      db[i] += pw[D + i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// attention: per image and head, as timm's Attention.forward
//   attn = (q @ k.transpose(-2, -1)) * scale; attn = attn.softmax(-1); x = attn @ v
// with masked keys set to -inf before the softmax (vitlens' KeyMask: padding patches).
//
// The products are tiny (N = 50 tokens, d = 12 per head in the default recipe): a general GEMM
// (Eigen's or ours) spends more on packing and edge tiles than on the arithmetic, so small_product
// runs over the rows of its operands in blocks of kAttnWidth columns, reading q, k, v and dout and
// writing ctx and dq, dk, dv in place (a head's d columns: one masked block in the AVX-512 build);
// only k^T and v^T are copied, into a small local buffer whose rows are padded with zeros to a
// multiple of kAttnWidth. No packing, no alignment peel. Every output element is one chain of
// multiply-adds in a fixed order (see small_product), so the numbers depend neither on the thread
// count nor on where the buffers are.

namespace {

#ifdef VITLENS_TRAIN_AVX512
constexpr int kAttnWidth = 16;  // columns per block: one AVX-512 register of floats
#else
constexpr int kAttnWidth = 8;  // columns per block: one AVX register of floats (two SSE registers)
#endif

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
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
// The vector builds' floats: one masked load or store.
template <>
struct PartIO<float> {
  explicit PartIO(int lanes)
#ifdef VITLENS_TRAIN_AVX512
      : mask(static_cast<__mmask16>((1u << lanes) - 1)) {
  }
  void load(Lanes<float>::type& v, const float* p) const {
    const __m512 x = _mm512_maskz_loadu_ps(mask, p);
    std::memcpy(&v, &x, sizeof v);
  }
  void store(float* p, const Lanes<float>::type& v) const {
    __m512 x;
    std::memcpy(&x, &v, sizeof x);
    _mm512_mask_storeu_ps(p, mask, x);
  }
  __mmask16 mask;
#else
      : mask(_mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))) {
  }
  void load(Lanes<float>::type& v, const float* p) const {
    const __m256 x = _mm256_maskload_ps(p, mask);
    std::memcpy(&v, &x, sizeof v);
  }
  void store(float* p, const Lanes<float>::type& v) const {
    __m256 x;
    std::memcpy(&x, &v, sizeof x);
    _mm256_maskstore_ps(p, mask, x);
  }
  __m256i mask;
#endif
};
#endif

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

// sum_j a_j b_j for j < n, in kLanes partial sums added in a fixed order (lane_sum). Reads a and b
// only up to n: a may be a row of the caller's unpadded attention weights.
template <class T>
T row_dot(const T* a, const T* b, int n) {
  return lane_sum<T>(n, [&](int j) { return a[j] * b[j]; });
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

// dst (cols, rows_padded) = src^T for src (rows, cols) with row stride ld, the padding zero. The
// vector builds' float version moves 8 x 8 squares through registers (transpose8x8): element by
// element, reading down a column of k or v (one cache line per value, row stride 3D) took about a
// tenth of the attention forward.
template <class T>
void copy_transposed_padded(const T* src, int64_t ld, int rows, int cols, int rows_padded, T* dst) {
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
  if constexpr (std::is_same_v<T, float>) {
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
    return;
  }
#endif
  for (int t = 0; t < cols; ++t) std::fill(dst + static_cast<int64_t>(t) * rows_padded + rows,
                                           dst + static_cast<int64_t>(t + 1) * rows_padded, T(0));
  for (int j = 0; j < rows; ++j)  // src's rows in order: each read once, front to back
    for (int t = 0; t < cols; ++t) dst[static_cast<int64_t>(t) * rows_padded + j] = src[j * ld + t];
}

// row[j] = exp(row[j] - top) for a padded row (n a multiple of kAttnWidth, aligned) with Eigen's
// vectorised exp on its all-packet path (the row is aligned).
template <class T>
void exp_shifted(T* row, int n, T top) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::Aligned32> e(row, n);
  e = (e - top).exp();
}

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

#ifndef VITLENS_TRAIN_PORTABLE_BUILD
#ifdef VITLENS_TRAIN_AVX512
using FloatBlock = __m512;
#else
using FloatBlock = __m256;
#endif
static_assert(sizeof(FloatBlock) == sizeof(Lanes<float>::type));

inline FloatBlock as_block(const Lanes<float>::type& v) {
  FloatBlock b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

template <>
float lane_total<float>(const Lanes<float>::type& v) {
#ifdef VITLENS_TRAIN_AVX512
  return _mm512_reduce_add_ps(as_block(v));
#else
  return detail::sum8(as_block(v));
#endif
}
template <>
float lane_max<float>(const Lanes<float>::type& v) {
#ifdef VITLENS_TRAIN_AVX512
  return _mm512_reduce_max_ps(as_block(v));
#else
  return detail::max8(as_block(v));
#endif
}

// exp of every lane (x <= 0): exp16 / exp8 (the viewer's softmax exp: within 1 ulp, exactly 0 for
// -inf), a NaN lane kept NaN (the exp alone would give 0).
inline void exp_lanes(Lanes<float>::type& v) {
  const FloatBlock x = as_block(v);
#ifdef VITLENS_TRAIN_AVX512
  const __m512 e = _mm512_mask_mov_ps(detail::exp16(x), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
#else
  const __m256 e = _mm256_blendv_ps(detail::exp8(x), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
#endif
  std::memcpy(&v, &e, sizeof v);
}
#endif

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
  V sum_lanes = {};
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
  if constexpr (std::is_same_v<T, float>) {  // exp_lanes gives exactly 0 for -inf: no mask needed
    for (int j0 = 0; j0 < Np; j0 += kAttnWidth) {
      std::memcpy(&x, row + j0, sizeof x);
      x -= top;
      exp_lanes(x);
      std::memcpy(row + j0, &x, sizeof x);
      sum_lanes += x;
    }
  } else
#endif
  {
    // exp over the whole padded row; masked and padded keys are then set to exactly 0 (Eigen's
    // vectorised exp gives something tiny but finite for -inf, so times 0 is 0).
    exp_shifted(row, Np, top);
    for (int j0 = 0; j0 < Np; j0 += kAttnWidth) {
      std::memcpy(&x, row + j0, sizeof x);
      std::memcpy(&m, keep + j0, sizeof m);
      x *= m;
      std::memcpy(row + j0, &x, sizeof x);
      sum_lanes += x;
    }
  }
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

#ifndef VITLENS_TRAIN_PORTABLE_BUILD
// row_dot for the floats of the vector builds: FMA into one block of lanes, the last through masked
// loads, the lanes' sum as a tree (lane_total).
float row_dot(const float* a, const float* b, int n) {
  int j0 = 0;
#ifdef VITLENS_TRAIN_AVX512
  __m512 part = _mm512_setzero_ps();
  for (; j0 + 16 <= n; j0 += 16) part = _mm512_fmadd_ps(_mm512_loadu_ps(a + j0), _mm512_loadu_ps(b + j0), part);
  if (j0 < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j0)) - 1);
    part = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, a + j0), _mm512_maskz_loadu_ps(tail, b + j0), part);
  }
#else
  __m256 part = _mm256_setzero_ps();
  for (; j0 + 8 <= n; j0 += 8) part = _mm256_fmadd_ps(_mm256_loadu_ps(a + j0), _mm256_loadu_ps(b + j0), part);
  if (j0 < n) {
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    part = _mm256_fmadd_ps(_mm256_maskload_ps(a + j0, tail), _mm256_maskload_ps(b + j0, tail), part);
  }
#endif
  Lanes<float>::type lanes;
  std::memcpy(&lanes, &part, sizeof lanes);
  return lane_total<float>(lanes);
}
#endif

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

}  // namespace

template <class T>
void attention_forward(const T* qkv, const uint8_t* key_allowed, int B, int N, int D, int H, T scale, T* probs,
                       T* ctx, int threads) {
  const int d = D / H, Np = round_up(N, kAttnWidth);
  const int64_t ld = 3 * static_cast<int64_t>(D);
  using Scratch = AttentionScratch<T>;
  const size_t kt_size = Scratch::piece(static_cast<size_t>(d) * Np);
  const size_t s_size = Scratch::piece(static_cast<size_t>(N) * Np), mask_size = Scratch::piece(Np);
  parallel_for(B * H, threads, [&](int task) {
    const int b = task / H, h = task % H;
    const T* base = qkv + static_cast<int64_t>(b) * N * ld;  // row i: [q | k | v] of token i
    const uint8_t* allowed = key_allowed ? key_allowed + static_cast<int64_t>(b) * N : nullptr;
    if (b + 1 < B) prefetch_share(base + N * ld, N * ld, h, H);  // the next image's q, k, v
    T* kt = attention_scratch<T>().reserve(kt_size + s_size + 2 * mask_size);
    T* s = kt + kt_size;         // (N, Np): the scores, then in place their exps
    T* bias = s + s_size;        // (Np): 0 for a key that may be attended to, -inf for a masked or padded one
    T* keep = bias + mask_size;  // (Np): 1 for a key that may be attended to, else 0
    for (int j = 0; j < Np; ++j) {
      const bool on = j < N && (!allowed || allowed[j]);
      bias[j] = on ? T(0) : -std::numeric_limits<T>::infinity();
      keep[j] = on ? T(1) : T(0);
    }
    copy_transposed_padded(base + D + h * d, ld, N, d, Np, kt);  // k^T (d, Np)
    // s = q k^T, q read in place (row stride 3D)
    small_product(N, d, Np, base + h * d, ld, 1, kt, Np, s, Np);
    for (int i = 0; i < N; ++i)
      softmax_row(s + static_cast<int64_t>(i) * Np, bias, keep, N, Np, scale,
                  probs + (static_cast<int64_t>(task) * N + i) * N);
    // out = attn @ v, attn read from probs, v in place, into head h's columns of ctx (row stride D)
    small_product(N, N, d, probs + static_cast<int64_t>(task) * N * N, N, 1, base + 2 * D + h * d, ld,
                  ctx + static_cast<int64_t>(b) * N * D + h * d, static_cast<int64_t>(D));
  });
}

template <class T>
void attention_backward(const T* dctx, const T* qkv, const T* probs, int B, int N, int D, int H, T scale, T* dqkv,
                        int threads) {
  const int d = D / H, Np = round_up(N, kAttnWidth);
  const int64_t ld = 3 * static_cast<int64_t>(D);
  using Scratch = AttentionScratch<T>;
  const size_t wide = Scratch::piece(static_cast<size_t>(d) * Np);   // (d, Np)
  const size_t square = Scratch::piece(static_cast<size_t>(N) * Np);  // (N, Np)
  parallel_for(B * H, threads, [&](int task) {
    const int b = task / H, h = task % H;
    const T* base = qkv + static_cast<int64_t>(b) * N * ld;
    T* dbase = dqkv + static_cast<int64_t>(b) * N * ld;
    const T* q = base + h * d;  // q, k, v and dout (N, d) read in place (row strides 3D, 3D, 3D, D)
    const T* k = base + D + h * d;
    const T* g = dctx + static_cast<int64_t>(b) * N * D + h * d;
    T* vt = attention_scratch<T>().reserve(wide + square);  // v^T (d, Np)
    T* ds = vt + wide;  // dattn, then in place dscore (N, Np; columns N.. are never read)
    const T* p = probs + static_cast<int64_t>(task) * N * N;  // attn (N, N), read in place
    if (b + 1 < B) {  // a share of the next image's q, k, v and dout
      prefetch_share(base + N * ld, N * ld, h, H);
      prefetch_share(dctx + static_cast<int64_t>(b + 1) * N * D, static_cast<int64_t>(N) * D, h, H);
    }
    copy_transposed_padded(base + 2 * D + h * d, ld, N, d, Np, vt);
    // dq, dk, dv are written straight into their (N, d) column blocks of dqkv's rows (written:
    // train_ops_list.inc).
    // x = attn @ v:  dattn = dx @ v^T,  dv = attn^T @ dx  (attn^T read through strides)
    small_product(N, d, Np, g, static_cast<int64_t>(D), 1, vt, Np, ds, Np);
    small_product(N, N, d, p, 1, N, g, static_cast<int64_t>(D), dbase + 2 * D + h * d, ld);
    // softmax: dscore_ij = attn_ij (dattn_ij - sum_k attn_ik dattn_ik)  (masked attn_ij = 0 gives
    // 0); score = (q @ k^T) * scale brings the factor scale.
    for (int i = 0; i < N; ++i) {
      const T* pi = p + static_cast<int64_t>(i) * N;
      T* gi = ds + static_cast<int64_t>(i) * Np;
      const T dot = row_dot(pi, gi, N);
      for (int j = 0; j < N; ++j) gi[j] = pi[j] * (gi[j] - dot) * scale;
    }
    // dq = dscore @ k,  dk = dscore^T @ q
    small_product(N, N, d, ds, Np, 1, k, ld, dbase + h * d, ld);
    small_product(N, N, d, ds, 1, Np, q, ld, dbase + D + h * d, ld);
  });
}

// ---------------------------------------------------------------------------------------------
// gelu: nn.GELU(approximate='none')

// The float ops of the vector builds run avx2_math.hpp's vector GELU (the viewer's forward, within
// 1e-6 of std::erf's formula; avx512_math.hpp's 16-lane copy in the AVX-512 build, the same
// values but below about 1e-38, where exp16 rounds a subnormal correctly and exp8 does not) and
// its derivative, one exp for both terms. The other builds work on
// Eigen-owned scratch copies of each chunk: Eigen starts its vector loop where the data is aligned,
// so on the caller's buffers the scalar (std::erf) / vector (polynomial erf) split, and with it the
// last bits, would depend on the buffer's address. Both tails go through a padded vector for the
// same reason.
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
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
#ifdef VITLENS_TRAIN_AVX512
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
#endif

template <class T>
void gelu_forward(const T* inp, int64_t n, T* out, int threads) {
  const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, len = std::min(n, i0 + kElementChunk) - i0;
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
    if constexpr (std::is_same_v<T, float>) {
#ifdef VITLENS_TRAIN_AVX512
      map16([](__m512 x) { return detail::gelu16(x); }, inp + i0, nullptr, len, out + i0);
#else
      map8([](__m256 x) { return detail::gelu8(x); }, inp + i0, nullptr, len, out + i0);
#endif
      return;
    }
#endif
    Eigen::Array<T, Eigen::Dynamic, 1> x = ConstArrayMap<T>(inp + i0, len);
    x = T(0.5) * x * (T(1) + (x * inv_sqrt2).erf());
    ArrayMap<T>(out + i0, len) = x;
  });
}

namespace {
// d/dx [x Phi(x)] = Phi(x) + x phi(x) for len values, on an Eigen-owned copy (see above).
template <class T>
Eigen::Array<T, Eigen::Dynamic, 1> gelu_slope_values(const T* inp, int64_t len) {
  const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
  const T inv_sqrt_2pi = static_cast<T>(0.39894228040143267794);
  const Eigen::Array<T, Eigen::Dynamic, 1> x = ConstArrayMap<T>(inp, len);
  return T(0.5) * (T(1) + (x * inv_sqrt2).erf()) + x * inv_sqrt_2pi * (T(-0.5) * x.square()).exp();
}
// out = gelu_slope_values(inp, len); out may be inp.
template <class T>
void gelu_slope_chunk(const T* inp, int64_t len, T* out) {
  const Eigen::Array<T, Eigen::Dynamic, 1> slope = gelu_slope_values(inp, len);
  for (int64_t i = 0; i < len; ++i) out[i] = slope[i];
}
}  // namespace

template <class T>
void gelu_backward(const T* dout, const T* inp, int64_t n, T* dinp, int threads) {
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, len = std::min(n, i0 + kElementChunk) - i0;
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
    if constexpr (std::is_same_v<T, float>) {  // written (train_ops_list.inc)
#ifdef VITLENS_TRAIN_AVX512
      map16([](__m512 x) { return detail::gelu_slope16(x); }, inp + i0, dout + i0, len, dinp + i0);
#else
      map8([](__m256 x) { return detail::gelu_slope8(x); }, inp + i0, dout + i0, len, dinp + i0);
#endif
      return;
    }
#endif
    Eigen::Array<T, Eigen::Dynamic, 1> slope = gelu_slope_values(inp + i0, len);
    slope *= Eigen::Array<T, Eigen::Dynamic, 1>(ConstArrayMap<T>(dout + i0, len));
    for (int64_t i = 0; i < len; ++i) dinp[i0 + i] = slope[i];  // written (train_ops_list.inc)
  });
}

// ---------------------------------------------------------------------------------------------
// residual: x = x + branch(x)

template <class T>
void residual_forward(const T* a, const T* b, int64_t n, T* out, int threads) {
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, i1 = std::min(n, i0 + kElementChunk);
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

// ---------------------------------------------------------------------------------------------
// fused linears: fc1 + GELU, GELU' + fc2's input gradient, proj / fc2 + residual. The float ops
// run the products' tile epilogues (gemm.hpp's GemmExtras: GELU and GELU' are the kernels' own,
// those of gelu_forward / gelu_backward above in the vector builds); the portable build's GELU
// (Eigen's erf) and the double ops run the separate ops.

template <class T>
void linear_gelu_forward(const T* inp, const T* w, const T* b, int R, int I, int O, T* out, T* slope, int threads) {
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
  if constexpr (std::is_same_v<T, float>) {
    detail::GemmExtras extras;
    extras.gelu_slope_out = slope;
    linear_forward_product(inp, w, b, R, I, O, out, LinearEpilogue::Gelu, extras, threads);
    return;
  }
#endif
  const int64_t n = static_cast<int64_t>(R) * O;
  linear_forward(inp, w, b, R, I, O, slope, threads);  // the pre-activation, then its slope in place
  gelu_forward(slope, n, out, threads);
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, len = std::min(n, i0 + kElementChunk) - i0;
    gelu_slope_chunk(slope + i0, len, slope + i0);
  });
}

template <class T>
void linear_gelu_backward(const T* dout, const T* inp, const T* slope, const T* w, int R, int I, int O, T* dpre,
                          T* dw, T* db, int threads) {
#ifndef VITLENS_TRAIN_PORTABLE_BUILD
  if constexpr (std::is_same_v<T, float>) {
    // dpre (R, I) = slope * (dout (R, O) @ w (O, I))
    detail::GemmExtras extras;
    extras.scale = slope;
    detail::gemm_with(train_gemm(), R, I, O, GemmOperand{dout, O, 1}, GemmOperand{w, I, 1}, dpre, I, nullptr,
                      LinearEpilogue::Store, threads, extras);  // written (train_ops_list.inc)
    linear_backward(dout, inp, w, R, I, O, static_cast<T*>(nullptr), dw, db, threads);
    return;
  }
#endif
  linear_backward(dout, inp, w, R, I, O, dpre, dw, db, threads, true);
  const int64_t n = static_cast<int64_t>(R) * I;
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, i1 = std::min(n, i0 + kElementChunk);
    for (int64_t i = i0; i < i1; ++i) dpre[i] = slope[i] * dpre[i];  // written (train_ops_list.inc)
  });
}

template <class T>
void linear_residual_forward(const T* inp, const T* w, const T* b, const T* res, int R, int I, int O, T* out,
                             int threads) {
  if constexpr (std::is_same_v<T, float>) {
    detail::GemmExtras extras;
    extras.residual = res;
    linear_forward_product(inp, w, b, R, I, O, out, LinearEpilogue::Store, extras, threads);
    return;
  }
  linear_forward(inp, w, b, R, I, O, out, threads);
  residual_forward(res, out, static_cast<int64_t>(R) * O, out, threads);
}

// ---------------------------------------------------------------------------------------------
// drop path: x = x + drop_path(branch(x)), timm's DropPath(p) with scale_by_keep

template <class T>
void drop_path_forward(const T* a, const T* branch, const T* scale, int B, int64_t M, T* out, int threads) {
  const int64_t chunks = chunks_of(M, kElementChunk);
  parallel_for(static_cast<int>(B * chunks), threads, [&](int task) {
    const int64_t b = task / chunks, c = task % chunks;
    const int64_t i0 = b * M + c * kElementChunk, i1 = b * M + std::min(M, (c + 1) * kElementChunk);
    const T s = scale[b];
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + s * branch[i];
  });
}

template <class T>
void drop_path_backward(const T* dout, const T* scale, int B, int64_t M, T* dbranch, int threads) {
  const int64_t chunks = chunks_of(M, kElementChunk);
  parallel_for(static_cast<int>(B * chunks), threads, [&](int task) {
    const int64_t b = task / chunks, c = task % chunks;
    const int64_t i0 = b * M + c * kElementChunk, i1 = b * M + std::min(M, (c + 1) * kElementChunk);
    const T s = scale[b];
    for (int64_t i = i0; i < i1; ++i) dbranch[i] = s * dout[i];  // written (train_ops_list.inc)
  });
}

// ---------------------------------------------------------------------------------------------
// pool: timm forward_head: x[:, 0] with a class token, else x[:, num_prefix_tokens:].mean(1)

template <class T>
void pool_forward(const T* x, int B, int N, int D, bool class_token, T* pooled) {
  for (int b = 0; b < B; ++b) {
    const T* xb = x + static_cast<int64_t>(b) * N * D;
    T* out = pooled + static_cast<int64_t>(b) * D;
    if (class_token) {
      std::copy(xb, xb + D, out);
      continue;
    }
    std::fill(out, out + D, T(0));
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < D; ++c) out[c] += xb[static_cast<int64_t>(i) * D + c];
    for (int c = 0; c < D; ++c) out[c] /= static_cast<T>(N);
  }
}

template <class T>
void pool_backward(const T* dpooled, int B, int N, int D, bool class_token, T* dx) {
  for (int b = 0; b < B; ++b) {
    T* xb = dx + static_cast<int64_t>(b) * N * D;
    const T* g = dpooled + static_cast<int64_t>(b) * D;
    if (class_token) {
      for (int c = 0; c < D; ++c) xb[c] += g[c];
      continue;
    }
    const T share = T(1) / static_cast<T>(N);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < D; ++c) xb[static_cast<int64_t>(i) * D + c] += g[c] * share;
  }
}

// ---------------------------------------------------------------------------------------------
// crossentropy: nn.CrossEntropyLoss(label_smoothing=eps), reduction='mean'

template <class T>
T crossentropy_forward(const T* logits, const int32_t* labels, int B, int C, T smoothing, T* probs) {
  double total = 0.0;
  for (int b = 0; b < B; ++b) {
    const T* l = logits + static_cast<int64_t>(b) * C;
    T* p = probs + static_cast<int64_t>(b) * C;
    const T top = *std::max_element(l, l + C);
    double sum = 0.0;
    for (int c = 0; c < C; ++c) sum += std::exp(static_cast<double>(l[c] - top));
    const double log_z = static_cast<double>(top) + std::log(sum);  // log sum exp
    double sum_nll = 0.0;
    for (int c = 0; c < C; ++c) {
      p[c] = static_cast<T>(std::exp(static_cast<double>(l[c]) - log_z));
      sum_nll += log_z - l[c];
    }
    const double nll = log_z - l[labels[b]];
    total += (1.0 - smoothing) * nll + smoothing / C * sum_nll;
  }
  return static_cast<T>(total / B);
}

template <class T>
void crossentropy_backward(const T* probs, const int32_t* labels, int B, int C, T smoothing, T dloss, T* dlogits) {
  const T scale = dloss / static_cast<T>(B);
  const T off = smoothing / static_cast<T>(C);
  for (int b = 0; b < B; ++b) {
    const T* p = probs + static_cast<int64_t>(b) * C;
    T* g = dlogits + static_cast<int64_t>(b) * C;
    for (int c = 0; c < C; ++c) {
      const T target = (c == labels[b] ? T(1) - smoothing : T(0)) + off;
      g[c] += (p[c] - target) * scale;
    }
  }
}

// ---------------------------------------------------------------------------------------------
#define VITLENS_TRAIN_OPS(T)                                                                                     \
  template void patchify_forward<T>(const T*, int, int, int, int, T*);                                          \
  template void patchify_backward<T>(const T*, int, int, int, int, T*);                                         \
  template void linear_forward<T>(const T*, const T*, const T*, int, int, int, T*, int);                        \
  template void linear_backward<T>(const T*, const T*, const T*, int, int, int, T*, T*, T*, int, bool);         \
  template void embed_forward<T>(const T*, const T*, const T*, int, int, int, T*);                              \
  template void embed_backward<T>(const T*, int, int, int, bool, T*, T*, T*);                                   \
  template void layernorm_forward<T>(const T*, const T*, const T*, T, int, int, T*, T*, T*, int);               \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, int, int, T*, T*, T*,   \
                                      int);                                                                     \
  template void attention_forward<T>(const T*, const uint8_t*, int, int, int, int, T, T*, T*, int);             \
  template void attention_backward<T>(const T*, const T*, const T*, int, int, int, int, T, T*, int);            \
  template void gelu_forward<T>(const T*, int64_t, T*, int);                                                    \
  template void gelu_backward<T>(const T*, const T*, int64_t, T*, int);                                         \
  template void residual_forward<T>(const T*, const T*, int64_t, T*, int);                                      \
  template void linear_gelu_forward<T>(const T*, const T*, const T*, int, int, int, T*, T*, int);               \
  template void linear_gelu_backward<T>(const T*, const T*, const T*, const T*, int, int, int, T*, T*, T*, int); \
  template void linear_residual_forward<T>(const T*, const T*, const T*, const T*, int, int, int, T*, int);     \
  template void drop_path_forward<T>(const T*, const T*, const T*, int, int64_t, T*, int);                     \
  template void drop_path_backward<T>(const T*, const T*, int, int64_t, T*, int);                               \
  template void pool_forward<T>(const T*, int, int, int, bool, T*);                                             \
  template void pool_backward<T>(const T*, int, int, int, bool, T*);                                            \
  template T crossentropy_forward<T>(const T*, const int32_t*, int, int, T, T*);                                \
  template void crossentropy_backward<T>(const T*, const int32_t*, int, int, T, T, T*);

VITLENS_TRAIN_OPS(float)
VITLENS_TRAIN_OPS(double)

}  // namespace VITLENS_TRAIN_ISA

#ifdef VITLENS_TRAIN_PORTABLE_BUILD
// ---------------------------------------------------------------------------------------------
// Run-time choice between the three builds.

namespace avx2 {
#include "core/train/train_ops_list.inc"
}
namespace avx512 {
#include "core/train/train_ops_list.inc"
}

namespace {

std::atomic<bool> g_force_portable{false};

enum class Build { Portable, Avx2, Avx512 };

// The build of fast_attention.hpp's kernel_isa() (the best the CPU runs unless set_kernel_isa chose
// another: AVX-512, AVX2 + FMA or portable); portable whatever the CPU with VITLENS_PORTABLE=1 in
// the environment or after force_portable_train_ops(true).
Build build() {
  static const bool env_portable = std::getenv("VITLENS_PORTABLE") && *std::getenv("VITLENS_PORTABLE") == '1';
  if (env_portable || g_force_portable) return Build::Portable;
  switch (kernel_isa()) {
    case KernelIsa::Avx512: return Build::Avx512;
    case KernelIsa::Avx2: return Build::Avx2;
    case KernelIsa::Portable: break;
  }
  return Build::Portable;
}

}  // namespace

const char* train_ops_isa() {
  switch (build()) {
    case Build::Avx512: return "avx512";
    case Build::Avx2: return "avx2";
    case Build::Portable: break;
  }
  return "portable";
}
void force_portable_train_ops(bool portable) { g_force_portable = portable; }

#define VITLENS_DISPATCH(name, params, args) \
  template <class T>                        \
  void name params {                        \
    switch (build()) {                      \
      case Build::Avx512:                   \
        avx512::name<T> args;               \
        return;                             \
      case Build::Avx2:                     \
        avx2::name<T> args;                 \
        return;                             \
      case Build::Portable:                 \
        break;                              \
    }                                       \
    portable::name<T> args;                 \
  }

VITLENS_DISPATCH(patchify_forward, (const T* images, int B, int H, int W, int P, T* patches),
                 (images, B, H, W, P, patches))
VITLENS_DISPATCH(patchify_backward, (const T* dpatches, int B, int H, int W, int P, T* dimages),
                 (dpatches, B, H, W, P, dimages))
VITLENS_DISPATCH(linear_forward, (const T* inp, const T* w, const T* b, int R, int I, int O, T* out, int threads),
                 (inp, w, b, R, I, O, out, threads))
VITLENS_DISPATCH(linear_backward,
                 (const T* dout, const T* inp, const T* w, int R, int I, int O, T* dinp, T* dw, T* db, int threads,
                  bool write_dinp),
                 (dout, inp, w, R, I, O, dinp, dw, db, threads, write_dinp))
VITLENS_DISPATCH(embed_forward, (const T* tokens, const T* cls, const T* pos, int B, int Np, int D, T* x),
                 (tokens, cls, pos, B, Np, D, x))
VITLENS_DISPATCH(embed_backward, (const T* dx, int B, int Np, int D, bool has_cls, T* dtokens, T* dcls, T* dpos),
                 (dx, B, Np, D, has_cls, dtokens, dcls, dpos))
VITLENS_DISPATCH(layernorm_forward,
                 (const T* inp, const T* w, const T* b, T eps, int R, int D, T* out, T* mean, T* rstd, int threads),
                 (inp, w, b, eps, R, D, out, mean, rstd, threads))
VITLENS_DISPATCH(layernorm_backward,
                 (const T* dout, const T* inp, const T* w, const T* mean, const T* rstd, int R, int D, T* dinp, T* dw,
                  T* db, int threads),
                 (dout, inp, w, mean, rstd, R, D, dinp, dw, db, threads))
VITLENS_DISPATCH(attention_forward,
                 (const T* qkv, const uint8_t* key_allowed, int B, int N, int D, int H, T scale, T* probs, T* ctx,
                  int threads),
                 (qkv, key_allowed, B, N, D, H, scale, probs, ctx, threads))
VITLENS_DISPATCH(attention_backward,
                 (const T* dctx, const T* qkv, const T* probs, int B, int N, int D, int H, T scale, T* dqkv,
                  int threads),
                 (dctx, qkv, probs, B, N, D, H, scale, dqkv, threads))
VITLENS_DISPATCH(gelu_forward, (const T* inp, int64_t n, T* out, int threads), (inp, n, out, threads))
VITLENS_DISPATCH(gelu_backward, (const T* dout, const T* inp, int64_t n, T* dinp, int threads),
                 (dout, inp, n, dinp, threads))
VITLENS_DISPATCH(linear_gelu_forward,
                 (const T* inp, const T* w, const T* b, int R, int I, int O, T* out, T* slope, int threads),
                 (inp, w, b, R, I, O, out, slope, threads))
VITLENS_DISPATCH(linear_gelu_backward,
                 (const T* dout, const T* inp, const T* slope, const T* w, int R, int I, int O, T* dpre, T* dw,
                  T* db, int threads),
                 (dout, inp, slope, w, R, I, O, dpre, dw, db, threads))
VITLENS_DISPATCH(linear_residual_forward,
                 (const T* inp, const T* w, const T* b, const T* res, int R, int I, int O, T* out, int threads),
                 (inp, w, b, res, R, I, O, out, threads))
VITLENS_DISPATCH(residual_forward, (const T* a, const T* b, int64_t n, T* out, int threads),
                 (a, b, n, out, threads))
VITLENS_DISPATCH(drop_path_forward,
                 (const T* a, const T* branch, const T* scale, int B, int64_t M, T* out, int threads),
                 (a, branch, scale, B, M, out, threads))
VITLENS_DISPATCH(drop_path_backward, (const T* dout, const T* scale, int B, int64_t M, T* dbranch, int threads),
                 (dout, scale, B, M, dbranch, threads))
VITLENS_DISPATCH(pool_forward, (const T* x, int B, int N, int D, bool class_token, T* pooled),
                 (x, B, N, D, class_token, pooled))
VITLENS_DISPATCH(pool_backward, (const T* dpooled, int B, int N, int D, bool class_token, T* dx),
                 (dpooled, B, N, D, class_token, dx))
VITLENS_DISPATCH(crossentropy_backward,
                 (const T* probs, const int32_t* labels, int B, int C, T smoothing, T dloss, T* dlogits),
                 (probs, labels, B, C, smoothing, dloss, dlogits))
#undef VITLENS_DISPATCH

template <class T>
T crossentropy_forward(const T* logits, const int32_t* labels, int B, int C, T smoothing, T* probs) {
  switch (build()) {
    case Build::Avx512: return avx512::crossentropy_forward<T>(logits, labels, B, C, smoothing, probs);
    case Build::Avx2: return avx2::crossentropy_forward<T>(logits, labels, B, C, smoothing, probs);
    case Build::Portable: break;
  }
  return portable::crossentropy_forward<T>(logits, labels, B, C, smoothing, probs);
}

VITLENS_TRAIN_OPS(float)
VITLENS_TRAIN_OPS(double)
#endif

}  // namespace vitlens::train
