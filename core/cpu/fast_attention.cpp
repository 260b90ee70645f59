// Fast exact attention (fast_attention.hpp): the phases of one block of query rows (written once,
// run with any instruction set's leaf kernels), the portable leaf kernels and their table, the
// multi-head driver that spreads row blocks over threads, and the single-row path.
//
// Index
//   [SECTION] Phases
//   [SECTION] Portable kernels
//   [SECTION] Multi-head driver
//   [SECTION] One query row
#include "core/cpu/fast_attention.hpp"

#include "core/cpu/attention_bf16.hpp"  // detail::run_row_blocks, check_attention_inputs

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"

namespace vitlens {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

const detail::LeafKernels& active_kernels() { return detail::kLeafKernels.active(); }

}  // namespace

void exp_array(const float* x, float* out, int count) { active_kernels().exp(x, out, count); }

// [SECTION] Phases

namespace {

constexpr int kKeyChunk = 512;  // keys per pass of phases A and C: d * 512 floats of k or v (24 KB at d = 12) in L1
constexpr int kMaxRows = 16;    // query rows per block

// One block of query rows of one head.
struct BlockJob {
  const float* keys;      // this head's key panels (ld / 16, d, 16)
  const float* values;    // value panels (ld / 16, d4, 16): d4 = d rounded up to 4, the extra channels zero;
                          // or with value_rows, rows (ld, d4): d4 = d rounded up to 16
  bool value_rows;        // phase C by context_rows
  int ld, head_dim, head_dim4;
  const float* key_bias;  // (ld) 0 or -inf, or null when every key < N is allowed
  float scale;
  int tokens;             // N
  bool causal;
  const float* queries;   // row r's query: queries + r * query_stride
  int query_stride;
  int rows;               // 1 .. kMaxRows
  int first_query;        // token index of row 0
  const uint8_t* counts;  // (rows) 1 = summed into column_sums, or null: all
  float* scores;          // (rows rounded up to 4, ld) scratch; on return the rows' e over [0, key_end)
  double* context_sums;   // (rows, d4) scratch
  float* block_sums;      // (ld) scratch, zero on entry and on return
  float* context;         // row r's output: context + r * context_stride, d values
  int context_stride;
  double* column_sums;    // (ld) += sum over counted rows of P
  // Set by attention_block: P = e * inv[r] over [0, key_end) and 0 from key_end on (causal).
  int key_end;
  float inv[kMaxRows];
};

// Phase C with the values in rows: the active rows (inv != 0) four at a time over chunks of
// kRowChunk keys, so each chunk of values (kRowChunk * d4 floats, 16 KB at d = 64) serves every
// row from L1; then the counted rows' p = e * inv into the block's column sums.
void context_in_rows(const detail::LeafKernels& kernels, BlockJob& job, const int* active, int count, int end) {
  const int ld = job.ld, d4 = job.head_dim4;
  for (int j0 = 0; j0 < end; j0 += detail::kRowChunk) {
    const int j1 = std::min(j0 + detail::kRowChunk, end);
    for (int i = 0; i < count; i += 4) {
      const int group = std::min(4, count - i);
      const float* e_rows[4] = {};
      double* sums[4] = {};
      for (int k = 0; k < group; ++k) {
        e_rows[k] = job.scores + active[i + k] * ld;
        sums[k] = job.context_sums + active[i + k] * d4;
      }
      kernels.context_rows(group, e_rows, job.values, d4, j0, j1, sums);
    }
  }
  const float* e_rows[4] = {};
  float weights[4] = {};
  int group = 0;
  for (int i = 0; i < count; ++i) {
    const int r = active[i];
    if (job.counts && !job.counts[r]) continue;
    e_rows[group] = job.scores + r * ld;
    weights[group++] = job.inv[r];
    if (group == 4) {
      kernels.add_column_sums(group, e_rows, weights, job.block_sums, 0, end);
      group = 0;
    }
  }
  if (group > 0) kernels.add_column_sums(group, e_rows, weights, job.block_sums, 0, end);
}

// Phase C with the values in panels: rows in pairs, 12 channels per call, key chunk by key chunk so a
// chunk of v serves every row from L1; the first channel group also adds the counted rows' p = e *
// inv to the block's column sums.
void context_in_panels(const detail::LeafKernels& kernels, BlockJob& job, const int* active, int count, int end) {
  const int ld = job.ld, d4 = job.head_dim4;
  for (int j0 = 0; j0 < end; j0 += kKeyChunk) {
    const int j1 = std::min(j0 + kKeyChunk, end);
    for (int i = 0; i < count; i += 2) {
      const int pair = std::min(2, count - i);
      const float* e_rows[2] = {};
      float weights[2] = {};
      double* sums[2] = {};
      for (int k = 0; k < pair; ++k) {
        const int r = active[i + k];
        e_rows[k] = job.scores + r * ld;
        weights[k] = !job.counts || job.counts[r] ? job.inv[r] : 0.0f;
        sums[k] = job.context_sums + r * d4;
      }
      for (int c = 0; c < d4; c += 12) {
        double* channel_sums[2] = {sums[0] + c, pair == 2 ? sums[1] + c : nullptr};
        kernels.weighted_values(pair, e_rows, weights, c == 0 ? job.block_sums : nullptr, job.values + 16 * c,
                                16 * d4, std::min(12, d4 - c), j0, j1, channel_sums);
      }
    }
  }
}

// Phases A, B, C of fast_attention.hpp for one block, with one instruction set's leaf kernels.
void attention_block(const detail::LeafKernels& kernels, BlockJob& job) {
  const int ld = job.ld, d4 = job.head_dim4, rows = job.rows;
  job.key_end = job.causal ? std::min(job.first_query + rows, job.tokens) : job.tokens;
  const int end = aligned_keys(job.key_end);

  // A: scores, four rows at a time (rows past the block's end repeat row 0 into spare scratch),
  // key chunk by key chunk so a chunk of k serves every row from L1. Without causality every row's
  // keys end at N, and phase A also finds each row's max over them for phase B.
  float row_max[kMaxRows];
  std::fill(row_max, row_max + kMaxRows, kNegInf);
  float* maxima = job.causal ? nullptr : row_max;
  for (int j0 = 0; j0 < end; j0 += kKeyChunk) {
    const int j1 = std::min(j0 + kKeyChunk, end);
    for (int r = 0; r < rows; r += 4) {
      const float* q[4];
      float* s[4];
      for (int i = 0; i < 4; ++i) {
        q[i] = job.queries + (r + i < rows ? r + i : 0) * job.query_stride;
        s[i] = job.scores + (r + i) * ld;
      }
      kernels.scores_4rows[job.key_bias != nullptr][maxima != nullptr](
          q, job.keys, job.head_dim, job.scale, job.key_bias, s, j0, j1, job.tokens, maxima ? maxima + r : nullptr);
    }
  }
  // B: mask the keys past the causal diagonal and past N, then each row's softmax.
  for (int r = 0; r < rows; ++r) {
    float* s = job.scores + r * ld;
    const int limit = job.causal ? std::min(job.first_query + r + 1, job.tokens) : job.tokens;
    std::fill(s + limit, s + end, kNegInf);
    job.inv[r] = kernels.softmax_row(s, end, maxima ? maxima + r : nullptr);
  }
  // C: e v into double sums per row and channel, with the values in rows or in panels; the counted
  // rows' p = e * inv into the block's column sums, which then go into the double ones. Rows with
  // every key masked (inv 0) are skipped: their P and output stay zero.
  std::fill(job.context_sums, job.context_sums + rows * d4, 0.0);
  int active[kMaxRows], count = 0;
  for (int r = 0; r < rows; ++r)
    if (job.inv[r] != 0.0f) active[count++] = r;
  if (job.value_rows) context_in_rows(kernels, job, active, count, end);
  else context_in_panels(kernels, job, active, count, end);
  // out = (sum_j e_j v_j) * inv, the product in double.
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < job.head_dim; ++c)
      job.context[r * job.context_stride + c] = static_cast<float>(job.context_sums[r * d4 + c] * job.inv[r]);
  kernels.flush_column_sums(job.block_sums, end, job.column_sums);
}

}  // namespace

