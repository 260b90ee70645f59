// The blocked, packed SGEMM driver of gemm.hpp, the portable kernels and the table of kernels.
//
// Index
//   [SECTION] Portable kernels
//   [SECTION] Packing
//   [SECTION] One thread's product
//   [SECTION] Threads and the public products
//   [SECTION] GELU and LayerNorm
#include "core/cpu/gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"

namespace vitlens {
namespace detail {
namespace {

// [SECTION] Portable kernels: plain loops the compiler vectorises for baseline x86-64 (SSE2).

constexpr int kPortableMr = 4, kPortableNr = 16, kPortableKc = 256;

// nn.GELU()'s formula with std::erf; at x = -inf the limit 0 (the formula would give -inf * 0).
float gelu_scalar(float x) {
  if (std::isinf(x) && x < 0.0f) return 0.0f;
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}

// GELU'(x) = Phi(x) + x phi(x) with std::erf and std::exp; the limits 0 and 1 at -inf and +inf.
float gelu_slope_scalar(float x) {
  if (std::isinf(x)) return x > 0.0f ? 1.0f : 0.0f;
  return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) + x * 0.39894228040143267794f * std::exp(-0.5f * x * x);
}

void portable_tile(int kc, const float* a, int64_t a_rs, int64_t a_ps, const float* b, int64_t b_rs, float* c,
                   int64_t ldc, const TileEpilogue& e) {
  float acc[kPortableMr][kPortableNr] = {}, row_sums[kPortableMr] = {};
  for (int p = 0; p < kc; ++p, a += a_ps, b += b_rs) {
    if (e.a_row_sums)
      for (int r = 0; r < kPortableMr; ++r) row_sums[r] += a[r * a_rs];
    for (int r = 0; r < kPortableMr; ++r)
      for (int j = 0; j < kPortableNr; ++j) acc[r][j] += a[r * a_rs] * b[j];
  }
  if (e.a_row_sums)
    for (int r = 0; r < kPortableMr; ++r) e.a_row_sums[r] += row_sums[r];
  for (int r = 0; r < kPortableMr; ++r)
    for (int j = 0; j < kPortableNr; ++j) {
      const int64_t at = r * ldc + j;
      float v = acc[r][j];
      if (e.load_c) v += c[at];
      if (e.bias) v += e.bias[j];
      if (e.residual) v = e.residual[at] + v;
      switch (e.act) {
        case TileAct::None: break;
        case TileAct::Gelu: v = gelu_scalar(v); break;
        case TileAct::GeluAndSlope:
          e.slope_out[at] = gelu_slope_scalar(v);
          v = gelu_scalar(v);
          break;
        case TileAct::Scale: v = e.scale[at] * v; break;
      }
      c[at] = v;
    }
}

void portable_gelu(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = gelu_scalar(x[i]);
}

void portable_layer_norm_row(const float* x, int dim, const float* weight, const float* bias, float eps, float* out) {
  double mean = 0.0;
  for (int c = 0; c < dim; ++c) mean += x[c];
  mean /= dim;
  double var = 0.0;
  for (int c = 0; c < dim; ++c) var += (x[c] - mean) * (x[c] - mean);
  var /= dim;  // biased, as torch.nn.LayerNorm
  const double inv = 1.0 / std::sqrt(var + static_cast<double>(eps));
  for (int c = 0; c < dim; ++c) out[c] = static_cast<float>((x[c] - mean) * inv) * weight[c] + bias[c];
}

}  // namespace

const GemmKernels kPortableGemm{kPortableMr,   kPortableNr,   kPortableKc,
                                portable_tile, portable_gelu, portable_layer_norm_row};

const KernelTable<GemmKernels> kGemmKernels{&kPortableGemm, VITLENS_X86_TABLE(kAvx2Gemm), VITLENS_X86_TABLE(kAvx512Gemm)};

}  // namespace detail

