// The bfloat16 product of bf16.hpp: the portable emulation (plain C++, the oracle of the vector
// kernel), packing, the driver (K blocks, edge tiles, threads) and the kernel choice.
//
// Index
//   [SECTION] Kernel choice
//   [SECTION] Emulated kernel
//   [SECTION] Packing
//   [SECTION] The product
#include "core/cpu/bf16.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"
#include "core/cpu/cpu.hpp"

namespace vitlens {

// [SECTION] Kernel choice
//
// The one place that maps the CPU (cpu.hpp's features and kernel_isa()) onto a bfloat16 kernel.

const char* bf16_kernel_name(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::Amx: return "amx";
    case Bf16Kernel::Avx512Bf16: return "avx512bf16";
    case Bf16Kernel::Avx2: return "avx2";
    case Bf16Kernel::Emulated: break;
  }
  return "emulated";
}

std::string bf16_kernel_missing(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::Amx: {
      if (!cpu_features().amx_bf16) return "this CPU has no AMX-BF16";
      if (!amx_bf16_usable()) return "the OS did not grant this process AMX's tile state";
      const std::string no_dot = bf16_kernel_missing(Bf16Kernel::Avx512Bf16);
      if (!no_dot.empty()) return no_dot;
      // Run once: the first product of the instructions against the kernel on tiles in memory.
#if defined(__x86_64__)
      static const bool agrees = detail::bf16_kernels_agree(detail::kAmxBf16Gemm, detail::kAmxSoftwareTilesGemm);
#else
      static const bool agrees = false;
#endif
      return agrees ? "" : "the AMX instructions disagreed with the same kernel on tiles in memory (self-check)";
    }
    case Bf16Kernel::Avx512Bf16:
      if (!kernel_isa_supported(KernelIsa::Avx512)) return kernel_isa_missing(KernelIsa::Avx512);
      return cpu_features().avx512_bf16 ? "" : "this CPU has no avx512_bf16";
    case Bf16Kernel::Avx2: return kernel_isa_missing(KernelIsa::Avx2);  // core/cpu/cpu.hpp
    case Bf16Kernel::Emulated: break;
  }
  return "";
}

bool bf16_kernel_supported(Bf16Kernel kernel) { return bf16_kernel_missing(kernel).empty(); }

bool amx_requested() {
  static const bool requested = [] {
    const char* env = std::getenv("VITLENS_AMX");
    return env && std::string(env) == "1";
  }();
  return requested;
}

Bf16Kernel bf16_kernel() {
  if (kernel_isa() == KernelIsa::Avx512) {
    static const bool has_amx = amx_requested() && bf16_kernel_supported(Bf16Kernel::Amx);
    static const bool has_dot = bf16_kernel_supported(Bf16Kernel::Avx512Bf16);
    if (has_amx) return Bf16Kernel::Amx;
    if (has_dot) return Bf16Kernel::Avx512Bf16;
  }
  return kernel_isa() == KernelIsa::Portable ? Bf16Kernel::Emulated : Bf16Kernel::Avx2;
}

namespace detail {

const Bf16GemmKernels& bf16_kernels(Bf16Kernel kernel) {
#if defined(__x86_64__)
  if (kernel == Bf16Kernel::Amx) return kAmxBf16Gemm;
  if (kernel == Bf16Kernel::Avx512Bf16) return kAvx512Bf16Gemm;
  if (kernel == Bf16Kernel::Avx2) return kAvx2Bf16Gemm;
#endif
  (void)kernel;
  return kEmulatedBf16Gemm;
}

namespace {

// [SECTION] Emulated kernel: vdpbf16ps's arithmetic, one element at a time.

// A denormal read as zero, as the instruction reads its inputs; a denormal result flushed to zero.
float flush_denormal(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }

void emulated_tile(int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b_panel, float* c, int64_t ldc,
                   bool load_c, const float* bias) {
  float acc[kBf16Mr][kBf16Nr];
  for (int r = 0; r < kBf16Mr; ++r)
    for (int j = 0; j < kBf16Nr; ++j) acc[r][j] = load_c ? flush_denormal(c[r * ldc + j]) : 0.0f;
  for (int p = 0; p < k_pairs; ++p) {
    const bf16_t* b = b_panel + static_cast<int64_t>(p) * kBf16Nr * 2;  // (NR, 2): column j's pair
    for (int r = 0; r < kBf16Mr; ++r) {
      const float a_even = flush_denormal(bf16_to_float(a[r * a_rs + 2 * p]));
      const float a_odd = flush_denormal(bf16_to_float(a[r * a_rs + 2 * p + 1]));
      for (int j = 0; j < kBf16Nr; ++j) {
        // Each product of two bfloat16 is exact in float32: only the adds round.
        const float b_even = flush_denormal(bf16_to_float(b[2 * j]));
        const float b_odd = flush_denormal(bf16_to_float(b[2 * j + 1]));
        acc[r][j] = flush_denormal(acc[r][j] + a_odd * b_odd);
        acc[r][j] = flush_denormal(acc[r][j] + a_even * b_even);
      }
    }
  }
  for (int r = 0; r < kBf16Mr; ++r)
    for (int j = 0; j < kBf16Nr; ++j) c[r * ldc + j] = bias ? acc[r][j] + bias[j] : acc[r][j];
}

}  // namespace

void convert_row_emulated(const float* x, int k, int padded, bf16_t* out) {
  for (int p = 0; p < k; ++p) out[p] = float_to_bf16(x[p]);
  for (int p = k; p < padded; ++p) out[p] = 0;
}

const Bf16GemmKernels kEmulatedBf16Gemm{kBf16Mr, emulated_tile, convert_row_emulated};

}  // namespace detail

