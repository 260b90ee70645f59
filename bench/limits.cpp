// The machine's limits for vitlens_bench: FMA throughput at the vector width in use, exp
// throughput, what the GEMM reaches, and the bfloat16 dot product's throughput where the CPU has
// AVX512-BF16. Each is the best of a few short runs (the machine may be shared: the best run is
// the one least disturbed).
#include "limits.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cpu/bf16.hpp"
#include "core/cpu/cpu.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/cpu/gemm.hpp"
#include "core/base/parallel.hpp"  // resolve_threads

namespace vitlens::bench {
namespace {

double seconds_of(void (*fn)(int64_t, float*), int64_t iterations, float* sink) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(iterations, sink);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 12 independent chains: enough to cover an FMA latency of 4 cycles at 2 FMAs per cycle.
constexpr int kChains = 12;

#if defined(__x86_64__)
__attribute__((target("avx512f,avx2,fma"))) void fma_loop_avx512(int64_t iterations, float* sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.01f * c);
  const __m512 mul = _mm512_set1_ps(0.9999999f), add = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  _mm512_storeu_ps(sink, total);
}

__attribute__((target("avx2,fma"))) void fma_loop_avx2(int64_t iterations, float* sink) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + 0.01f * c);
  const __m256 mul = _mm256_set1_ps(0.9999999f), add = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  __m256 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm256_add_ps(total, acc[c]);
  _mm256_storeu_ps(sink, total);
}

// The bfloat16 dot product's peak: vdpbf16ps (16 lanes, a pair of products each) on independent
// chains, as the fma loops above. Run only where bf16_kernel_supported(Avx512Bf16) says the CPU
// has it; its numbers are never used, only its time.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"))) void dpbf16_loop(int64_t iterations,
                                                                                          float* sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.01f * c);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // 1, 1e-7
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  _mm512_storeu_ps(sink, total);
}

// Baseline x86-64: SSE2, a multiply and an add per lane (counted as the 2 flops of an FMA).
void fma_loop_sse2(int64_t iterations, float* sink) {
  __m128 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_ps(1.0f + 0.01f * c);
  const __m128 mul = _mm_set1_ps(0.9999999f), add = _mm_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], mul), add);
  __m128 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm_add_ps(total, acc[c]);
  _mm_storeu_ps(sink, total);
}
#endif

double best_of(int tries, double (*run)()) {
  double best = 0.0;
  for (int t = 0; t < tries; ++t) best = std::max(best, run());
  return best;
}

#if defined(__x86_64__)
// The FMA loop at the vector width kernel_isa() runs, and its lanes.
struct FmaLoop {
  void (*fn)(int64_t, float*);
  int lanes;
};
FmaLoop fma_loop_in_use() {
  if (kernel_isa() == KernelIsa::Avx512) return {fma_loop_avx512, 16};
  if (kernel_isa() == KernelIsa::Avx2) return {fma_loop_avx2, 8};
  return {fma_loop_sse2, 4};
}
#endif

double fma_gflops() {
#if defined(__x86_64__)
  const FmaLoop loop = fma_loop_in_use();
  alignas(64) float sink[16];
  const int64_t iterations = 4000000;
  const double s = seconds_of(loop.fn, iterations, sink);
  return 2.0 * loop.lanes * kChains * static_cast<double>(iterations) / s * 1e-9;
#else
  return 0.0;
#endif
}

double bf16_dot_gflops() {
#if defined(__x86_64__)
  alignas(64) float sink[16];
  const int64_t iterations = 2000000;
  const double s = seconds_of(dpbf16_loop, iterations, sink);
  return 64.0 * kChains * static_cast<double>(iterations) / s * 1e-9;
#else
  return 0.0;
#endif
}

// AMX's TDPBF16PS peak (bf16.hpp amx_dot_loop): 16 x 16 x 32 products, 2 flops each, an instruction.
double amx_gflops() {
#if defined(__x86_64__)
  const int64_t iterations = 200000;
  const auto start = std::chrono::steady_clock::now();
  detail::amx_dot_loop(iterations);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(iterations) / s * 1e-9;
#else
  return 0.0;
#endif
}