namespace {

using detail::GemmExtras;
using detail::GemmKernels;

// Block sizes, with the kernels' k block kc (256 or 384): an A block (kMc x kc, 96 to 144 KiB)
// stays in L2, one packed B micro-panel (kc x NR, 16 to 48 KiB) in L1, the packed B block
// (kc x kNc, 0.94 to 1.4 MiB) in L2 / L3.
constexpr int kMc = 96;          // a multiple of every MR (4, 6, 8)
constexpr int kNc = 960;         // a multiple of every NR (16, 48)
constexpr int kSplitCols = 48;   // column splits between threads: a multiple of every NR
constexpr int kMaxTile = 8 * 48; // the largest MR * NR
constexpr int kMaxMr = 8;        // the largest MR

const GemmKernels& active_gemm() { return detail::kGemmKernels.active(); }

// [SECTION] Packing

// A rows [i0, i0 + mc), columns [p0, p0 + kc) -> panels of MR rows, each (kc, MR); rows past mc are 0.
void pack_a(const GemmOperand& a, int i0, int mc, int p0, int kc, int mr, float* dst) {
  for (int ip = 0; ip < mc; ip += mr) {
    const int rows = std::min(mr, mc - ip);
    if (a.row_stride == 1) {  // A = dY^T (dW = dY^T X): each column of A is contiguous
      for (int p = 0; p < kc; ++p) {
        const float* src = a.data + (i0 + ip) + (p0 + p) * a.col_stride;
        float* out = dst + p * mr;
        for (int r = 0; r < rows; ++r) out[r] = src[r];
        for (int r = rows; r < mr; ++r) out[r] = 0.0f;
      }
      dst += static_cast<int64_t>(kc) * mr;
      continue;
    }
    for (int r = 0; r < mr; ++r) {
      if (r >= rows) {
        for (int p = 0; p < kc; ++p) dst[p * mr + r] = 0.0f;
        continue;
      }
      const float* src = a.data + (i0 + ip + r) * a.row_stride + static_cast<int64_t>(p0) * a.col_stride;
      for (int p = 0; p < kc; ++p) dst[p * mr + r] = src[p * a.col_stride];
    }
    dst += static_cast<int64_t>(kc) * mr;
  }
}

// Rows [j0, j0 + cols) of W (N, K) with row stride ldw, columns [p0, p0 + kc) -> one panel (kc, NR)
// of B = W^T; columns past cols are 0. A transpose: reading along p for one column and writing
// every NR-th float touched a new cache line per float (a sixth of a ViT's forward time went
// here); squares of 8 x 8 read 8 rows of W in 32-byte runs and write 8 panel rows in 32-byte runs,
// with AVX2 shuffles for the vector kernels (`avx2`; g++ leaves the plain loop scalar). Measured
// (ViT-S's 12 blocks of Linear weights, one thread): 10.5 ms column by column, 5 ms with the AVX2
// squares; ViT-B's: 163 ms and 72 ms.
void pack_wt_panel(const float* w, int64_t ldw, int cols, int kc, int nr, bool avx2, float* dst) {
  constexpr int kSq = 8;
  int p = 0;
#if defined(__x86_64__)
  if (avx2 && cols == nr && nr % kSq == 0) {
    p = kc / kSq * kSq;
    detail::pack_wt_squares_avx2(w, ldw, p, nr, dst);
  }
#endif
  if (cols == nr && nr % kSq == 0)
    for (; p + kSq <= kc; p += kSq)
      for (int j = 0; j < nr; j += kSq) {
        float square[kSq][kSq];  // (p, j) within the square
        for (int jj = 0; jj < kSq; ++jj) {
          const float* src = w + (j + jj) * ldw + p;
          for (int pp = 0; pp < kSq; ++pp) square[pp][jj] = src[pp];
        }
        for (int pp = 0; pp < kSq; ++pp) {
          float* out = dst + static_cast<int64_t>(p + pp) * nr + j;
          for (int jj = 0; jj < kSq; ++jj) out[jj] = square[pp][jj];
        }
      }
  for (; p < kc; ++p) {  // the last kc % 8 rows, or a panel of fewer than NR columns
    float* out = dst + static_cast<int64_t>(p) * nr;
    for (int j = 0; j < cols; ++j) out[j] = w[j * ldw + p];
    for (int j = cols; j < nr; ++j) out[j] = 0.0f;
  }
}

// B rows [p0, p0 + kc), columns [j0, j0 + nc) -> panels of NR columns, each (kc, NR); columns past nc are 0.
void pack_b(const GemmOperand& b, int p0, int kc, int j0, int nc, int nr, bool avx2, float* dst) {
  for (int jp = 0; jp < nc; jp += nr) {
    const int cols = std::min(nr, nc - jp);
    if (b.col_stride == 1) {  // B rows contiguous (dX = dY W, dW = dY^T X)
      for (int p = 0; p < kc; ++p) {
        const float* src = b.data + (p0 + p) * b.row_stride + j0 + jp;
        float* out = dst + p * nr;
        // Full panels in fixed 8-float pieces (NR is a multiple of 8), which the compiler inlines:
        // a memcpy of run-time length is a library call for each row of 16 floats.
        if (cols == nr && nr % 8 == 0) {
          for (int j = 0; j < nr; j += 8) std::memcpy(out + j, src + j, 8 * sizeof(float));
          continue;
        }
        std::memcpy(out, src, sizeof(float) * static_cast<size_t>(cols));
        for (int j = cols; j < nr; ++j) out[j] = 0.0f;
      }
    } else if (b.row_stride == 1) {  // B = W^T (Linear forward): each column of B is a contiguous row of W
      pack_wt_panel(b.data + (j0 + jp) * b.col_stride + p0, b.col_stride, cols, kc, nr, avx2, dst);
    } else {  // any other layout: element by element
      for (int p = 0; p < kc; ++p)
        for (int j = 0; j < nr; ++j)
          dst[p * nr + j] = j < cols ? b.data[(p0 + p) * b.row_stride + (j0 + jp + j) * b.col_stride] : 0.0f;
    }
    dst += static_cast<int64_t>(kc) * nr;
  }
}

// [SECTION] One thread's product

struct PackBuffers {
  detail::AlignedFloats a, b;
};

// Where the k block starting at p0's panel of columns [j, j + NR) starts in PackedLinear::panels:
// the blocks before it hold p0 rows of every panel, this block kc rows of each panel before it.
int64_t packed_panel_offset(int p0, int kc, int j, int n, int nr) {
  const int64_t padded_n = static_cast<int64_t>((n + nr - 1) / nr) * nr;
  return static_cast<int64_t>(p0) * padded_n + static_cast<int64_t>(j) * kc;
}

// A tile of rows x cols < MR x NR at c: the same kernel on padded copies, so these elements round
// as any other. (The extras' pads are cleared only when used: a forward's last row panel passes
// here.) row_sums (rows, or null) += A's row sums, through a padded copy of them.
void edge_tile(const GemmKernels& kern, int kc, const float* a_tile, int64_t a_rs, int64_t a_ps, const float* b_panel,
               int64_t b_rs, int rows, int cols, float* c, int64_t ldc, detail::TileEpilogue e, float* row_sums) {
  const int nr = kern.nr;
  float sums_pad[kMaxMr] = {};
  if (row_sums) e.a_row_sums = sums_pad;
  float pad[kMaxTile] = {}, pad_residual[kMaxTile], pad_slope[kMaxTile], pad_scale[kMaxTile];
  if (e.residual) std::fill(pad_residual, pad_residual + kMaxTile, 0.0f);
  if (e.scale) std::fill(pad_scale, pad_scale + kMaxTile, 0.0f);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(cols);
  for (int r = 0; r < rows; ++r) {
    if (e.load_c) std::memcpy(pad + r * nr, c + r * ldc, row_bytes);
    if (e.residual) std::memcpy(pad_residual + r * nr, e.residual + r * ldc, row_bytes);
    if (e.scale) std::memcpy(pad_scale + r * nr, e.scale + r * ldc, row_bytes);
  }
  float* slope_dst = e.slope_out;
  if (e.residual) e.residual = pad_residual;
  if (e.scale) e.scale = pad_scale;
  if (e.slope_out) e.slope_out = pad_slope;
  kern.tile(kc, a_tile, a_rs, a_ps, b_panel, b_rs, pad, nr, e);
  for (int r = 0; r < rows; ++r) {
    std::memcpy(c + r * ldc, pad + r * nr, row_bytes);
    if (slope_dst) std::memcpy(slope_dst + r * ldc, pad_slope + r * nr, row_bytes);
  }
  if (row_sums)  // the padded panel's sums (0 + each sum: the same bits)
    for (int r = 0; r < rows; ++r) row_sums[r] += sums_pad[r];
}

// C rows [i0, i1), columns [j0, j1): the whole K loop. bias_padded covers every column of the
// full product plus one tile's padding (edge tiles read NR entries). With `packed` (B = its W^T,
// packed for these kernels), the panels are read from it instead of packed here: the same values
// in the same order, so the same bits.
void gemm_block(const GemmKernels& kern, int i0, int i1, int j0, int j1, int k, const GemmOperand& a,
                const GemmOperand& b, const PackedLinear* packed, float* c, int64_t ldc, bool accumulate,
                const float* bias_padded, bool gelu, const GemmExtras& extras, PackBuffers& buffers) {
  const int mr = kern.mr, nr = kern.nr, k_block = kern.kc;
  // Only as much as this product needs (a training step makes hundreds of small products: zeroing
  // a full 1 MB block each time cost more than the arithmetic); the buffers only ever grow.
  const size_t kc_max = static_cast<size_t>(std::min(k_block, std::max(k, 1)));
  const size_t mc_max = static_cast<size_t>((std::min(kMc, i1 - i0) + mr - 1) / mr * mr);
  const size_t nc_max = static_cast<size_t>((std::min(kNc, j1 - j0) + nr - 1) / nr * nr);
  if (buffers.a.size() < mc_max * kc_max) buffers.a.resize(mc_max * kc_max);
  if (!packed && buffers.b.size() < kc_max * nc_max) buffers.b.resize(kc_max * nc_max);
  // Full tiles read A in place, since packing it (a strided copy as large as A) took a fifth of the
  // tile kernel's time at K = 48: A row-major (X of a Linear forward, dY of dX = dY W) row by row,
  // A = dY^T (dW = dY^T X) as MR adjacent floats of each row of dY; only a last panel of fewer than
  // MR rows is packed (zero rows, never read past A's end).
  const bool a_in_place = a.col_stride == 1 || a.row_stride == 1;
  const int k_blocks = std::max(1, (k + k_block - 1) / k_block);  // k = 0 still writes b (and GELU)
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int p0 = kb * k_block, kc = std::min(k_block, k - p0);
    const bool first = kb == 0, last = kb == k_blocks - 1;
    for (int jc = j0; jc < j1; jc += kNc) {
      const int nc = std::min(kNc, j1 - jc);
      // A row-major B whose columns here are whole panels (X of a weight gradient dW = dY^T X, W
      // of dX = dY W, with 48 or 96 features for the 48-wide tile) is read in place, its rows
      // b.row_stride apart. Packing X took about a twentieth of a training step.
      const bool b_in_place = !packed && b.col_stride == 1 && nc % nr == 0;
      if (!packed && !b_in_place) pack_b(b, p0, kc, jc, nc, nr, &kern != &detail::kPortableGemm, buffers.b.data());
      for (int ic = i0; ic < i1; ic += kMc) {
        const int mc = std::min(kMc, i1 - ic);
        const int full_rows = a_in_place ? mc / mr * mr : 0;  // panels read in place
        if (full_rows < mc) pack_a(a, ic + full_rows, mc - full_rows, p0, kc, mr, buffers.a.data());
        for (int jr = 0; jr < nc; jr += nr) {
          const float* b_panel = packed       ? packed->panels.data() + packed_panel_offset(p0, kc, jc + jr, packed->n, nr)
                                 : b_in_place ? b.data + static_cast<int64_t>(p0) * b.row_stride + jc + jr
                                              : buffers.b.data() + static_cast<int64_t>(jr) * kc;
          const int64_t b_rs = b_in_place ? b.row_stride : nr;
          const float* tile_bias = last && bias_padded ? bias_padded + jc + jr : nullptr;
          const int cols = std::min(nr, nc - jr);
          for (int ir = 0; ir < mc; ir += mr) {
            const bool in_place = ir < full_rows;
            const float* a_tile = in_place ? a.data + static_cast<int64_t>(ic + ir) * a.row_stride + p0 * a.col_stride
                                           : buffers.a.data() + static_cast<int64_t>(ir - full_rows) * kc;
            const int64_t a_rs = in_place ? a.row_stride : 1, a_ps = in_place ? a.col_stride : mr;
            const int64_t at = (ic + ir) * ldc + jc + jr;  // the tile's first element in C and the extras
            detail::TileEpilogue e;
            e.load_c = !first || accumulate;
            e.bias = tile_bias;
            if (last) {
              e.residual = extras.residual ? extras.residual + at : nullptr;
              e.act = gelu && extras.gelu_slope_out ? detail::TileAct::GeluAndSlope
                      : gelu                        ? detail::TileAct::Gelu
                      : extras.scale                ? detail::TileAct::Scale
                                                    : detail::TileAct::None;
              e.slope_out = extras.gelu_slope_out ? extras.gelu_slope_out + at : nullptr;
              e.scale = extras.scale ? extras.scale + at : nullptr;
            }
            const int rows = std::min(mr, mc - ir);
            // A's row sums from the tiles of C's first columns only (each row once per k block).
            float* row_sums = extras.a_row_sums && jc + jr == 0 ? extras.a_row_sums + ic + ir : nullptr;
            if (rows == mr && cols == nr) {
              e.a_row_sums = row_sums;
              kern.tile(kc, a_tile, a_rs, a_ps, b_panel, b_rs, c + at, ldc, e);
              continue;
            }
            edge_tile(kern, kc, a_tile, a_rs, a_ps, b_panel, b_rs, rows, cols, c + at, ldc, e, row_sums);
          }
        }
      }
    }
  }
}

