// Attention with bfloat16 products (attention_bf16.hpp): the scores and the mix through bf16.hpp's
// product, the softmax with the float32 leaf kernels, the blocks spread over threads by the driver
// the float32 attention uses (detail::run_row_blocks).
//
// Index
//   [SECTION] One head's keys and values as a Linear's weights
//   [SECTION] Phases A and B: scores and softmax of a block of rows
//   [SECTION] Multi-head attention
//   [SECTION] One query row
#include "core/cpu/attention_bf16.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"

namespace vitlens {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Query rows per block: a multiple of the bfloat16 tile's rows, the block's (rows, ld) scores
// about 512 KB (the core's L2), at most 128 rows.
constexpr int kBlockFloats = 128 * 1024;
int rows_per_block(int ld) { return std::clamp(kBlockFloats / ld / kBf16MaxMr * kBf16MaxMr, kBf16MaxMr, 128); }

// [SECTION] One head's keys and values as a Linear's weights
//
// S = Q K^T is a Linear with W = K (N outputs, d inputs); out = P V one with W = V^T (d outputs,
// N inputs). Both packed once per head and layer (bf16.hpp pack_linear_bf16), O(N d).

// keys: token j's d values at keys + j * stride.
void pack_keys(const float* keys, int stride, int tokens, int d, std::vector<float>& rows, PackedLinearBf16& packed) {
  rows.resize(static_cast<size_t>(tokens) * d);
  for (int j = 0; j < tokens; ++j)
    std::copy(keys + static_cast<int64_t>(j) * stride, keys + static_cast<int64_t>(j) * stride + d,
              rows.begin() + static_cast<int64_t>(j) * d);
  pack_linear_bf16(rows.data(), tokens, d, packed);
}

void pack_values_transposed(const float* values, int stride, int tokens, int d, std::vector<float>& columns,
                            PackedLinearBf16& packed) {
  columns.resize(static_cast<size_t>(tokens) * d);  // (d, N)
  for (int j = 0; j < tokens; ++j)
    for (int c = 0; c < d; ++c) columns[static_cast<size_t>(c) * tokens + j] = values[static_cast<int64_t>(j) * stride + c];
  pack_linear_bf16(columns.data(), d, tokens, packed);
}

// [SECTION] Phases A and B: scores and softmax of a block of rows

// Rows [first_query, first_query + rows) of one head: s (rows, ld), row r at s + r * ld, becomes
// that row's P over [0, N): p_j = e_j * (1 / l) in float32, 0 for masked keys. q: row r's query at
// q + r * q_stride. Per row the same numbers whatever the block (attention_row_bf16 runs one row).
void block_probabilities(const detail::Bf16GemmKernels& kern, const detail::LeafKernels& leaf, const float* q,
                         int q_stride, int rows, int first_query, const PackedLinearBf16& keys, float scale,
                         const KeyMask& mask, float* s, int ld) {
  const int tokens = keys.n;
  // A: round(q) round(k)^T, float32 pair sums (bf16.hpp), then times the scale after the dot
  // product, as the float32 path does.
  detail::linear_forward_bf16_with(kern, q, q_stride, rows, keys, nullptr, s, ld, LinearEpilogue::Store, 1);
  const bool key_mask = !mask.key_allowed.empty();
  for (int r = 0; r < rows; ++r) {
    float* row = s + static_cast<int64_t>(r) * ld;
    const int limit = mask.causal ? std::min(first_query + r + 1, tokens) : tokens;
    const int end = aligned_keys(limit);
    for (int j = 0; j < limit; ++j) row[j] = key_mask && !mask.key_allowed[static_cast<size_t>(j)] ? kNegInf : row[j] * scale;
    std::fill(row + limit, row + end, kNegInf);
    // B: the float32 softmax of the float32 attention (its phase B), then p = e * (1 / l).
    const float inv = leaf.softmax_row(row, end, nullptr);
    for (int j = 0; j < limit; ++j) row[j] *= inv;
    std::fill(row + limit, row + tokens, 0.0f);
  }
}

}  // namespace

// [SECTION] Multi-head attention

