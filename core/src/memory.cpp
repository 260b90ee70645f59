// keep_freed_memory (memory.hpp): glibc's mallopt.
#include "vitlens/memory.hpp"

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

}  // namespace vitlens