// [SECTION] Threads and the public products

}  // namespace

const detail::GemmKernels& detail::active_gemm_kernels() { return active_gemm(); }

void gemm(int m, int n, int k, GemmOperand a, GemmOperand b, float* c, int64_t ldc, const float* bias,
          LinearEpilogue epilogue, int threads) {
  detail::gemm_with(active_gemm(), m, n, k, a, b, c, ldc, bias, epilogue, threads);
}

namespace {

// gemm_with's body; B's panels come from `packed` when it is not null (then B is its W^T).
void run_gemm(const GemmKernels& kern, int m, int n, int k, GemmOperand a, GemmOperand b, const PackedLinear* packed,
              float* c, int64_t ldc, const float* bias, LinearEpilogue epilogue, int threads,
              const GemmExtras& extras = {}) {
  if (m < 0 || n < 0 || k < 0) throw Error("gemm: negative size");
  if (epilogue == LinearEpilogue::Accumulate && (extras.residual || extras.gelu_slope_out || extras.scale))
    throw Error("gemm: a residual, GELU slope or scale matrix with the Accumulate epilogue");
  if (extras.gelu_slope_out && epilogue != LinearEpilogue::Gelu) throw Error("gemm: a GELU slope without GELU");
  if (extras.scale && epilogue != LinearEpilogue::Store) throw Error("gemm: a scale matrix needs the Store epilogue");
  if (extras.a_row_sums && a.row_stride != 1) throw Error("gemm: A's row sums need A's column elements adjacent");
  if ((extras.residual && extras.residual == c) || (extras.scale && extras.scale == c) ||
      (extras.gelu_slope_out && extras.gelu_slope_out == c))
    throw Error("gemm: an epilogue matrix is C itself");
  if (m == 0 || n == 0) {  // no tiles; A's row sums still wanted (C has no columns)
    if (extras.a_row_sums)
      for (int i = 0; i < m; ++i)
        for (int p = 0; p < k; ++p) extras.a_row_sums[i] += a.data[i + p * a.col_stride];
    return;
  }
  const bool accumulate = epilogue == LinearEpilogue::Accumulate, gelu = epilogue == LinearEpilogue::Gelu;
  std::vector<float> bias_padded;
  if (bias) {
    bias_padded.assign(static_cast<size_t>(n) + static_cast<size_t>(kern.nr), 0.0f);
    std::copy(bias, bias + n, bias_padded.begin());
  }
  const float* bp = bias ? bias_padded.data() : nullptr;

  // Threads: only when each gets a few hundred thousand multiply-adds; rows when there are more
  // of them than columns, split at multiples of kMc, else columns at multiples of kSplitCols. When
  // that gives fewer pieces than threads (a weight gradient dW = dY^T X of a narrow layer: 48 or 96
  // rows, thousands of K), at multiples of the tile instead; so too when B is not packed ahead and
  // there are fewer than four such units per thread (below). Where the splits fall changes no
  // number: every output element is the same FMA chain in any tile.
  threads = resolve_threads(threads);
  const double work = static_cast<double>(m) * n * std::max(k, 1);
  int parts = std::max(1, std::min(threads, static_cast<int>(work / 2.5e5)));
  const bool split_rows = m >= n;
  const int extent = split_rows ? m : n;
  int unit = split_rows ? kMc : kSplitCols;
  const int tile_unit = split_rows ? kern.mr : kern.nr;
  if ((extent + unit - 1) / unit < parts) unit = tile_unit;
  // Fewer than four whole units a thread (a weight gradient: 48 to 144 rows or columns): at
  // multiples of the tile, or 144 rows would split 96 + 48. (Not with B packed ahead, the
  // inference forward, whose balance was measured with units of 96 rows and 32 columns.)
  else if (!packed && extent < 4 * unit * parts) unit = tile_unit;
  const int units = (extent + unit - 1) / unit;
  const int workers = std::min(parts, units);
  // Up to four pieces per thread, taken in turn by whichever thread is free: with one piece each,
  // a thread the VM slowed down made the other wait (about a tenth of a 2-thread ViT-S/16
  // forward's samples were in run_tasks, the pool's wait and the scheduler). The cost: each column
  // piece reads all of A again (from L2), each row piece of a product whose B is not packed ahead
  // packs all of B itself. So such rows are cut finer than one piece per thread only while each
  // piece keeps kMc rows: a weight gradient (48 to 144 rows, K = 6400) in 8 pieces of 6 rows
  // packed its 1.2 MB X eight times, and ran slower on two threads than on one.
  int pieces = workers > 1 ? std::min(units, 4 * workers) : 1;
  if (split_rows && !packed) pieces = std::min(pieces, std::max(workers, extent / kMc));
  const int per_part = (units + pieces - 1) / pieces * unit;
  parts = (extent + per_part - 1) / per_part;
  run_tasks(parts, workers, [&](int t) {
    thread_local PackBuffers buffers;  // kept by each thread between products
    const int lo = t * per_part, hi = std::min(extent, lo + per_part);
    if (split_rows) gemm_block(kern, lo, hi, 0, n, k, a, b, packed, c, ldc, accumulate, bp, gelu, extras, buffers);
    else gemm_block(kern, 0, m, lo, hi, k, a, b, packed, c, ldc, accumulate, bp, gelu, extras, buffers);
  });
}

}  // namespace

