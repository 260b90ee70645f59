#pragma once
// Fast exact attention: what forward() and attention_row() run. The plain reference in
// attention.hpp (scaled_dot_product_attention, masked_softmax_rows) stays the oracle the tests
// compare this with.
//
// Softmax attention of one head, P = softmax(scale Q K^T + mask), out = P V, computed for a block
// of R query rows at a time (R * N floats, sized to stay in the core's L2 cache; never N x N):
//   A. s_ij = scale * q_i . k_j over the keys the block can see; masked keys -> -inf
//   B. m_i = max_j s_ij;  e_ij = exp(s_ij - m_i);  l_i = sum_j e_ij
//   C. out_i = (sum_j e_ij v_j) / l_i;  received partial sums += e_ij * (1 / l_i)
//      (values in panels as the keys, or in rows for heads of 32 channels or more: kRowLayoutMinDim)
// and p_ij = e_ij * (1 / l_i) for the rows the caller keeps (the class token's, or all of them).
//
// Why not FlashAttention's online softmax (m_i, l_i updated per key block, out rescaled): the
// attention received by a key, a column mean of P, needs every row's final m_i and l_i, so an
// online pass would have to compute every score and every exp a second time. With d = 12 an exp
// costs about as much as a dot product: per 16 (query, key) pairs this pass takes about 36 vector
// operations (12 for the score, 11 for the exp, 13 for e v and the column sum), an online pass
// plus a recompute pass about 60. R = 4 .. 16 rows are enough to reuse each key from cache.
//
// Exactness: each score is a float dot product times the scale, as in the reference (its d
// products summed in another order: a rounding of about |s| * 6e-8), the max is exact, the exp is
// within 1 ulp (1.5 without FMA), and the sums of exps (64 or 128 keys), of e v (512 keys in panels,
// 64 in rows) and of columns (16 rows) are float partial sums added in double. Rows sum to 1 as
// the reference's do; tests/test_fast_attention.cpp measures both against a double-precision
// oracle and states the tolerances. A row whose keys are all masked is all zero, never NaN.
//
// Speed: the leaf kernels are written for AVX-512 (16 lanes) and AVX2 + FMA (8 lanes) with
// intrinsics in functions carrying target attributes, and cpu.hpp's kernel_isa() picks one table
// at run time, so the binary runs on any x86-64; otherwise portable C++ does the same. Row blocks of
// all heads are spread over threads; the received sums of each group of rows are kept apart and
// added in a fixed order, so the numbers do not depend on the thread count or the scheduling.
//
// Shapes: N = tokens, H = heads, d = head dim; "ld" = N rounded up to kKeyAlign (16).
#include <cstdint>
#include <functional>

#include "core/base/eigen.hpp"
#include "core/base/key_mask.hpp"
#include "core/cpu/cpu.hpp"  // kernel_isa(): which LeafKernels run
#include "core/cpu/fast_exp.hpp"