// [SECTION] Packing

void pack_linear_bf16(const float* w, int n, int k, PackedLinearBf16& packed) {
  if (n < 0 || k < 0) throw Error("pack_linear_bf16: negative size");
  packed.n = n, packed.k = k;
  const int pairs = packed.k_pairs(), panels = (n + kBf16Nr - 1) / kBf16Nr;
  packed.panels.assign(static_cast<size_t>(panels) * pairs * kBf16Nr * 2, 0);
  for (int panel = 0; panel < panels; ++panel) {
    bf16_t* dst = packed.panels.data() + static_cast<int64_t>(panel) * pairs * kBf16Nr * 2;
    const int cols = std::min(kBf16Nr, n - panel * kBf16Nr);
    for (int j = 0; j < cols; ++j) {
      const float* row = w + static_cast<int64_t>(panel * kBf16Nr + j) * k;  // W's row = B's column
      for (int p = 0; p < k; ++p) dst[(static_cast<int64_t>(p / 2) * kBf16Nr + j) * 2 + p % 2] = float_to_bf16(row[p]);
    }
  }
}

// [SECTION] The product

namespace {

// k pairs per block: a panel block (128 pairs x 48 columns x 2 bfloat16, 24 KB) stays in L1 while
// every row tile of A streams past it from L2. The accumulator crosses blocks through C in float32,
// so blocking changes no bit.
constexpr int kPairsPerBlock = 128;

// C columns of panels [panel0, panel1): every row tile, every k block.
void product_panels(const detail::Bf16GemmKernels& kern, const bf16_t* a, int64_t a_rs, int m_padded, int m,
                    const PackedLinearBf16& packed, const float* bias_padded, float* y, int64_t ldy, bool accumulate,
                    int panel0, int panel1) {
  const int pairs = packed.k_pairs(), blocks = std::max(1, (pairs + kPairsPerBlock - 1) / kPairsPerBlock);
  for (int kb = 0; kb < blocks; ++kb) {
    const int p0 = kb * kPairsPerBlock, kp = std::min(kPairsPerBlock, pairs - p0);
    const bool first = kb == 0, last = kb == blocks - 1;
    for (int panel = panel0; panel < panel1; ++panel) {
      const int j0 = panel * kBf16Nr, cols = std::min(kBf16Nr, packed.n - j0);
      const bf16_t* b_panel = packed.panels.data() + (static_cast<int64_t>(panel) * pairs + p0) * kBf16Nr * 2;
      const float* tile_bias = last && bias_padded ? bias_padded + j0 : nullptr;
      const bool load_c = !first || accumulate;
      for (int i0 = 0; i0 < m_padded; i0 += kern.mr) {
        const bf16_t* a_tile = a + i0 * a_rs + 2 * p0;
        const int rows = std::min(kern.mr, m - i0);
        float* c = y + i0 * ldy + j0;
        if (rows == kern.mr && cols == kBf16Nr) {
          kern.tile(kp, a_tile, a_rs, b_panel, c, ldy, load_c, tile_bias);
          continue;
        }
        // Edge tile: the whole tile on a padded copy, so these elements round as any other.
        float pad[kBf16MaxMr * kBf16Nr] = {};
        if (load_c)
          for (int r = 0; r < rows; ++r) std::copy(c + r * ldy, c + r * ldy + cols, pad + r * kBf16Nr);
        kern.tile(kp, a_tile, a_rs, b_panel, pad, kBf16Nr, load_c, tile_bias);
        for (int r = 0; r < rows; ++r) std::copy(pad + r * kBf16Nr, pad + r * kBf16Nr + cols, c + r * ldy);
      }
    }
  }
}

}  // namespace