namespace detail {

bool multi_head_attention_bf16_with(const Bf16GemmKernels& kern, const AttentionInputs& in,
                                    const AttentionOutputs& out, int threads,
                                    const std::function<bool(float)>& progress) {
  check_attention_inputs(in, out);
  const int n = in.tokens, heads = in.heads, d = in.head_dim, ld = aligned_keys(n);
  const LeafKernels& leaf = kLeafKernels.active();
  const KeyMask no_mask;
  const KeyMask& mask = in.mask ? *in.mask : no_mask;

  // Every head's K and V^T, packed in parallel (each head's packing is its own).
  std::vector<PackedLinearBf16> keys(static_cast<size_t>(heads)), values(static_cast<size_t>(heads));
  run_tasks(heads, threads, [&](int h) {
    std::vector<float> staging;
    pack_keys(in.keys + h * d, in.key_stride, n, d, staging, keys[static_cast<size_t>(h)]);
    pack_values_transposed(in.values + h * d, in.value_stride, n, d, staging, values[static_cast<size_t>(h)]);
  });

  const int block_rows = rows_per_block(ld);
  std::vector<std::vector<float, CacheAligned<float>>> scratch;
  auto prepare = [&](int slots) {
    scratch.assign(static_cast<size_t>(slots), std::vector<float, CacheAligned<float>>(static_cast<size_t>(block_rows) * ld));
  };
  auto block = [&](int slot, int h, int r0, double* column_sums) {
    const int rows = std::min(block_rows, n - r0);
    float* p = scratch[static_cast<size_t>(slot)].data();
    block_probabilities(kern, leaf, in.queries + static_cast<int64_t>(r0) * in.query_stride + h * d, in.query_stride,
                        rows, r0, keys[static_cast<size_t>(h)], in.scale, mask, p, ld);
    // C: out = round(P) round(V) (bf16.hpp rounds P as it reads it), each head into its columns.
    linear_forward_bf16_with(kern, p, ld, rows, values[static_cast<size_t>(h)], nullptr,
                             out.context + static_cast<int64_t>(r0) * out.context_stride + h * d, out.context_stride,
                             LinearEpilogue::Store, 1);
    // The maps: the float32 P of the counted rows summed in double, row by row; the rows kept.
    for (int r = 0; r < rows; ++r) {
      const float* row = p + static_cast<int64_t>(r) * ld;
      if (!in.counts_as_query || in.counts_as_query[r0 + r])
        for (int j = 0; j < n; ++j) column_sums[j] += row[j];
      if (r0 + r == 0 && out.first_rows) std::copy(row, row + n, out.first_rows + static_cast<int64_t>(h) * n);
      if (out.probs && out.probs[h]) std::copy(row, row + n, out.probs[h] + static_cast<int64_t>(r0 + r) * n);
    }
  };
  return run_row_blocks(in, out, block_rows, threads, progress, prepare, block);
}

}  // namespace detail

bool multi_head_attention_bf16(const AttentionInputs& in, const AttentionOutputs& out, int threads,
                               const std::function<bool(float)>& progress) {
  return detail::multi_head_attention_bf16_with(detail::bf16_kernels(bf16_kernel()), in, out, threads, progress);
}

// [SECTION] One query row

void attention_row_bf16(const float* q, const float* keys, int key_stride, int tokens, int head_dim, float scale,
                        const KeyMask& mask, int query, float* out) {
  if (!mask.key_allowed.empty() && mask.key_allowed.size() != static_cast<size_t>(tokens))
    throw Error("attention_row: the key mask has " + std::to_string(mask.key_allowed.size()) + " entries for " +
                std::to_string(tokens) + " tokens");
  thread_local std::vector<float> staging, row;
  thread_local PackedLinearBf16 packed;
  pack_keys(keys, key_stride, tokens, head_dim, staging, packed);
  row.resize(static_cast<size_t>(aligned_keys(tokens)));
  block_probabilities(detail::bf16_kernels(bf16_kernel()), detail::kLeafKernels.active(), q, 0, 1, query, packed,
                      scale, mask, row.data(), aligned_keys(tokens));
  std::copy(row.begin(), row.begin() + tokens, out);
}

}  // namespace vitlens