// [SECTION] Portable kernels
//
// The leaf kernels in plain C++, as loops over 8 or 16 lanes that the compiler can map onto
// SSE2, with the same sums and chunking as the vector kernels. Without FMA each product is
// rounded before it is added, so the last bits differ; the tests compare every path with the
// reference.

namespace detail {

namespace {

constexpr int kSumChunk = 64;

float exp_portable(float x) {
  using namespace fast_exp;
  // Clamped rather than branched on, so the loops calling this stay vectorisable.
  const float in_range = x >= kExpMin ? 1.0f : 0.0f;  // 0 for -inf
  x = std::max(x, kExpMin);
  // Adding 1.5 * 2^23 leaves no bits for a fraction: round to nearest, as _mm256_round_ps.
  const float n = (x * kLog2e + 12582912.0f) - 12582912.0f;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  const float p = (((((kC6 * r + kC5) * r + kC4) * r + kC3) * r + kC2) * r + 1.0f) * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n >= -126: a normal float
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n * in_range;
}

void scores_range(const float* q, const float* key_panels, int d, float scale, const float* bias, float* s, int j0,
                  int j1) {
  for (int k0 = j0; k0 < j1; k0 += 16) {
    float acc[16] = {};
    const float* k = key_panels + (k0 / 16) * 16 * d;
    for (int c = 0; c < d; ++c, k += 16) {
      const float qc = q[c];
      for (int j = 0; j < 16; ++j) acc[j] += qc * k[j];
    }
    for (int j = 0; j < 16; ++j) s[k0 + j] = bias ? acc[j] * scale + bias[k0 + j] : acc[j] * scale;
  }
}

void scores_4rows(const float* const q[4], const float* key_panels, int d, float scale, const float* bias,
                  float* const s[4], int j0, int j1, int max_end, float* row_max) {
  for (int i = 0; i < 4; ++i) {
    scores_range(q[i], key_panels, d, scale, bias, s[i], j0, j1);
    if (row_max)
      for (int j = j0; j < std::min(j1, max_end); ++j) row_max[i] = std::max(row_max[i], s[i][j]);
  }
}

void scores_1row(const float* q, const float* key_panels, int d, float scale, const float* bias, float* s, int end) {
  scores_range(q, key_panels, d, scale, bias, s, 0, end);
}

float softmax_row(float* s, int end, const float* known_max) {
  float row_max = kNegInf;
  if (known_max) row_max = *known_max;
  else
    for (int j = 0; j < end; ++j) row_max = std::max(row_max, s[j]);
  if (row_max == kNegInf) {
    std::fill(s, s + end, 0.0f);
    return 0.0f;
  }
  double sum = 0.0;
  for (int j0 = 0; j0 < end; j0 += kSumChunk) {
    const int j1 = std::min(j0 + kSumChunk, end);
    for (int j = j0; j < j1; ++j) s[j] = exp_portable(s[j] - row_max);
    float lanes[8] = {};
    for (int j = j0; j < j1; j += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += s[j + l];
    for (float lane : lanes) sum += lane;
  }
  return static_cast<float>(1.0 / sum);
}

void weighted_values(int rows, const float* const e_rows[2], const float weights[2], float* block_sums,
                     const float* values, int panel_stride, int channels, int j0, int j1, double* const sums[2]) {
  for (int r = 0; r < rows; ++r) {
    const float* e = e_rows[r];
    if (block_sums)
      for (int j = j0; j < j1; ++j) block_sums[j] += e[j] * weights[r];
    for (int c = 0; c < channels; ++c) {
      float lanes[8] = {};
      for (int j = j0; j < j1; j += 8) {
        const float* v = values + (j / 16) * panel_stride + 16 * c + j % 16;
        for (int l = 0; l < 8; ++l) lanes[l] += e[j + l] * v[l];
      }
      double chunk = 0.0;
      for (float lane : lanes) chunk += lane;
      sums[r][c] += chunk;
    }
  }
}

void flush_column_sums(float* block_sums, int end, double* column_sums) {
  for (int j = 0; j < end; ++j) {
    column_sums[j] += block_sums[j];
    block_sums[j] = 0.0f;
  }
}

void exp_array(const float* x, float* out, int count) {
  for (int i = 0; i < count; ++i) out[i] = exp_portable(x[i]);
}

// 16 channels at a time (channels is a multiple of 16).
void context_rows(int rows, const float* const e_rows[4], const float* values, int channels, int j0, int j1,
                  double* const sums[4]) {
  for (int r = 0; r < rows; ++r)
    for (int c0 = 0; c0 < channels; c0 += 16) {
      float acc[16] = {};
      for (int j = j0; j < j1; ++j) {
        const float e = e_rows[r][j];
        const float* v = values + static_cast<int64_t>(j) * channels + c0;
        for (int c = 0; c < 16; ++c) acc[c] += e * v[c];
      }
      for (int c = 0; c < 16; ++c) sums[r][c0 + c] += acc[c];
    }
}

void add_column_sums(int rows, const float* const e_rows[4], const float weights[4], float* block_sums, int j0,
                     int j1) {
  for (int j = j0; j < j1; ++j)
    for (int r = 0; r < rows; ++r) block_sums[j] += e_rows[r][j] * weights[r];
}

}  // namespace

const LeafKernels kPortableKernels = {{{scores_4rows, scores_4rows}, {scores_4rows, scores_4rows}},
                                      {scores_1row, scores_1row},
                                      softmax_row,
                                      weighted_values,
                                      flush_column_sums,
                                      exp_array,
                                      context_rows,
                                      add_column_sums};

const KernelTable<LeafKernels> kLeafKernels{&kPortableKernels, VITLENS_X86_TABLE(kAvx2Kernels),
                                            VITLENS_X86_TABLE(kAvx512Kernels)};

}  // namespace detail

// [SECTION] Multi-head driver

namespace {

// Query rows per block: the block's scores (rows, ld) should stay in the core's L2 cache, and
// phase A reuses each loaded key vector for 4 rows.
constexpr int kBlockFloats = 128 * 1024;  // 512 KB
// Row blocks are dealt to kRowGroups groups per head (block b to group b % kRowGroups); a group's
// column sums have their own buffer, and the groups are added in order at the end, so the
// received sums are the same whichever thread ran which group.
constexpr int kRowGroups = 8;
// Below this many scores (N * N * H) per thread, one thread. The helpers come from the worker pool
// (parallel.hpp), already started and usually still spinning from the product before; when each
// call started its own threads this was 1 << 18, so ViT-S/16 at 224 px (197 tokens, 6 heads: 233 k
// scores) ran its attention on one of two cores.
constexpr double kMinScoresPerThread = 1 << 14;
constexpr auto kProgressInterval = std::chrono::milliseconds(20);

int rows_per_block(int ld) { return std::clamp(kBlockFloats / ld / 4 * 4, 4, kMaxRows); }

// A 64-byte aligned float buffer (whole cache lines for the kernels' vector loads), zeroed.
class AlignedFloats {
 public:
  explicit AlignedFloats(size_t count) : storage_(count + 16, 0.0f) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - address % 64) % 64) / sizeof(float);
  }
  AlignedFloats(AlignedFloats&&) = default;  // the heap buffer moves with the vector, data_ stays valid
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() { return data_; }

 private:
  std::vector<float> storage_;
  float* data_ = nullptr;
};