void detail::gemm_with(const GemmKernels& kern, int m, int n, int k, GemmOperand a, GemmOperand b, float* c,
                       int64_t ldc, const float* bias, LinearEpilogue epilogue, int threads, const GemmExtras& extras) {
  run_gemm(kern, m, n, k, a, b, nullptr, c, ldc, bias, epilogue, threads, extras);
}

void linear_forward(const float* x, int64_t ldx, int m, int k, const float* w, int n, const float* b, float* y,
                    int64_t ldy, LinearEpilogue epilogue, int threads) {
  // B (K, N) = W^T: element (p, j) is w[j * K + p].
  gemm(m, n, k, GemmOperand{x, ldx, 1}, GemmOperand{w, 1, k}, y, ldy, b, epilogue, threads);
}

void pack_linear(const float* w, int n, int k, PackedLinear& packed, int threads) {
  if (n < 0 || k < 0) throw Error("pack_linear: negative size");
  const GemmKernels& kern = active_gemm();
  const int nr = kern.nr, k_block = kern.kc, panels = (n + nr - 1) / nr;
  packed.w = w, packed.n = n, packed.k = k, packed.kernels = &kern;
  const size_t floats = static_cast<size_t>(panels) * static_cast<size_t>(nr) * static_cast<size_t>(k);
  if (packed.panels.size() < floats) packed.panels.resize(floats);
  // One task per (k block, panel): any thread count writes the same floats.
  const int k_blocks = (k + k_block - 1) / k_block;
  const int tasks = k_blocks * panels;
  run_tasks(tasks, std::min(resolve_threads(threads), std::max(1, tasks)), [&](int t) {
    const int p0 = t / panels * k_block, j = t % panels * nr;
    const int kc = std::min(k_block, k - p0), cols = std::min(nr, n - j);
    pack_wt_panel(w + static_cast<int64_t>(j) * k + p0, k, cols, kc, nr, &kern != &detail::kPortableGemm,
                  packed.panels.data() + packed_panel_offset(p0, kc, j, n, nr));
  });
}

