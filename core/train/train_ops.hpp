#pragma once
// Forward and backward of every operation of the ViT, side by side in the manner of llm.c's
// train_gpt2.c: `op_forward` computes and caches what the backward needs, `op_backward` is next to
// it and ACCUMULATES (+=) into the gradient buffers, so a tensor used twice (the residual stream)
// simply receives two contributions. Some write their output instead (linear_gelu_backward's dpre,
// attention_backward's dqkv, gelu_backward's dinp, drop_path_backward's dbranch): each feeds exactly
// one consumer, and clearing it every step cost more than it was worth. Each op is templated on
// the scalar: float for training, double for the finite-difference check (tests/test_train_grad.cpp).
//
// Dimension legend (on top of eigen.hpp's): B = images in the batch, Np = patches per image,
// N = prefix + Np tokens per image, R = B * N token rows, K = 3 P P values per patch, C = classes,
// I / O = a Linear's in / out features.
//
// Threads: every op splits its work into tasks of a FIXED size (rows, output features or
// (image, head) pairs) that do not depend on the thread count, and sums partial results in a fixed
// order, so the numbers are the same for any `threads` (0 = one per core).
#include <cstdint>
#include <functional>

#include "core/cpu/cpu.hpp"

namespace vitlens::train {

// Runs task(i) for i in [0, tasks) on up to `threads` threads (0 = one per core). Task i's work
// must not depend on which thread runs it. The first exception is rethrown after every join.
void parallel_for(int tasks, int threads, const std::function<void(int)>& task);

// The ops are built once per instruction set (train_ops_ref.cpp, compiled with none, -mavx2 -mfma
// and -mavx512f by core/CMakeLists.txt) and each call runs the build of cpu.hpp's kernel_isa():
// AVX-512F (the attention blocks 16 floats wide), AVX2 + FMA, or portable (SSE2, any x86-64).
// The builds differ in rounding (FMA, the order of the lanes' sums) and in the float GELU's erf
// (avx2_math.hpp's polynomial in the vector builds, Eigen's in the portable one; all within 1e-6
// of std::erf's formula), not in the math; on one machine and instruction set the numbers are
// always the same. VITLENS_ISA=portable in the environment or set_kernel_isa() selects another
// (tests compare every build the CPU runs).
//
// The name of the build in use, as a training run records it: "avx512", "avx2" or "portable"
// (cpu.hpp's kernel_isa_id).
const char* train_ops_isa();

// The k block of the SGEMM that build runs its Linear layers on (gemm.hpp GemmKernels::kc: 384 in
// the AVX2 build, 256 in the others; 256 in every build before 7 Dec 2026): part of its rounding,
// so a training run records it beside train_ops_isa().
int train_ops_k_block();

// The ops' table: one function pointer per entry of train_ops_list.inc, for one scalar type.
// write_dinp's default belongs to the public function only.
#define VITLENS_TRAIN_DEFAULT(value)
#define VITLENS_TRAIN_OP(ret, name, params, args) ret(*name) params;
template <class T>
struct TrainOps {
#include "core/train/train_ops_list.inc"
};
#undef VITLENS_TRAIN_OP

// The table of kernel_isa()'s build (train_ops.cpp).
template <class T>
const TrainOps<T>& train_ops();
template <>
const TrainOps<float>& train_ops<float>();
template <>
const TrainOps<double>& train_ops<double>();

// The public ops: each calls its entry in train_ops<T>() (shapes and meaning: train_ops_list.inc).
#undef VITLENS_TRAIN_DEFAULT
#define VITLENS_TRAIN_DEFAULT(value) = value
#define VITLENS_TRAIN_OP(ret, name, params, args) \
  template <class T>                              \
  ret name params {                               \
    return train_ops<T>().name args;              \
  }
#include "core/train/train_ops_list.inc"
#undef VITLENS_TRAIN_OP
#undef VITLENS_TRAIN_DEFAULT
#define VITLENS_TRAIN_DEFAULT(value)  // the declarations of each build (train_ops_ref.cpp) have none

}  // namespace vitlens::train
