#pragma once
// bfloat16 operands with float32 accumulation: the Linear layers of the reduced-precision forward
// (vit.hpp Precision::Bf16), and its attention's two products, run as Linears with K and V^T as
// weights (attention_bf16.hpp). Softmax, LayerNorm, GELU and the residual
// stream stay float32.
//
// A bfloat16 is the top 16 bits of a float32 (sign, 8 exponent bits, 7 mantissa bits): the same
// range, about 2.6 significant decimal digits. Conversion rounds to nearest, ties to even; a NaN
// stays a NaN (made quiet, so it cannot round into an infinity).
//
// The product, Y (M, N) = X (M, K) W^T + b, W (N, K) as nn.Linear stores it: X is rounded to
// bfloat16 row by row on each call, W once (pack_linear_bf16), and every output element is
//   acc = 0; for p = 0, 2, 4, ...: acc += x[p+1] w[p+1]; acc += x[p] w[p]   (float32, rounded each step)
//   y = acc + b
// which is what one lane of the AVX512-BF16 instruction vdpbf16ps does per pair of k (Intel SDM,
// VDPBF16PS "Operation": the odd product first, each add rounded to nearest even; a product of two
// bfloat16 values is exact in float32; denormal inputs read as zero, denormal results flushed to
// zero). gemm_bf16.cpp writes that order in plain C++ (the emulation, the oracle),
// gemm_bf16_avx512.cpp runs it with vdpbf16ps and gemm_bf16_avx2.cpp with float32 FMAs (on CPUs
// without bfloat16 dot products); tests/test_gemm_bf16.cpp checks that each gives the emulation's
// bits, and the emulation against a float64 sum of the same rounded operands.
//
// AMX (gemm_bf16_amx.cpp) sums in TDPBF16PS' order instead: per 16 pairs of k, the even and the odd
// products in two float32 sums from zero, then C += their sum. Its results equal the emulation's
// to the float32 accumulation bound, not bit for bit; they do not depend on the thread count
// either. The same kernel on tile registers in memory (kAmxSoftwareTilesGemm) runs on any CPU: the
// tests check it against float64, and the instructions against it where the CPU has AMX.
//
// K is padded to an even count with zeros (adds +0, which changes no sum). Packed panels: W^T in
// column panels of kBf16Nr, each (ceil(K / 2) pairs, kBf16Nr columns, 2) bfloat16, so that one
// 64-byte load holds 16 columns' pair of k. Threads split the columns at multiples of the panel;
// each element is the same chain wherever it falls, so results do not depend on the thread count.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/gemm.hpp"

namespace vitlens {

using bf16_t = uint16_t;  // the bits of a bfloat16

// float32 -> bfloat16, round to nearest, ties to even; a NaN keeps its sign and becomes quiet.
inline bf16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((bits >> 16) | 0x0040u);
  const uint32_t round_bias = 0x7fffu + ((bits >> 16) & 1u);  // ties go to the even result
  return static_cast<bf16_t>((bits + round_bias) >> 16);
}

