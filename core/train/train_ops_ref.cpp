// The training ops: forward and backward pairs in the manner of llm.c's train_gpt2.c, each
// pair next to the PyTorch lines it reproduces (train_ops_list.inc: shapes and the legend). Plain
// C++: the blocks, rows and chunks they run on are train_kernels.hpp's.
//
// core/CMakeLists.txt compiles this file once per instruction set (none, -mavx2 -mfma, -mavx512f):
// VITLENS_TRAIN_ISA names the namespace of the copy (portable, avx2, avx512), and Eigen's namespace
// is renamed in the vector copies so that none of its inline functions compiled for AVX2 or
// AVX-512 can stand in for the portable one at link time. Each copy ends with its table of ops,
// which train_ops.cpp hands out by kernel_isa().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "core/base/parallel.hpp"
#include "core/cpu/gemm.hpp"
#include "core/train/train_kernels.hpp"
#include "core/train/train_ops.hpp"

#ifndef VITLENS_TRAIN_ISA
#error "train_ops_ref.cpp is compiled by core/CMakeLists.txt with VITLENS_TRAIN_ISA set"
#endif

namespace vitlens::train {
namespace VITLENS_TRAIN_ISA {

#define VITLENS_TRAIN_OP(ret, name, params, args) \
  template <class T>                              \
  ret name params;
#include "core/train/train_ops_list.inc"
#undef VITLENS_TRAIN_OP

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

int chunks_of(int64_t n, int64_t chunk) { return static_cast<int>((n + chunk - 1) / chunk); }

// The packed SGEMM (gemm.hpp) the float Linear products run on: this build's instruction set's
// kernels (the portable ones in the portable build, whatever the CPU). Its threads split the output at fixed multiples of its tile and every
// output element is the same FMA chain wherever it falls, so the numbers do not depend on the
// thread count either.
const detail::GemmKernels& train_gemm() { return detail::kGemmKernels.get(kBuildIsa); }

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

template <class T>
void gelu_forward(const T* inp, int64_t n, T* out, int threads) {
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, len = std::min(n, i0 + kElementChunk) - i0;
    gelu_chunk(inp + i0, len, out + i0);
  });
}

template <class T>
void gelu_backward(const T* dout, const T* inp, int64_t n, T* dinp, int threads) {
  parallel_for(chunks_of(n, kElementChunk), threads, [&](int c) {
    const int64_t i0 = c * kElementChunk, len = std::min(n, i0 + kElementChunk) - i0;
    gelu_slope_times_chunk(inp + i0, dout + i0, len, dinp + i0);  // written (train_ops_list.inc)
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
  if constexpr (std::is_same_v<T, float> && kVectorBuild) {
    detail::GemmExtras extras;
    extras.gelu_slope_out = slope;
    linear_forward_product(inp, w, b, R, I, O, out, LinearEpilogue::Gelu, extras, threads);
    return;
  }
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
  if constexpr (std::is_same_v<T, float> && kVectorBuild) {
    // dpre (R, I) = slope * (dout (R, O) @ w (O, I))
    detail::GemmExtras extras;
    extras.scale = slope;
    detail::gemm_with(train_gemm(), R, I, O, GemmOperand{dout, O, 1}, GemmOperand{w, I, 1}, dpre, I, nullptr,
                      LinearEpilogue::Store, threads, extras);  // written (train_ops_list.inc)
    linear_backward(dout, inp, w, R, I, O, static_cast<T*>(nullptr), dw, db, threads, false);
    return;
  }
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
// This build's table of ops (train_ops.hpp's TrainOps), in the list's order; extern: train_ops.cpp
// reads them.

#define VITLENS_TRAIN_OP(ret, name, params, args) &name<float>,
extern const TrainOps<float> kFloatOps{
#include "core/train/train_ops_list.inc"
};
#undef VITLENS_TRAIN_OP
#define VITLENS_TRAIN_OP(ret, name, params, args) &name<double>,
extern const TrainOps<double> kDoubleOps{
#include "core/train/train_ops_list.inc"
};
#undef VITLENS_TRAIN_OP

}  // namespace VITLENS_TRAIN_ISA
}  // namespace vitlens::train