// A (tokens, H * d) strided matrix to panels: head h at dst + h * channels * ld, token i's channel
// c at (i / 16) * 16 * channels + 16 * c + i % 16. channels >= d; dst is zero where nothing lands.
void pack_panels(const float* src, int stride, int tokens, int heads, int d, int channels, int ld, float* dst) {
  for (int i = 0; i < tokens; ++i) {
    const float* row = src + static_cast<size_t>(i) * stride;
    for (int h = 0; h < heads; ++h) {
      float* panel = dst + static_cast<size_t>(h) * channels * ld + static_cast<size_t>(i / 16) * 16 * channels;
      panel += i % 16;
      for (int c = 0; c < d; ++c) panel[16 * c] = row[h * d + c];
    }
  }
}
// A (tokens, H * d) strided matrix to rows: head h's token i at dst + (h * ld + i) * channels, d
// values; dst is zero where nothing lands (channels >= d, tokens past N).
void pack_rows(const float* src, int stride, int tokens, int heads, int d, int channels, int ld, float* dst) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < tokens; ++i)
      std::copy_n(src + static_cast<size_t>(i) * stride + h * d, d,
                  dst + (static_cast<size_t>(h) * ld + i) * channels);
}

}  // namespace

MatRM key_panels(const float* keys, int stride, int tokens, int heads, int head_dim) {
  MatRM out = MatRM::Zero(heads, static_cast<Eigen::Index>(aligned_keys(tokens)) * head_dim);
  pack_panels(keys, stride, tokens, heads, head_dim, head_dim, aligned_keys(tokens), out.data());
  return out;
}

