#pragma once
// The CPU's features and the choice of kernels: every vector kernel of vitlens (fast attention,
// the SGEMM and its epilogues, the training ops) runs the instruction set chosen here, looked up
// in one kind of table (KernelTable below).
//
// Detection reads CPUID and, for each register file, whether the OS saves it (XGETBV's XCR0): a
// CPU flag the OS does not enable counts as absent. AMX's tile data also needs Linux's permission
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), asked for once, the first time
// amx_bf16_usable() is called; a refusal means "not available".
//
// The choice: the widest instruction set the CPU runs, unless the environment says otherwise:
//   VITLENS_ISA=portable | avx2 | avx512
// (read once, at the first kernel call; a name the CPU cannot run, or an unknown one, is reported
// in one line on stderr and the widest is used). set_kernel_isa() changes it at run time (tests,
// the bench's --isa). Instruction sets differ in the last bits (FMA, the order of the lanes' sums),
// never in the math; on one machine and instruction set the numbers are always the same.
//
// Adding a kernel: give its table struct a member and fill it in each ISA's file. Adding an ISA:
// a KernelIsa value, its check in cpu.cpp (isa_runs), a slot in KernelTable, one file of kernels
// per table.
#include <string>

namespace vitlens {

// [SECTION] Features

struct CpuFeatureFlags {
  bool avx2_fma = false;     // AVX2 and FMA, YMM state enabled by the OS
  bool avx512f = false;      // AVX-512 foundation, ZMM and opmask state enabled by the OS
  bool avx512bw = false;     // ... byte and word, vector length (128/256-bit forms), doubleword
  bool avx512vl = false;     //     and quadword: detected and reported; the kernels use only F
  bool avx512dq = false;
  bool avx512_bf16 = false;  // VCVTNE2PS2BF16, VDPBF16PS (the bf16 GEMM, gemm_bf16_avx512.cpp)
  bool amx_bf16 = false;     // AMX tiles with TDPBF16PS, tile state enabled by the OS (see below)
};

// Detected once (thread-safe), never changes.
const CpuFeatureFlags& cpu_features();

// amx_bf16 and Linux's permission to use the tile data, asked for on the first call only.
bool amx_bf16_usable();

// One line for the logs and bench reports: "avx2+fma avx512f avx512bw ... amx-bf16", or "baseline".
std::string cpu_features_line();

// [SECTION] The instruction set of the kernels

enum class KernelIsa { Portable, Avx2, Avx512 };
constexpr KernelIsa kAllKernelIsas[] = {KernelIsa::Portable, KernelIsa::Avx2, KernelIsa::Avx512};

const char* kernel_isa_name(KernelIsa isa);  // "portable", "avx2+fma", "avx512f" (reports)
// "portable", "avx2", "avx512": VITLENS_ISA's values, and the name a training run records.
const char* kernel_isa_id(KernelIsa isa);
// The value of kernel_isa_id, or false for an unknown name.
bool parse_kernel_isa(const std::string& id, KernelIsa& isa);
bool kernel_isa_supported(KernelIsa isa);  // by this CPU and OS
// Why not, for a test's skip line: "this CPU has no AVX-512F" ("" when supported).
std::string kernel_isa_missing(KernelIsa isa);

// The kernels in use: VITLENS_ISA's, or the widest supported, unless set_kernel_isa chose another.
KernelIsa kernel_isa();
// Tests and the bench: run `isa` from now on. Throws vitlens::Error when the CPU lacks it. Call it
// while no kernel runs (each call reads the choice once, at its start).
void set_kernel_isa(KernelIsa isa);

// [SECTION] Kernel tables

// One table of kernels per instruction set; null where the ISA's file is not built (not x86-64).
// Every kernel family (fast_attention.hpp's LeafKernels, gemm.hpp's GemmKernels, train_ops.hpp's
// TrainOps) is a struct of function pointers looked up this way.
template <class Kernels>
struct KernelTable {
  const Kernels* portable = nullptr;
  const Kernels* avx2 = nullptr;
  const Kernels* avx512 = nullptr;

  const Kernels& get(KernelIsa isa) const {
    const Kernels* k = isa == KernelIsa::Avx512 ? avx512 : isa == KernelIsa::Avx2 ? avx2 : portable;
    return k ? *k : *portable;
  }
  const Kernels& active() const { return get(kernel_isa()); }
};

// A vector ISA's table where it is built: VITLENS_X86_TABLE(detail::kAvx2Gemm), null elsewhere.
#if defined(__x86_64__)
#define VITLENS_X86_TABLE(table) (&(table))
#else
#define VITLENS_X86_TABLE(table) nullptr
#endif

}  // namespace vitlens
