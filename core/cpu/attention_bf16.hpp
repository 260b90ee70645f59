#pragma once
// Attention with bfloat16 products: the attention of Precision::Bf16 (vit.hpp), the two products
// in bfloat16 as PyTorch's bfloat16 forward computes them, the softmax in float32. Same inputs,
// outputs, threads and progress as multi_head_attention (fast_attention.hpp). For each head and
// block of query rows:
//   A. s_ij = scale * (bf16(q_i) . bf16(k_j)), the dot product as the Linear layers' (bf16.hpp:
//      pairs of c, float32 sums in the kernel's fixed order, each product exact); masked keys -> -inf
//   B. p_ij = e_ij / l_i with the float32 attention's softmax (the leaf kernels' softmax_row)
//   C. out_i = bf16(p_i) . bf16(V): the probabilities rounded to bfloat16 for the product, as
//      PyTorch's bfloat16 matmul takes them; sums in float32 in the same order
// The maps (received sums, first rows, kept P) are the float32 p of B. Both products run through
// bf16.hpp's kernels (K and V^T packed once per head as a Linear's weights), so the AVX512-BF16
// and AVX2 kernels give the emulation's bits, AMX's its own order's (bf16_kernel() picks one); the
// numbers do not depend on the thread count. No (N, N) matrix unless probs are kept: blocks of rows as in the float32 path.
#include <functional>

#include "core/cpu/bf16.hpp"
#include "core/cpu/fast_attention.hpp"

namespace vitlens {

bool multi_head_attention_bf16(const AttentionInputs& in, const AttentionOutputs& out, int threads = 0,
                               const std::function<bool(float)>& progress = {});

// attention_row_fast for a forward whose attention ran in bfloat16: the same numbers as row `query`
// of its P. q: (d); keys: token j's d values of this head at keys + j * key_stride (its qkv).
void attention_row_bf16(const float* q, const float* keys, int key_stride, int tokens, int head_dim, float scale,
                        const KeyMask& mask, int query, float* out);

namespace detail {

// multi_head_attention_bf16 on the given bfloat16 kernel (tests compare the kernels through it).
bool multi_head_attention_bf16_with(const Bf16GemmKernels& kernels, const AttentionInputs& in,
                                    const AttentionOutputs& out, int threads,
                                    const std::function<bool(float)>& progress);

// The multi-head driver both attentions share (defined in fast_attention.cpp), for checked inputs:
// blocks of block_rows query rows of every head, spread over threads in (head, row group) units
// (block b of a head in group b % groups, a group's blocks in order); prepare(slots) first, on the
// calling thread, then block(slot, head, first_row, column_sums) for every block, slot < slots
// telling which scratch to use, column_sums (aligned_keys(N) doubles) the group's; at the end
// out.column_sums = the groups' sums added in group order. Progress and cancelling as
// multi_head_attention; false when cancelled.
bool run_row_blocks(const AttentionInputs& in, const AttentionOutputs& out, int block_rows, int threads,
                    const std::function<bool(float)>& progress, const std::function<void(int)>& prepare,
                    const std::function<void(int, int, int, double*)>& block);

// The input checks multi_head_attention makes (fast_attention.cpp); throws vitlens::Error.
void check_attention_inputs(const AttentionInputs& in, const AttentionOutputs& out);

}  // namespace detail
}  // namespace vitlens
