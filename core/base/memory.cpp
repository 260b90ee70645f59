// keep_freed_memory (memory.hpp): glibc's mallopt; available_memory_bytes: /proc and getrlimit.
#include "core/base/memory.hpp"

#include <algorithm>
#include <fstream>
#include <string>

#include <sys/resource.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vitlens {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // Setting either value also stops glibc's dynamic adjustment of both (mallopt(3)).
  const bool heap = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBlockLimit)) == 1;
  const bool kept = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptFreeMemory)) == 1;
  return heap && kept;
#else
  return false;
#endif
}

long long available_memory_bytes() {
  long long available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  long long kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(256, '\n');
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    // The limit counts the address space already mapped (code, libraries, thread stacks).
    long long mapped = 0;
    std::ifstream status("/proc/self/status");
    while (status >> key) {
      if (key == "VmSize:") {
        status >> mapped;
        mapped *= 1024;
        break;
      }
      status.ignore(4096, '\n');
    }
    const long long left = std::max(0LL, static_cast<long long>(limit.rlim_cur) - mapped);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

}  // namespace vitlens