namespace vitlens {

// [SECTION] Multi-head attention of one layer

// The kernels read keys (and the values of heads below kRowLayoutMinDim channels) in panels of
// kKeyAlign tokens: one head's (N, d) matrix is stored as (ld / 16, d, 16), so the d channels of
// 16 consecutive tokens are one contiguous block of 16 * d floats and a vector load takes 8 or 16
// tokens of one channel. Tokens N .. ld-1 are zero. Larger heads' values are in rows instead
// (LeafKernels::context_rows).
constexpr int kKeyAlign = 16;
inline int aligned_keys(int tokens) { return (tokens + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

// Every head's keys in panels: (H, ld * d), row h = head h's panels. keys: token i's H * d values
// start at keys + i * stride (head-major, as timm's qkv).
MatRM key_panels(const float* keys, int stride, int tokens, int heads, int head_dim);

struct AttentionInputs {
  int tokens = 0;                        // N (queries = keys = tokens)
  int heads = 0;                         // H
  int head_dim = 0;                      // d
  // Token i, head h: queries + i * query_stride + h * d (d values); the same for keys and values.
  const float* queries = nullptr;
  int query_stride = 0;
  const float* keys = nullptr;
  int key_stride = 0;
  const float* values = nullptr;
  int value_stride = 0;
  float scale = 1.0f;                    // scores = scale * q . k
  const KeyMask* mask = nullptr;         // null: every key allowed
  const uint8_t* counts_as_query = nullptr;  // (N) rows summed into column_sums; null: all rows
};

struct AttentionOutputs {
  float* context = nullptr;              // token i, head h: context + i * context_stride + h * d
  int context_stride = 0;
  float* column_sums = nullptr;          // (H, N) sum over counted rows of P, overwritten
  float* first_rows = nullptr;           // (H, N) row 0 of each head's P, or null
  float* const* probs = nullptr;         // H pointers to (N, N) row-major, or null
};

// Attention of every head. threads <= 0: one per core. progress (may be empty) is called from the
// calling thread only, with the fraction done; when it returns false the work stops early and
// this returns false (outputs then incomplete). Throws vitlens::Error on inconsistent inputs.
bool multi_head_attention(const AttentionInputs& in, const AttentionOutputs& out, int threads = 0,
                          const std::function<bool(float)>& progress = {});

// One query's row of one head's P: out (N) = softmax over keys of scale * q . k_j, masked. The
// same numbers as row `query` of multi_head_attention's P (same kernels, same order of sums).
// q: (d); panels: one head's keys in panels (a row of key_panels).
void attention_row_fast(const float* q, const float* panels, int tokens, int head_dim, float scale,
                        const KeyMask& mask, int query, float* out);

// [SECTION] Vectorised exp

// The constants of the vectorised exp are in fast_exp.hpp (namespace fast_exp).

// out[i] = exp(x[i]) with the kernels in use (the tests measure every instruction set).
void exp_array(const float* x, float* out, int count);

// [SECTION] Kernels (internal)
//
// fast_attention.cpp runs the phases above (masks, blocks, chunks, threads) once for every
// instruction set; each instruction set provides only these leaf kernels.

namespace detail {

struct LeafKernels {
  // A: s_i[j] = scale * q_i . k_j (+ bias[j]) for 4 query rows, keys [j0, j1) (multiples of 16),
  // from one head's key panels. Each score is the chain of products over c = 0 .. d-1 in order, as
  // in scores_1row. With row_max (4 floats), also row_max[i] = max(row_max[i], s_i[j] for j in
  // [j0, min(j1, max_end))); with null, max_end is unused. One entry per case,
  // [bias given][row_max given] (the vector kernels are templates on both).
  using Scores4Rows = void (*)(const float* const q[4], const float* key_panels, int d, float scale,
                               const float* bias, float* const s[4], int j0, int j1, int max_end, float* row_max);
  Scores4Rows scores_4rows[2][2];
  // A for one row over [0, end): bit-identical to a row of scores_4rows. [bias given].
  using Scores1Row = void (*)(const float* q, const float* key_panels, int d, float scale, const float* bias,
                              float* s, int end);
  Scores1Row scores_1row[2];
  // B: e = exp(s - max s) in place over [0, end) (a multiple of 16); returns float(1 / sum e) with the
  // sum in double over float partial sums, or 0 when every s is -inf (the row is then zeroed).
  // known_max: max s over [0, end) when the caller has it (phase A's), or null to find it here.
  float (*softmax_row)(float* s, int end, const float* known_max);
  // C for one or two rows r: sums[r][c] += sum over j in [j0, j1) of e_r[j] v_c[j] for `channels`
  // channels (4, 8 or 12), at most 512 keys, j0 and j1 multiples of 16 (whole panels; float partial
  // sums, then double); two rows give the bits two calls of one row would; and when
  // block_sums is given, block_sums[j] += e_r[j] * weights[r] (the row's p_j = e_j / l added to the
  // block's column sums; weight 0 for a row that does not count). values: the first channel's
  // entry in the value panels; a panel (16 keys) is panel_stride floats long.
  void (*weighted_values)(int rows, const float* const e_rows[2], const float weights[2], float* block_sums,
                          const float* values, int panel_stride, int channels, int j0, int j1,
                          double* const sums[2]);
  // column_sums[j] += block_sums[j] and block_sums[j] = 0, for j in [0, end).
  void (*flush_column_sums)(float* block_sums, int end, double* column_sums);
  void (*exp)(const float* x, float* out, int count);

  // C for heads of kRowLayoutMinDim channels or more, with the values in rows: token j's channels
  // at values + j * channels (channels a multiple of 16, the padding zero). For rows r < `rows`
  // (1 .. 4): sums[r][c] += sum over j in [j0, j1) of e_r[j] v_j[c], every c < channels, each as
  // one float chain over the keys in order (at most kRowChunk keys) added to the double sum.
  // Null where an instruction set has none; the panel kernels above then run phase C.
  void (*context_rows)(int rows, const float* const e_rows[4], const float* values, int channels, int j0, int j1,
                       double* const sums[4]);
  // block_sums[j] += e_r[j] * weights[r] for r = 0 .. rows - 1 (1 .. 4) in turn, j in [j0, j1)
  // (multiples of 16): the column sums weighted_values adds, for the row layout's phase C.
  void (*add_column_sums)(int rows, const float* const e_rows[4], const float weights[4], float* block_sums, int j0,
                          int j1);
};

// Phase C runs on values in rows (context_rows) for heads of at least this many channels where the
// kernels have it: each loaded value vector then serves 4 query rows, a chunk of values serves the
// block from L1 and the sums need no horizontal additions; the panel kernels keep the card's 12
// channels (and 16 or 24, where rows measured no faster: docs/speed.md).
constexpr int kRowLayoutMinDim = 32;
constexpr int kRowChunk = 64;  // keys per float chain of context_rows, then double

extern const LeafKernels kPortableKernels;
extern const LeafKernels kAvx2Kernels;    // fast_attention_avx2.cpp, x86-64 only
extern const LeafKernels kAvx512Kernels;  // fast_attention_avx512.cpp, x86-64 only
extern const KernelTable<LeafKernels> kLeafKernels;  // the three above, by instruction set

}  // namespace detail

}  // namespace vitlens