void detail::linear_forward_bf16_with(const Bf16GemmKernels& kern, const float* x, int64_t ldx, int m,
                                      const PackedLinearBf16& packed, const float* b, float* y, int64_t ldy,
                                      LinearEpilogue epilogue, int threads) {
  if (m < 0) throw Error("linear_forward_bf16: negative size");
  const int n = packed.n, k = packed.k;
  if (m == 0 || n == 0) return;
  if (packed.panels.size() < static_cast<size_t>((n + kBf16Nr - 1) / kBf16Nr) * packed.k_pairs() * kBf16Nr * 2)
    throw Error("linear_forward_bf16: the weights were never packed (pack_linear_bf16)");
  threads = resolve_threads(threads);

  // X rounded to bfloat16, K padded to pairs, M to whole tiles (zero rows, never stored).
  const int k_padded = 2 * packed.k_pairs(), m_padded = (m + kern.mr - 1) / kern.mr * kern.mr;
  thread_local std::vector<bf16_t, detail::CacheAligned<bf16_t>> a_buffer;  // the calling thread's, kept
  a_buffer.resize(static_cast<size_t>(m_padded) * k_padded);
  bf16_t* a = a_buffer.data();  // (a thread_local named inside a task would be that worker's own)
  std::fill(a + static_cast<int64_t>(m) * k_padded, a + static_cast<int64_t>(m_padded) * k_padded, bf16_t{0});
  const int row_tasks = std::min(m, std::max(1, threads) * 4);
  run_tasks(row_tasks, std::min(threads, row_tasks), [&](int t) {
    for (int i = t; i < m; i += row_tasks) kern.convert_row(x + i * ldx, k, k_padded, a + static_cast<int64_t>(i) * k_padded);
  });
  std::vector<float> bias_padded;
  if (b) {
    bias_padded.assign(static_cast<size_t>(n) + kBf16Nr, 0.0f);
    std::copy(b, b + n, bias_padded.begin());
  }

  // Threads split C's columns at whole panels (each reads all of A, from L2); up to four pieces a
  // thread, taken by whichever is free. The split changes no number.
  const int panels = (n + kBf16Nr - 1) / kBf16Nr;
  const double work = static_cast<double>(m) * n * std::max(k, 1);
  const int workers = std::max(1, std::min({threads, panels, static_cast<int>(work / 2.5e5)}));
  const int pieces = workers > 1 ? std::min(panels, 4 * workers) : 1;
  const int per_piece = (panels + pieces - 1) / pieces;
  const bool accumulate = epilogue == LinearEpilogue::Accumulate;
  const bool gelu = epilogue == LinearEpilogue::Gelu;
  run_tasks((panels + per_piece - 1) / per_piece, workers, [&](int t) {
    const int panel0 = t * per_piece, panel1 = std::min(panels, (t + 1) * per_piece);
    if (kern.thread_begin) kern.thread_begin();
    product_panels(kern, a, k_padded, m_padded, m, packed, b ? bias_padded.data() : nullptr, y, ldy, accumulate,
                   panel0, panel1);
    if (kern.thread_end) kern.thread_end();
    if (!gelu) return;
    // nn.GELU() in float32 on this piece's columns: the float32 forward's kernel (gelu_inplace).
    const int j0 = panel0 * kBf16Nr, cols = std::min(n, panel1 * kBf16Nr) - j0;
    for (int i = 0; i < m; ++i) gelu_inplace(y + i * ldy + j0, cols);
  });
}

void linear_forward_bf16(const float* x, int64_t ldx, int m, const PackedLinearBf16& packed, const float* b,
                         float* y, int64_t ldy, LinearEpilogue epilogue, int threads) {
  detail::linear_forward_bf16_with(detail::bf16_kernels(bf16_kernel()), x, ldx, m, packed, b, y, ldy, epilogue,
                                   threads);
}

// AMX's self-check runs this on the instructions and on tiles in memory (gemm_bf16_amx.cpp): a
// product with whole tiles and edges of rows, columns and pairs, over three K blocks. The
// instructions may sum in another order than the manual's (the two kernels then differ in the last
// bits): each result must then still be within the float32 accumulation bound of the other,
// (K + 1) 2^-24 sum |x w| twice over.
bool detail::bf16_kernels_agree(const Bf16GemmKernels& a, const Bf16GemmKernels& b) {
  constexpr int m = 21, n = 53, k = 2 * 2 * kPairsPerBlock + 37;
  std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k), bias(n);
  uint32_t state = 12345u;
  auto next = [&state](float scale) {  // a fixed LCG in [-scale, scale)
    state = state * 1664525u + 1013904223u;
    return scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  };
  for (size_t i = 0; i < x.size(); ++i) x[i] = next(i % 7 == 0 ? 2e-3f : 2.0f);
  for (float& v : w) v = next(0.5f);
  for (float& v : bias) v = next(1.0f);
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), n, k, packed);
  std::vector<float> ya(static_cast<size_t>(m) * n), yb(ya.size());
  linear_forward_bf16_with(a, x.data(), k, m, packed, bias.data(), ya.data(), n, LinearEpilogue::Store, 1);
  linear_forward_bf16_with(b, x.data(), k, m, packed, bias.data(), yb.data(), n, LinearEpilogue::Store, 1);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double magnitude = std::fabs(bias[static_cast<size_t>(j)]);
      for (int p = 0; p < k; ++p)
        magnitude += std::fabs(static_cast<double>(round_to_bf16(x[static_cast<size_t>(i) * k + p])) *
                               round_to_bf16(w[static_cast<size_t>(j) * k + p]));
      const double bound = 2.0 * (k + 1) * std::ldexp(1.0, -24) * magnitude;
      const size_t at = static_cast<size_t>(i) * n + j;
      if (!(std::fabs(static_cast<double>(ya[at]) - yb[at]) <= bound)) return false;
    }
  return true;
}

}  // namespace vitlens
