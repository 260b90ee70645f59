#pragma once
// The machine's limits as vitlens_bench measures them (bench/limits.cpp): what the kernels in use
// (core/cpu/cpu.hpp's kernel_isa) could reach on one core, so each timing can be given as a
// fraction of its floor; and the floors of the bfloat16 units where the CPU has them.
#include <string>

namespace vitlens::bench {

struct MachineLimits {
  double fma_gflops = 0.0;      // one core, independent FMA chains at the vector width in use
  double exp_per_ns = 0.0;      // one core, exp_array over an L1-resident buffer (exps per ns)
  // The same two with all `threads` threads running them at once (the sum of their rates): the
  // floors of a run on `threads` threads use these, not `threads` times one core's.
  double fma_gflops_all = 0.0;
  double exp_per_ns_all = 0.0;
  double gemm_gflops_1t = 0.0;  // linear_forward, 512 x 512 x 512, one thread
  double gemm_gflops_nt = 0.0;  // the same with `threads` threads
  // One core, independent vdpbf16ps chains (each instruction 16 lanes x 2 pairs = 64 flops);
  // 0 where the CPU has no AVX512-BF16 (bf16_dot_note says so).
  double bf16_dot_gflops = 0.0;
  std::string bf16_dot_note;    // "not on this CPU", or empty when measured
  double amx_gflops = 0.0;      // TDPBF16PS' peak; 0 where not measured (amx_note says why)
  std::string amx_note;         // "not on this CPU", or why AMX-BF16 is present but not used
};

// The floors' line: "floors, one core: float32 FMA 40.1 GFLOP/s (avx2); AVX512-BF16 dot products
// not on this CPU; AMX-BF16 not on this CPU".
std::string floors_line(const MachineLimits& limits);

// Takes about a second; threads as --threads (0 = one per core).
MachineLimits measure_limits(int threads);

// For `seconds`, one line each `window` seconds: one core's FMA rate, exp rate and 512^3 GEMM, each
// the best of the window's runs. A shared machine's slow spells (seconds long on the AMD Zen 3 VM
// of 7 Dec 2026, and in all three rates at once) show as dips: run it before and after a benchmark.
void watch_limits(double seconds, double window);

}  // namespace vitlens::bench
