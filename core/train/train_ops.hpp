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

namespace vitlens::train {

// Runs task(i) for i in [0, tasks) on up to `threads` threads (0 = one per core). Task i's work
// must not depend on which thread runs it. The first exception is rethrown after every join.
void parallel_for(int tasks, int threads, const std::function<void(int)>& task);

// The instruction set the ops run with, that of fast_attention.hpp's kernel_isa(): "avx512"
// (AVX-512F: the attention blocks 16 floats wide), "avx2" (AVX2 + FMA) or "portable" (SSE2, any
// x86-64). The builds differ in rounding (FMA, the order of the lanes' sums) and in the float
// GELU's erf (avx2_math.hpp's polynomial in the vector builds, Eigen's in the portable one; all
// within 1e-6 of std::erf's formula), not in the math; on one machine and instruction set the
// numbers are always the same. force_portable_train_ops(true) selects the portable build whatever
// kernel_isa() is (VITLENS_PORTABLE=1 in the environment does the same); set_kernel_isa() selects
// the others (tests compare every build the CPU runs).
const char* train_ops_isa();
void force_portable_train_ops(bool portable);

#include "core/train/train_ops_list.inc"

}  // namespace vitlens::train
