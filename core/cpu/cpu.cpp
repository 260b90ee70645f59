// CPU features (CPUID, XGETBV, Linux's AMX permission) and the choice of kernels (cpu.hpp).
#include "core/cpu/cpu.hpp"

#include <atomic>
#include <iterator>
#include <cstdio>
#include <cstdlib>

#include "core/base/error.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace vitlens {

namespace {

// [SECTION] Detection

#if defined(__x86_64__)
bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

// XCR0: which register states the OS saves on a context switch (valid only with OSXSAVE).
unsigned long long read_xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

CpuFeatureFlags detect() {
  CpuFeatureFlags f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28);
  if (!osxsave || !avx) return f;
  const unsigned long long xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;   // XTILECFG, XTILEDATA
  unsigned max_leaf = 0;
  __get_cpuid(0, &max_leaf, &b, &c, &d);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_max_sub = a;
  f.avx2_fma = ymm_state && bit(b, 5) && fma;
  f.avx512f = zmm_state && f.avx2_fma && bit(b, 16);
  f.avx512dq = f.avx512f && bit(b, 17);
  f.avx512bw = f.avx512f && bit(b, 30);
  f.avx512vl = f.avx512f && bit(b, 31);
  f.amx_bf16 = tile_state && bit(d, 24) && bit(d, 22);  // AMX-TILE and AMX-BF16
  if (leaf7_max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && bit(a, 5);
  }
  return f;
}

// Linux hands out AMX's 8 KB of tile state per process on request only (Linux 5.16 and later).
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#else
CpuFeatureFlags detect() { return {}; }
bool request_amx_permission() { return false; }
#endif

bool isa_runs(KernelIsa isa) {
  const CpuFeatureFlags& f = cpu_features();
  switch (isa) {
    case KernelIsa::Portable: return true;
    case KernelIsa::Avx2: return f.avx2_fma;
    case KernelIsa::Avx512: return f.avx512f;  // the kernels' target attributes: avx512f, avx2, fma
  }
  return false;
}

// [SECTION] The choice

// By KernelIsa's value: the id (VITLENS_ISA, a training run's record) and the name in reports.
constexpr struct {
  const char* id;
  const char* report;
} kIsaNames[] = {{"portable", "portable"}, {"avx2", "avx2+fma"}, {"avx512", "avx512f"}};
static_assert(std::size(kIsaNames) == std::size(kAllKernelIsas));

KernelIsa widest_isa() {
  for (KernelIsa isa : {KernelIsa::Avx512, KernelIsa::Avx2})
    if (isa_runs(isa)) return isa;
  return KernelIsa::Portable;
}

// VITLENS_ISA's choice, or the widest; what the environment asked for that cannot be had is said
// once on stderr.
KernelIsa initial_isa() {
  const char* env = std::getenv("VITLENS_ISA");
  if (!env || !*env) return widest_isa();
  KernelIsa isa;
  if (!parse_kernel_isa(env, isa)) {
    std::fprintf(stderr, "vitlens: VITLENS_ISA=%s is not one of portable, avx2, avx512; using %s\n", env,
                 kernel_isa_id(widest_isa()));
    return widest_isa();
  }
  if (!isa_runs(isa)) {
    std::fprintf(stderr, "vitlens: VITLENS_ISA=%s: %s; using %s\n", env, kernel_isa_missing(isa).c_str(),
                 kernel_isa_id(widest_isa()));
    return widest_isa();
  }
  return isa;
}

std::atomic<int>& chosen_isa() {
  static std::atomic<int> isa{static_cast<int>(initial_isa())};
  return isa;
}

}  // namespace

const CpuFeatureFlags& cpu_features() {
  static const CpuFeatureFlags features = detect();
  return features;
}

bool amx_bf16_usable() {
  static const bool usable = cpu_features().amx_bf16 && request_amx_permission();
  return usable;
}

std::string cpu_features_line() {
  const CpuFeatureFlags& f = cpu_features();
  const std::pair<bool, const char*> names[] = {
      {f.avx2_fma, "avx2+fma"},        {f.avx512f, "avx512f"},   {f.avx512bw, "avx512bw"},
      {f.avx512vl, "avx512vl"},        {f.avx512dq, "avx512dq"}, {f.avx512_bf16, "avx512-bf16"},
      {f.amx_bf16 && amx_bf16_usable(), "amx-bf16"}};
  std::string line;
  for (const auto& [has, name] : names)
    if (has) line += (line.empty() ? "" : " ") + std::string(name);
  return line.empty() ? "baseline" : line;
}

const char* kernel_isa_name(KernelIsa isa) { return kIsaNames[static_cast<int>(isa)].report; }

const char* kernel_isa_id(KernelIsa isa) { return kIsaNames[static_cast<int>(isa)].id; }

bool parse_kernel_isa(const std::string& id, KernelIsa& isa) {
  for (KernelIsa candidate : kAllKernelIsas)
    if (id == kernel_isa_id(candidate)) {
      isa = candidate;
      return true;
    }
  return false;
}

bool kernel_isa_supported(KernelIsa isa) { return isa_runs(isa); }

std::string kernel_isa_missing(KernelIsa isa) {
  if (isa_runs(isa)) return "";
#if !defined(__x86_64__)
  return std::string("the ") + kernel_isa_name(isa) + " kernels are built for x86-64 only";
#else
  return isa == KernelIsa::Avx2 ? "this CPU (or its OS) has no AVX2 + FMA" : "this CPU (or its OS) has no AVX-512F";
#endif
}

KernelIsa kernel_isa() { return static_cast<KernelIsa>(chosen_isa().load()); }

void set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_supported(isa))
    throw Error(std::string("set_kernel_isa: ") + kernel_isa_missing(isa));
  chosen_isa().store(static_cast<int>(isa));
}

}  // namespace vitlens
