// The training ops built for AVX2 + FMA (core/CMakeLists.txt gives this file -mavx2 -mfma);
// train_ops.cpp runs them when kernel_isa() is AVX2 + FMA. Eigen's namespace is renamed here so
// that none of its inline functions compiled for AVX2 can be chosen by the linker for the portable
// build (the one-definition rule would otherwise let it pick either copy).
#define Eigen VitlensEigenAvx2
#define VITLENS_TRAIN_ISA avx2
#include "core/train/train_ops.cpp"
