#pragma once
// How a program that runs forward() again and again keeps its freed memory for the next pass.
//
// A forward allocates its result (every layer's q, k, v and key panels: 15 MB for ViT-S/16 at
// 224 px, about 265 MB for ViT-S/8 at 480 px) and its scratch afresh. glibc's malloc hands blocks
// of more than 128 KB (a threshold it raises as they are freed, up to 32 MB) to mmap, and gives the
// free top of its heap back to the kernel once it passes twice that threshold; so each new pass
// page-faulted its memory in again, a fault per 4 KB page that the kernel zeroes. On this project's
// 2-core Zen 4 VM a ViT-S/16 forward took 6 % less time on one thread and 11 % less on two without
// those faults (bench/README.md, "Freed memory kept for the next forward").
#include <cstddef>

namespace vitlens {

// The limits set by keep_freed_memory().
constexpr size_t kHeapBlockLimit = size_t{32} << 20;   // blocks below this come from the heap, not mmap
constexpr size_t kKeptFreeMemory = size_t{256} << 20;  // free heap top kept until it grows past this

// Asks glibc's malloc to serve blocks below kHeapBlockLimit from its heap, and to keep the freed
// memory at the top of its heap until more than kKeptFreeMemory lies free there (then glibc gives
// that top back, all but 128 KB); freed blocks below memory still in use stay in the heap anyway.
// A repeated forward then reuses the pages it had. Larger blocks (a 1024 px card's q, k, v) still
// go to mmap and back, and a result larger than the limit (ViT-S/8 at 480 px) is only partly
// reused. Process-wide: the vitlens executable and vitlens_bench call it first thing in main();
// the library never calls it by itself. Returns false where it does nothing (another C library,
// or a sanitizer's allocator, which ignores the request).
bool keep_freed_memory();

// The memory this process can still count on, in bytes: the kernel's MemAvailable, lowered to
// what an address-space limit (RLIMIT_AS, `ulimit -v`) leaves; -1 when neither can be read. Used
// to refuse, with the numbers, work whose size is known before it starts (a model file, a
// training run) instead of failing half way.
long long available_memory_bytes();

}  // namespace vitlens