namespace {

// The key mask as a score bias (ld): 0 allowed, -inf masked and for the padding columns past N.
void fill_key_bias(const std::vector<uint8_t>& key_allowed, int ld, std::vector<float>& bias) {
  bias.assign(static_cast<size_t>(ld), kNegInf);
  for (size_t j = 0; j < key_allowed.size(); ++j)
    if (key_allowed[j]) bias[j] = 0.0f;
}

// Every head's keys in panels, so a vector load takes consecutive tokens of one channel, its values
// in panels or in rows, and the key bias: what every block job reads.
struct HeadPanels {
  // value_rows: the values in rows (phase C by context_rows), d4 = d rounded up to 16; else in
  // panels, d4 = d rounded up to 4.
  HeadPanels(const AttentionInputs& in, int ld, int d4, bool value_rows)
      : keys(static_cast<size_t>(in.heads) * in.head_dim * ld), values(static_cast<size_t>(in.heads) * d4 * ld) {
    pack_panels(in.keys, in.key_stride, in.tokens, in.heads, in.head_dim, in.head_dim, ld, keys.data());
    if (value_rows) pack_rows(in.values, in.value_stride, in.tokens, in.heads, in.head_dim, d4, ld, values.data());
    else pack_panels(in.values, in.value_stride, in.tokens, in.heads, in.head_dim, d4, ld, values.data());
    if (in.mask && !in.mask->key_allowed.empty()) fill_key_bias(in.mask->key_allowed, ld, key_bias);
  }
  AlignedFloats keys, values;
  std::vector<float> key_bias;  // empty: every key < N allowed
};

struct BlockScratch {
  AlignedFloats scores, block_sums;
  std::vector<double> context_sums;
};

// Rows [r0, r0 + block_rows) of head h as one BlockJob, its sums into column_sums.
BlockJob block_job(const AttentionInputs& in, const AttentionOutputs& out, HeadPanels& panels, int d4, bool value_rows,
                   int h, int r0, int block_rows, BlockScratch& scratch, double* column_sums) {
  const int n = in.tokens, d = in.head_dim, ld = aligned_keys(n);
  BlockJob job{};
  job.keys = panels.keys.data() + static_cast<size_t>(h) * d * ld;
  job.values = panels.values.data() + static_cast<size_t>(h) * d4 * ld;
  job.value_rows = value_rows;
  job.ld = ld, job.head_dim = d, job.head_dim4 = d4;
  job.key_bias = panels.key_bias.empty() ? nullptr : panels.key_bias.data();
  job.scale = in.scale;
  job.tokens = n;
  job.causal = in.mask && in.mask->causal;
  job.queries = in.queries + static_cast<size_t>(r0) * in.query_stride + h * d;
  job.query_stride = in.query_stride;
  job.rows = std::min(block_rows, n - r0);
  job.first_query = r0;
  job.counts = in.counts_as_query ? in.counts_as_query + r0 : nullptr;
  job.scores = scratch.scores.data();
  job.block_sums = scratch.block_sums.data();
  job.context_sums = scratch.context_sums.data();
  job.context = out.context + static_cast<size_t>(r0) * out.context_stride + h * d;
  job.context_stride = out.context_stride;
  job.column_sums = column_sums;
  return job;
}

// The rows of a finished block the caller keeps (head h's first row, or all of P): P = e * inv
// over [0, key_end), zero after it (masked by causality).
void keep_rows(const BlockJob& job, const AttentionOutputs& out, int h) {
  const int n = job.tokens, r0 = job.first_query;
  auto copy_row = [&](int r, float* dst) {
    const float* e = job.scores + static_cast<size_t>(r) * job.ld;
    for (int j = 0; j < job.key_end; ++j) dst[j] = e[j] * job.inv[r];
    std::fill(dst + job.key_end, dst + n, 0.0f);
  };
  if (r0 == 0 && out.first_rows) copy_row(0, out.first_rows + static_cast<size_t>(h) * n);
  if (out.probs && out.probs[h])
    for (int r = 0; r < job.rows; ++r) copy_row(r, out.probs[h] + static_cast<size_t>(r0 + r) * n);
}

}  // namespace