// The buffers are 64-byte aligned, as the attention's rows of scores are (fast_attention.cpp): from
// plain std::vector storage (16-byte aligned) half of the 32-byte loads and stores may cross a cache
// line, which measured 2.5 to 3.3 exps per ns from run to run on AMD Zen 3 instead of a steady 3.7.
double exp_per_ns() {
  detail::AlignedFloats x(4096), y(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -0.01f * static_cast<float>(i % 1000);
  const int repeats = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) exp_array(x.data(), y.data(), static_cast<int>(x.size()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(x.size()) * repeats / s * 1e-9;
}

int g_threads = 1;  // --threads, resolved (0 became one per core)

double gemm_gflops_with(int threads) {
  const int size = 512;
  std::vector<float> x(static_cast<size_t>(size) * size, 0.5f), w(x.size(), 0.25f), y(x.size());
  const auto t0 = std::chrono::steady_clock::now();
  linear_forward(x.data(), size, size, size, w.data(), size, nullptr, y.data(), size, LinearEpilogue::Store, threads);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * size * size * static_cast<double>(size) / s * 1e-9;
}

// `rate` run on `threads` threads at once (plain threads, started together), the sum of their rates:
// what the machine gives when every thread of a forward is busy. Where threads share a core's
// units (SMT siblings, a VM's virtual cores on one physical core) this is less than `threads`
// times one core's rate; on the 2-core AMD Zen 3 VM of 6 Dec 2026 two threads gave 2.0x one
// core's FMA rate (203 against 102.5 GFLOP/s) and 1.7x to 2.0x its exp rate (three runs).
double concurrent_rate(int threads, double (*rate)()) {
  if (threads <= 1) return rate();
  std::vector<double> rates(static_cast<size_t>(threads), 0.0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&rates, t, rate] { rates[static_cast<size_t>(t)] = rate(); });
  for (std::thread& w : workers) w.join();
  double total = 0.0;
  for (double r : rates) total += r;
  return total;
}

// Keeps the core busy with FMAs for `seconds`: a core that was idle runs slower for its first tens
// of milliseconds of work (on the AMD Zen 3 VM, 6 Dec 2026, an FMA probe ran its first 50 ms at 78 %
// of the rate it reached after 80 ms), and the limits must not be measured on that ramp. (That VM
// also had slow spells of seconds, whole runs at 60 % of its FMA rate, which no warm-up avoids: a
// limits line far below the usual one marks a disturbed run.)
void warm_up(double seconds) {
#if defined(__x86_64__)
  alignas(64) float sink[16];
  const auto t0 = std::chrono::steady_clock::now();
  const FmaLoop loop = fma_loop_in_use();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds)
    loop.fn(200000, sink);
#else
  (void)seconds;
#endif
}

}  // namespace

MachineLimits measure_limits(int threads) {
  g_threads = std::max(1, resolve_threads(threads));
  MachineLimits limits;
  warm_up(0.3);
  limits.fma_gflops = best_of(5, fma_gflops);
  limits.exp_per_ns = best_of(5, exp_per_ns);
  limits.fma_gflops_all = best_of(5, [] { return concurrent_rate(g_threads, fma_gflops); });
  limits.exp_per_ns_all = best_of(5, [] { return concurrent_rate(g_threads, exp_per_ns); });
  limits.gemm_gflops_1t = best_of(5, [] { return gemm_gflops_with(1); });
  limits.gemm_gflops_nt = best_of(5, [] { return gemm_gflops_with(g_threads); });
  if (bf16_kernel_supported(Bf16Kernel::Avx512Bf16)) limits.bf16_dot_gflops = best_of(5, bf16_dot_gflops);
  else limits.bf16_dot_note = "not on this CPU";
  if (bf16_kernel_supported(Bf16Kernel::Amx)) limits.amx_gflops = best_of(5, amx_gflops);
  else limits.amx_note = cpu_features().amx_bf16 ? bf16_kernel_missing(Bf16Kernel::Amx) : "not on this CPU";
  return limits;
}

void watch_limits(double seconds, double window) {
  warm_up(0.3);
  std::printf("%8s %14s %12s %16s   (one core; each the best of its window's runs)\n", "s", "FMA GFLOP/s",
              "exp per ns", "GEMM GFLOP/s");
  const auto start = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  while (since(start) < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    double fma = 0.0, exps = 0.0, gemm = 0.0;
    do {  // the three in turn, so a slow spell of the window shows in all of them
      fma = std::max(fma, fma_gflops());
      exps = std::max(exps, exp_per_ns());
      gemm = std::max(gemm, gemm_gflops_with(1));
    } while (since(t0) < window);
    std::printf("%8.1f %14.1f %12.2f %16.1f\n", since(start), fma, exps, gemm);
    std::fflush(stdout);
  }
}

std::string floors_line(const MachineLimits& limits) {
  char fma[96], dot[96];
  std::snprintf(fma, sizeof fma, "float32 FMA %.1f GFLOP/s (%s kernels)", limits.fma_gflops,
                kernel_isa_name(kernel_isa()));
  if (limits.bf16_dot_note.empty()) std::snprintf(dot, sizeof dot, "AVX512-BF16 dot products %.1f GFLOP/s", limits.bf16_dot_gflops);
  else std::snprintf(dot, sizeof dot, "AVX512-BF16 dot products %s", limits.bf16_dot_note.c_str());
  char amx[160];
  if (limits.amx_note.empty()) std::snprintf(amx, sizeof amx, "AMX-BF16 %.1f GFLOP/s", limits.amx_gflops);
  else std::snprintf(amx, sizeof amx, "AMX-BF16 %s", limits.amx_note.c_str());
  return std::string("floors, one core: ") + fma + "; " + dot + "; " + amx;
}

}  // namespace vitlens::bench