inline float bf16_to_float(bf16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// x rounded to the nearest bfloat16, as a float.
inline float round_to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// The packing every bfloat16 kernel shares: panels of NR = 48 columns. Rows of C a tile: MR = 8
// for the vector kernels (8 x 48 = 24 AVX-512 accumulators), 16 for AMX (a tile's rows); the
// driver pads A to whole tiles of the kernel it runs.
constexpr int kBf16Mr = 8, kAmxMr = 16, kBf16MaxMr = 16, kBf16Nr = 48;

// The bfloat16 kernels this CPU can run. Amx needs AMX-BF16 with Linux's permission for the tile
// state (cpu.hpp amx_bf16_usable), avx512_bf16 (it rounds X with vcvtneps2bf16; every CPU with AMX
// has it), and a first product that agrees with the same kernel on tiles in memory (the self-check
// in gemm_bf16.cpp; a CPU that fails it runs Avx512Bf16). The products run on it only where the
// environment asks, VITLENS_AMX=1 (amx_requested): the kernel has not yet run on an AMX CPU, its
// twin on tiles in memory is what the tests check everywhere. Avx512Bf16 needs avx512f and avx512_bf16
// (AMD Zen 4, Intel Cooper Lake, Sapphire Rapids and later); Avx2 (float32 FMAs on the bfloat16
// operands, the same bits, about float32's speed) needs AVX2 and FMA; Emulated is plain C++ (the
// oracle, many times slower).
enum class Bf16Kernel { Emulated, Avx2, Avx512Bf16, Amx };
const char* bf16_kernel_name(Bf16Kernel kernel);  // "emulated", "avx2", "avx512bf16", "amx"
bool bf16_kernel_supported(Bf16Kernel kernel);
// Why a kernel is not supported, for skip lines and reports ("" when it is).
std::string bf16_kernel_missing(Bf16Kernel kernel);
// The kernel the products run: where kernel_isa() (cpu.hpp) is Avx512, Amx where requested and
// supported, else Avx512Bf16 where supported; else Avx2 where kernel_isa() is Avx2 or Avx512; else
// (portable kernels) Emulated.
Bf16Kernel bf16_kernel();
// VITLENS_AMX=1 in the environment (read once).
bool amx_requested();
// Whether the bfloat16 products run in hardware: the CPU has them and the kernels chosen (VITLENS_ISA,
// set_kernel_isa) are the ones that use them. What Precision::Auto asks.
inline bool cpu_has_bf16_dot() {
  const Bf16Kernel kernel = bf16_kernel();
  return kernel == Bf16Kernel::Avx512Bf16 || kernel == Bf16Kernel::Amx;
}

// A Linear's W (N, K) rounded to bfloat16 and packed into panels, once.
struct PackedLinearBf16 {
  int n = 0, k = 0;  // N = outputs, K = inputs
  std::vector<bf16_t, detail::CacheAligned<bf16_t>> panels;  // (ceil(N / NR), ceil(K / 2), NR, 2)
  int k_pairs() const { return (k + 1) / 2; }
};

// Rounds W (N, K) to bfloat16 and packs it into `packed`. Bit-exact for a bfloat16 checkpoint
// (its values are already bfloat16: the loader widened them to float32 exactly).
void pack_linear_bf16(const float* w, int n, int k, PackedLinearBf16& packed);

// Y (M, N) = round_bf16(X) (M, K) W^T + b in the kernel's order (above); b (N) may be null; Store, Gelu
// (exact GELU after the sum, the float32 kernels' gelu_inplace) or Accumulate (Y += ...).
// threads <= 0: one per core. Runs bf16_kernel().
void linear_forward_bf16(const float* x, int64_t ldx, int m, const PackedLinearBf16& packed, const float* b,
                         float* y, int64_t ldy, LinearEpilogue epilogue = LinearEpilogue::Store, int threads = 1);

namespace detail {

// What each instruction set provides (gemm_bf16.cpp runs the blocking, padding and threads).
struct Bf16GemmKernels {
  int mr;  // rows of C a tile: kBf16Mr, or kAmxMr
  // c (MR, NR) with row stride ldc (floats) = (load_c ? c : 0) + A B, accumulated pair by pair in
  // the kernel's order (above), then + bias (NR) when bias is not null. A: MR rows of bfloat16, row
  // r at a + r * a_rs (a_rs in bfloat16 elements, even), pairs [0, k_pairs); b_panel: (k_pairs, NR, 2).
  void (*tile)(int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b_panel, float* c, int64_t ldc,
               bool load_c, const float* bias);
  // out[0, k) = float_to_bf16(x[0, k)) and out[k, padded) = 0. The vector kernel may read a
  // denormal x as zero (vcvtneps2bf16 does): the tile reads denormal bfloat16 as zero anyway.
  void (*convert_row)(const float* x, int k, int padded, bf16_t* out);
  // Called by each thread before its first tile and after its last one of a product, or null:
  // AMX loads its tile configuration and releases the tile state.
  void (*thread_begin)() = nullptr;
  void (*thread_end)() = nullptr;
};
extern const Bf16GemmKernels kEmulatedBf16Gemm;      // gemm_bf16.cpp
extern const Bf16GemmKernels kAvx512Bf16Gemm;        // gemm_bf16_avx512.cpp, x86-64 only
extern const Bf16GemmKernels kAvx2Bf16Gemm;          // gemm_bf16_avx2.cpp, x86-64 only
extern const Bf16GemmKernels kAmxBf16Gemm;           // gemm_bf16_amx.cpp, x86-64 only: the instructions
extern const Bf16GemmKernels kAmxSoftwareTilesGemm;  // gemm_bf16_amx.cpp: the same kernel on tiles in memory
const Bf16GemmKernels& bf16_kernels(Bf16Kernel kernel);
// Whether two kernels' results for one fixed product (21 x 53 x 549, every kind of edge) are
// within twice the float32 accumulation bound of each other: AMX's self-check.
bool bf16_kernels_agree(const Bf16GemmKernels& a, const Bf16GemmKernels& b);
// The row conversions the tables share: plain C++, and vcvtneps2bf16 (x86-64 only).
void convert_row_emulated(const float* x, int k, int padded, bf16_t* out);
void convert_row_avx512bf16(const float* x, int k, int padded, bf16_t* out);
// TDPBF16PS back to back, `iterations` x 4 instructions of 16 x 16 x 32 products on four
// accumulator tiles, for the bench's AMX floor (x86-64 only; where bf16_kernel_supported(Amx)).
void amx_dot_loop(int64_t iterations);

// linear_forward_bf16 on the given kernel (tests compare the kernels through it).
void linear_forward_bf16_with(const Bf16GemmKernels& kern, const float* x, int64_t ldx, int m,
                              const PackedLinearBf16& packed, const float* b, float* y, int64_t ldy,
                              LinearEpilogue epilogue, int threads);

}  // namespace detail
}  // namespace vitlens