namespace detail {

void check_attention_inputs(const AttentionInputs& in, const AttentionOutputs& out) {
  const int n = in.tokens, heads = in.heads, d = in.head_dim;
  if (n < 1 || heads < 1 || d < 1)
    throw Error("multi_head_attention: tokens, heads and head_dim must be positive, got " + std::to_string(n) +
                ", " + std::to_string(heads) + ", " + std::to_string(d));
  if (!in.queries || !in.keys || !in.values || !out.context || !out.column_sums)
    throw Error("multi_head_attention: an input or output buffer is missing");
  if (in.mask && !in.mask->key_allowed.empty() && in.mask->key_allowed.size() != static_cast<size_t>(n))
    throw Error("multi_head_attention: the key mask has " + std::to_string(in.mask->key_allowed.size()) +
                " entries for " + std::to_string(n) + " tokens");
}

bool run_row_blocks(const AttentionInputs& in, const AttentionOutputs& out, int block_rows, int threads,
                    const std::function<bool(float)>& progress, const std::function<void(int)>& prepare,
                    const std::function<void(int, int, int, double*)>& block) {
  const int n = in.tokens, heads = in.heads, ld = aligned_keys(n);
  const int blocks = (n + block_rows - 1) / block_rows;
  const int groups = std::min(kRowGroups, blocks);
  const int units = heads * groups;  // (head, row group) pairs, each with its own column sums
  std::vector<double> group_sums(static_cast<size_t>(units) * ld, 0.0);

  int workers = resolve_threads(threads);
  workers = std::clamp(workers, 1, units);
  if (static_cast<double>(n) * n * heads < kMinScoresPerThread * workers) workers = 1;
  prepare(workers);

  std::atomic<int> next_unit{0};
  std::atomic<long> blocks_done{0};
  std::atomic<bool> stop{false};
  const double total_blocks = static_cast<double>(blocks) * heads;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> reported{false};  // the caller has called progress
  auto work = [&](int slot) {
    const bool reporter = progress && std::this_thread::get_id() == caller;
    auto last_report = std::chrono::steady_clock::now() - kProgressInterval;  // first report after one block
    for (int unit = next_unit++; unit < units && !stop; unit = next_unit++) {
      const int h = unit / groups, group = unit % groups;
      for (int b = group; b < blocks && !stop; b += groups) {
        block(slot, h, b * block_rows, group_sums.data() + static_cast<size_t>(unit) * ld);
        const long done = ++blocks_done;
        if (!reporter) continue;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_report >= kProgressInterval) {
          last_report = now;
          reported = true;
          if (!progress(static_cast<float>(done / total_blocks))) stop = true;
        }
      }
    }
  };

