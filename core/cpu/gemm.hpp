#pragma once
// Dense kernels outside attention: the Linear layers' products (forward and the two products
// training needs), exact GELU and LayerNorm, at the vector width of the CPU.
//
// Every function runs the instruction set chosen by cpu.hpp's kernel_isa() (AVX-512, AVX2 + FMA
// or portable C++, picked at run time, so the binary runs on any x86-64; set_kernel_isa() and
// VITLENS_ISA switch them). The plain loops in
// tests/test_gemm.cpp are the oracle every variant is compared with.
//
// The product is a blocked, packed SGEMM (the GotoBLAS / BLIS layout): K in blocks of kc
// (GemmKernels: 256 or 384), B packed in column panels of NR, A in row panels of MR, an MR x NR
// register tile per step.
// Each output element is the same chain of operations wherever it falls (edge tiles run the full
// tile on a padded copy), and threads split rows or columns at multiples of the tile, so results
// do not depend on the thread count.
//
// Shapes: M = rows (tokens), K = inputs, N = outputs; a Linear's W is (N, K) row-major, as PyTorch
// stores nn.Linear.weight. Leading dimensions (ld*) are row strides in floats.
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "core/cpu/cpu.hpp"

namespace vitlens {
namespace detail {
struct GemmKernels;

// Memory on 64-byte boundaries for the packed panels: a panel row of the AVX-512 tile (48 floats)
// is then three whole cache lines, where std::vector's 16-byte alignment split every 64-byte load
// of B over two lines (about 10 % of the tile's time on an Intel Xeon with two 512-bit FMA
// units; bench/README.md, "The SGEMM tile on an Intel Xeon").
template <typename T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t count) { return static_cast<T*>(::operator new(count * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  friend bool operator==(const CacheAligned&, const CacheAligned&) { return true; }
  friend bool operator!=(const CacheAligned&, const CacheAligned&) { return false; }
};
using AlignedFloats = std::vector<float, CacheAligned<float>>;
}  // namespace detail

// What happens to Y after the product.
enum class LinearEpilogue {
  Store,       // Y  = X W^T + b
  Gelu,        // Y  = GELU(X W^T + b), exact erf GELU as nn.GELU()
  Accumulate,  // Y += X W^T + b   (a residual add: x = x + proj(a))
};

// Y (M, N) = X (M, K) W^T + b, W (N, K); b (N) may be null. threads <= 0: one per core.
void linear_forward(const float* x, int64_t ldx, int m, int k, const float* w, int n, const float* b,
                    float* y, int64_t ldy, LinearEpilogue epilogue = LinearEpilogue::Store, int threads = 1);

// A Linear's W (N, K) packed once into the panels linear_forward() packs it into on every call
// (W^T in column panels of NR, K in the kernels' blocks of kc, each block's panels (kc, NR) side
// by side), so that a forward running the same W over many row chunks packs it once: the
// inference forward (vit.cpp). Packed for the kernels kernel_isa() selects when pack_linear runs;
// W must outlive it, since linear_forward_packed runs linear_forward on W itself when
// kernel_isa() has changed since (set_kernel_isa), rather than read panels laid out for another
// tile.
struct PackedLinear {
  const float* w = nullptr;  // (N, K) row-major, the source
  int n = 0, k = 0;          // N = outputs, K = inputs
  const detail::GemmKernels* kernels = nullptr;  // packed for these (null: never packed)
  detail::AlignedFloats panels;  // (ceil(K / kc) blocks, ceil(N / NR) panels, kc, NR); only grows
};

// Packs W (N, K) into `packed` for the active kernels, reusing its memory; threads <= 0: one per core.
void pack_linear(const float* w, int n, int k, PackedLinear& packed, int threads = 1);

// linear_forward(x, ldx, m, packed.k, packed.w, packed.n, b, y, ldy, epilogue, threads), the same
// bits (the same tiles read the same panel values), without packing W again.
void linear_forward_packed(const float* x, int64_t ldx, int m, const PackedLinear& packed, const float* b,
                           float* y, int64_t ldy, LinearEpilogue epilogue = LinearEpilogue::Store, int threads = 1);

// dX (M, K) = dY (M, N) W (N, K), or += when accumulate (a residual branch's input gradient).
void linear_backward_input(const float* dy, int64_t lddy, int m, int n, const float* w, int k, float* dx,
                           int64_t lddx, bool accumulate, int threads = 1);

// dW (N, K) += dY (M, N)^T X (M, K); db (N) += column sums of dY when db is not null.
void linear_backward_weight(const float* dy, int64_t lddy, int m, int n, const float* x, int64_t ldx, int k,
                            float* dw, float* db, int threads = 1);

// The general product behind the three above: C (M, N) (+)= A B (+ bias), where element (i, p) of
// A is a[i * a_rs + p * a_cs] and element (p, j) of B is b[p * b_rs + j * b_cs] (any transpose).
struct GemmOperand {
  const float* data = nullptr;
  int64_t row_stride = 0, col_stride = 1;
};
void gemm(int m, int n, int k, GemmOperand a, GemmOperand b, float* c, int64_t ldc, const float* bias,
          LinearEpilogue epilogue, int threads);

// x[i] = 0.5 x (1 + erf(x / sqrt 2)) in place: within 1e-6 (absolute below 1, relative above) of the
// same formula with std::erf, over every float (tests/test_gemm.cpp sweeps them).
void gelu_inplace(float* x, int64_t count);

// out = LayerNorm(x) row by row over D (biased variance, as torch.nn.LayerNorm), statistics
// accumulated in double; x (rows, D) with row stride ldx, out (rows, D) with row stride ldo.
// out may equal x.
void layer_norm_rows(const float* x, int64_t ldx, int rows, int dim, const float* weight, const float* bias,
                     float eps, float* out, int64_t ldo);

namespace detail {

// What a tile does with its sums v = A b_panel (gemm.cpp fills it per tile; the matrices are at
// the tile's first element, their rows ldc apart as c's):
//   v = v + c (load_c), v = v + bias (bias not null), v = residual + v (residual not null), then
//   c = v (None), c = GELU(v) (Gelu), c = GELU(v) and slope_out = GELU'(v) (GeluAndSlope: a
//   training forward keeps the slope its backward needs, from the same erfc and exp), or
//   c = scale * v (Scale: the backward's input gradient of the Linear before that GELU).
// And a_row_sums (MR, not null) += the sums over this kc of A's rows, one chain per row in p order,
// for A in a layout whose MR rows are adjacent (a_rs = 1: a packed panel, or dY^T read in place):
// a weight gradient's bias gradient, from the A the tile reads anyway.
// GELU and GELU' = Phi(x) + x phi(x) are the kernels' own (gelu below; avx*_math.hpp's gelu_slope
// in the vector ones), so a fused epilogue gives the bits of separate passes in the vector builds.
enum class TileAct { None, Gelu, GeluAndSlope, Scale };
struct TileEpilogue {
  bool load_c = false;
  const float* bias = nullptr;      // (NR)
  const float* residual = nullptr;  // (MR, NR)
  TileAct act = TileAct::None;
  float* slope_out = nullptr;       // (MR, NR), GeluAndSlope
  const float* scale = nullptr;     // (MR, NR), Scale
  float* a_row_sums = nullptr;      // (MR)
};

// What each instruction set provides (gemm.cpp runs the blocking, packing and threads).
struct GemmKernels {
  int mr, nr;  // register tile: MR rows x NR columns
  // K is cut into blocks of kc (the last one shorter): one B micro-panel (kc, NR) is read by every
  // tile of an A block, from L1 where it fits. Each tile's k products are one chain per block, the
  // blocks' sums added to C in order, so kc is part of a product's bits (and of PackedLinear's
  // layout).
  int kc;
  // c (MR, NR) with row stride ldc = the epilogue e of A (MR, kc) b_panel (kc, NR), where
  // A's element (r, p) is a[r * a_rs + p * a_ps]: a packed panel (a_rs = 1, a_ps = MR), MR whole
  // rows of a row-major matrix read in place (a_rs = its row stride, a_ps = 1), or MR columns of
  // a row-major matrix read in place as A's rows (a_rs = 1, a_ps = its row stride); b_panel's rows
  // are b_rs apart (NR for a packed panel, the row stride of a row-major B read in place).
  // The k products are one FMA chain per element in p order, the same for either layout of A or B.
  void (*tile)(int kc, const float* a, int64_t a_rs, int64_t a_ps, const float* b_panel, int64_t b_rs, float* c,
               int64_t ldc, const TileEpilogue& e);
  void (*gelu)(float* x, int64_t count);
  void (*layer_norm_row)(const float* x, int dim, const float* weight, const float* bias, float eps, float* out);
};

extern const GemmKernels kPortableGemm;  // gemm.cpp
extern const GemmKernels kAvx2Gemm;      // gemm_avx2.cpp, x86-64 only
extern const GemmKernels kAvx512Gemm;    // gemm_avx512.cpp, x86-64 only
extern const KernelTable<GemmKernels> kGemmKernels;  // the three above, by instruction set (gemm.cpp)

// Rows [0, NR) of W (row stride ldw), k [0, kc8) (a multiple of 8; NR a multiple of 8) into a panel
// (kc8, NR) of B = W^T with AVX2 shuffles (gemm_avx2.cpp): the packing of the vector kernels, which
// only run where AVX2 does.
void pack_wt_squares_avx2(const float* w, int64_t ldw, int kc8, int nr, float* dst);

// The kernels kernel_isa() selects (what gemm() and the functions above run).
const GemmKernels& active_gemm_kernels();

// Matrices (M, N) with C's row stride that a LinearEpilogue::Store or Gelu product also reads or
// writes (TileEpilogue), in this order: v = A B + bias, v = residual + v (saving a pass over both),
// then with Gelu C = GELU(v) and gelu_slope_out = GELU'(v), with Store and scale C = scale * v, else
// C = v. None of them may be C itself (refused): where K > kc, C holds partial sums before the
// last block reads them. And with any epilogue, a_row_sums (M) += the sums of A's rows over K, for
// an A whose column elements are adjacent (row_stride 1: dY^T of a weight gradient, whose row sums
// are the bias gradient), each a chain in k order per block of kc k, the blocks' sums added in
// order (one chain when C has no columns).
struct GemmExtras {
  const float* residual = nullptr;
  float* gelu_slope_out = nullptr;
  const float* scale = nullptr;
  float* a_row_sums = nullptr;
};

// gemm() on the given kernels instead of kernel_isa()'s: each build of the training ops runs its
// own instruction set's (train_ops.hpp), so its numbers match its name.
void gemm_with(const GemmKernels& kern, int m, int n, int k, GemmOperand a, GemmOperand b, float* c, int64_t ldc,
               const float* bias, LinearEpilogue epilogue, int threads, const GemmExtras& extras = {});

}  // namespace detail
}  // namespace vitlens
