#pragma once
// The machine's limits as vitlens_bench measures them (bench/limits.cpp): what the kernels in use
// (core/cpu/cpu.hpp's kernel_isa) could reach on one core, so each timing can be given as a
// fraction of its floor.
namespace vitlens::bench {

struct MachineLimits {
  double fma_gflops = 0.0;      // one core, independent FMA chains at the vector width in use
  double exp_per_ns = 0.0;      // one core, exp_array over an L1-resident buffer (exps per ns)
  double gemm_gflops_1t = 0.0;  // linear_forward, 512 x 512 x 512, one thread
  double gemm_gflops_nt = 0.0;  // the same with `threads` threads
};

// Takes about a second; threads as --threads (0 = one per core).
MachineLimits measure_limits(int threads);

}  // namespace vitlens::bench