  // One task per scratch slot, each taking units until none are left; run_tasks rethrows what a
  // task threw (the progress callback) once the others have stopped at their next block.
  run_tasks(workers, workers, [&](int slot) {
    try {
      work(slot);
    } catch (...) {
      stop = true;
      throw;
    }
  });
  // Progress is reported on the calling thread only; if it ran no block (the pool's workers took
  // every unit first), report once now, so that a caller cancelling at its first report still can.
  if (progress && !stop && !reported && !progress(1.0f)) stop = true;
  if (stop) return false;

  // The row groups' received sums added in group order.
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int group = 0; group < groups; ++group)
        sum += group_sums[static_cast<size_t>(h * groups + group) * ld + j];
      out.column_sums[static_cast<size_t>(h) * n + j] = static_cast<float>(sum);
    }
  return true;
}

}  // namespace detail

bool multi_head_attention(const AttentionInputs& in, const AttentionOutputs& out, int threads,
                          const std::function<bool(float)>& progress) {
  detail::check_attention_inputs(in, out);
  const detail::LeafKernels& kernels = active_kernels();
  const bool value_rows = kernels.context_rows && in.head_dim >= detail::kRowLayoutMinDim;
  const int ld = aligned_keys(in.tokens), d4 = value_rows ? (in.head_dim + 15) / 16 * 16 : (in.head_dim + 3) / 4 * 4;
  HeadPanels panels(in, ld, d4, value_rows);
  const int block_rows = rows_per_block(ld);
  std::vector<BlockScratch> scratch;
  auto prepare = [&](int slots) {
    for (int w = 0; w < slots; ++w)
      scratch.push_back({AlignedFloats(static_cast<size_t>(block_rows + 3) / 4 * 4 * ld),
                         AlignedFloats(static_cast<size_t>(ld)), std::vector<double>(static_cast<size_t>(block_rows) * d4)});
  };
  auto block = [&](int slot, int h, int r0, double* column_sums) {
    BlockJob job =
        block_job(in, out, panels, d4, value_rows, h, r0, block_rows, scratch[static_cast<size_t>(slot)], column_sums);
    attention_block(kernels, job);
    keep_rows(job, out, h);
  };
  return detail::run_row_blocks(in, out, block_rows, threads, progress, prepare, block);
}

