// The training ops built for AVX-512F (core/CMakeLists.txt gives this file -mavx512f -mavx2
// -mfma); train_ops.cpp runs them when the CPU has AVX-512F and kernel_isa() is avx512f. The
// attention blocks are 16 floats wide here (one zmm register); the rest is train_ops.cpp's code
// as in the AVX2 build, which the compiler vectorises at 512 bits. Eigen's namespace is renamed
// as in train_ops_avx2.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"      // GCC 12's avx512fintrin.h placeholders
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (see fast_attention_avx512.cpp)
#endif
#define Eigen VitlensEigenAvx512
#define VITLENS_TRAIN_ISA avx512
#define VITLENS_TRAIN_AVX512 1
#include "core/train/train_ops.cpp"