void linear_forward_packed(const float* x, int64_t ldx, int m, const PackedLinear& packed, const float* b, float* y,
                           int64_t ldy, LinearEpilogue epilogue, int threads) {
  if (!packed.kernels) throw Error("linear_forward_packed: the weights were never packed (pack_linear)");
  const GemmOperand a{x, ldx, 1}, wt{packed.w, 1, packed.k};
  if (packed.kernels != &active_gemm()) {  // packed for other tiles: W itself, packed per call
    linear_forward(x, ldx, m, packed.k, packed.w, packed.n, b, y, ldy, epilogue, threads);
    return;
  }
  run_gemm(*packed.kernels, m, packed.n, packed.k, a, wt, &packed, y, ldy, b, epilogue, threads);
}

void linear_backward_input(const float* dy, int64_t lddy, int m, int n, const float* w, int k, float* dx,
                           int64_t lddx, bool accumulate, int threads) {
  // dX (M, K) = dY (M, N) W (N, K): B = W as stored.
  gemm(m, k, n, GemmOperand{dy, lddy, 1}, GemmOperand{w, k, 1}, dx, lddx, nullptr,
       accumulate ? LinearEpilogue::Accumulate : LinearEpilogue::Store, threads);
}

void linear_backward_weight(const float* dy, int64_t lddy, int m, int n, const float* x, int64_t ldx, int k,
                            float* dw, float* db, int threads) {
  // dW (N, K) += dY^T (N, M) X (M, K): A's element (i, p) is dy[p * lddy + i].
  gemm(n, k, m, GemmOperand{dy, 1, lddy}, GemmOperand{x, ldx, 1}, dw, k, nullptr, LinearEpilogue::Accumulate,
       threads);
  if (db)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) db[j] += dy[i * lddy + j];
}

// [SECTION] GELU and LayerNorm

void gelu_inplace(float* x, int64_t count) {
  if (count > 0) active_gemm().gelu(x, count);
}

void layer_norm_rows(const float* x, int64_t ldx, int rows, int dim, const float* weight, const float* bias,
                     float eps, float* out, int64_t ldo) {
  const GemmKernels& kern = active_gemm();
  for (int i = 0; i < rows; ++i) kern.layer_norm_row(x + i * ldx, dim, weight, bias, eps, out + i * ldo);
}

}  // namespace vitlens