// [SECTION] One query row

void attention_row_fast(const float* q, const float* panels, int tokens, int head_dim, float scale,
                        const KeyMask& mask, int query, float* out) {
  const int ld = aligned_keys(tokens);
  const bool key_mask = !mask.key_allowed.empty();
  if (key_mask && mask.key_allowed.size() != static_cast<size_t>(tokens))
    throw Error("attention_row: the key mask has " + std::to_string(mask.key_allowed.size()) + " entries for " +
                std::to_string(tokens) + " tokens");
  thread_local std::vector<float> scores, key_bias;
  scores.resize(static_cast<size_t>(ld));
  if (key_mask) fill_key_bias(mask.key_allowed, ld, key_bias);
  // Phases A and B as attention_block runs them for this row, then p = e * inv: the same numbers.
  const detail::LeafKernels& kernels = active_kernels();
  const int limit = mask.causal ? std::min(query + 1, tokens) : tokens;
  const int end = aligned_keys(limit);
  kernels.scores_1row[key_mask](q, panels, head_dim, scale, key_mask ? key_bias.data() : nullptr, scores.data(), end);
  std::fill(scores.data() + limit, scores.data() + end, kNegInf);
  const float inv = kernels.softmax_row(scores.data(), end, nullptr);
  for (int j = 0; j < limit; ++j) out[j] = scores[static_cast<size_t>(j)] * inv;
  std::fill(out + limit, out + tokens, 0.0f);
}

}  // namespace vitlens
