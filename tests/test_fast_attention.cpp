// The fast attention kernels (fast_attention.hpp) against the plain reference (attention.hpp), on
// every instruction set this CPU runs: random inputs, large logits, ties, causal and key masks,
// odd sizes, one allowed key, no allowed key; the same numbers for any thread count; the single
// row path; the vectorised exp; forward() on this path without keep_probs.
//
// Both float implementations are also compared with an exact oracle: the same float q, k, v
// with every score, softmax and sum in double. Relative differences, largest over all entries:
//   probabilities  |p - p_exact| / (p_exact + 1e-30)
//   context        |out - sum_j p_exact_j v_j| / sum_j p_exact_j |v_j|   (the row's own scale)
//   received sums  |s - sum_i p_exact_ij| / (sum_i p_exact_ij + 1e-30) over the counted rows (the
//                  reference's: its weights summed in double)
// A score s carries a float rounding of about |s| * 6e-8 whichever order its d products are
// summed in, and p inherits it, so the fast path and the reference differ by ~1e-6 for scores of
// a few units. The tests require (1) fast vs reference within a stated tolerance, (2) the fast
// path no less accurate than the reference against the exact oracle (at most 2x its error plus
// 2e-7), and (3) masked weights exactly 0, rows with no allowed key exactly 0 with a 0 output.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "core/model/attention.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/model/vit.hpp"

using namespace vitlens;

namespace {

using test::IsaGuard;

// The instruction sets this CPU runs (and a skip line for each it lacks): test_support.hpp.
std::vector<KernelIsa> runnable_isas() { return test::isas_here(); }

// Their tables of leaf kernels, called directly (not through kernel_isa()).
std::vector<std::pair<const char*, const detail::LeafKernels*>> leaf_tables_here() {
  std::vector<std::pair<const char*, const detail::LeafKernels*>> tables;
  for (KernelIsa isa : runnable_isas()) tables.push_back({kernel_isa_id(isa), &detail::kLeafKernels.get(isa)});
  return tables;
}

// H heads of N tokens laid out as timm's qkv: (N, 3 H d), columns [Q heads | K heads | V heads].
struct Heads {
  int n = 0, heads = 0, d = 0;
  MatRM qkv;
  MatRM q(int h) const { return qkv.middleCols(h * d, d); }
  MatRM k(int h) const { return qkv.middleCols(heads * d + h * d, d); }
  MatRM v(int h) const { return qkv.middleCols(2 * heads * d + h * d, d); }
};

// N(0, 1) entries; the queries multiplied by q_gain (large logits).
Heads random_heads(int n, int heads, int d, unsigned seed, float q_gain = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Heads x{n, heads, d, MatRM(n, 3 * heads * d)};
  for (Eigen::Index i = 0; i < x.qkv.size(); ++i) x.qkv.data()[i] = normal(rng);
  x.qkv.leftCols(heads * d) *= q_gain;
  return x;
}

struct FastResult {
  bool finished = false;
  MatRM context, column_sums, first_rows;
  std::vector<MatRM> probs;
};

FastResult run_fast(const Heads& x, float scale, const KeyMask& mask, const std::vector<uint8_t>& counts,
                    int threads = 0) {
  const int hd = x.heads * x.d;
  FastResult r;
  r.context = MatRM::Constant(x.n, hd, std::numeric_limits<float>::quiet_NaN());  // every entry must be written
  r.column_sums = MatRM::Constant(x.heads, x.n, std::numeric_limits<float>::quiet_NaN());
  r.first_rows = MatRM::Constant(x.heads, x.n, std::numeric_limits<float>::quiet_NaN());
  r.probs.assign(static_cast<size_t>(x.heads), MatRM::Constant(x.n, x.n, std::numeric_limits<float>::quiet_NaN()));
  std::vector<float*> probs;
  for (MatRM& p : r.probs) probs.push_back(p.data());
  AttentionInputs in;
  in.tokens = x.n, in.heads = x.heads, in.head_dim = x.d;
  in.queries = x.qkv.data(), in.keys = x.qkv.data() + hd, in.values = x.qkv.data() + 2 * hd;
  in.query_stride = in.key_stride = in.value_stride = 3 * hd;
  in.scale = scale;
  in.mask = &mask;
  in.counts_as_query = counts.empty() ? nullptr : counts.data();
  AttentionOutputs out;
  out.context = r.context.data(), out.context_stride = hd;
  out.column_sums = r.column_sums.data();
  out.first_rows = r.first_rows.data();
  out.probs = probs.data();
  r.finished = multi_head_attention(in, out, threads);
  return r;
}

struct Differences {
  double probs_vs_reference = 0.0;                  // fast against the float reference
  double probs = 0.0, context = 0.0, sums = 0.0;    // fast against the exact oracle
  double reference_probs = 0.0, reference_context = 0.0, reference_sums = 0.0;  // the reference against it
  bool masked_nonzero = false, not_finite = false, first_row_differs = false;
};

Differences compare(const Heads& x, float scale, const KeyMask& mask, const std::vector<uint8_t>& counts,
                    const FastResult& fast) {
  Differences worst;
  auto relative = [](double got, double exact, double magnitude) {
    return std::abs(got - exact) / (magnitude + 1e-30);
  };
  for (int h = 0; h < x.heads; ++h) {
    const MatRM q = x.q(h), k = x.k(h), v = x.v(h);
    const AttentionResult ref = scaled_dot_product_attention(q, k, v, mask, scale);
    const MatRM& p = fast.probs[static_cast<size_t>(h)];
    std::vector<double> exact_sums(static_cast<size_t>(x.n), 0.0), reference_sums(exact_sums), exact(exact_sums);
    for (int i = 0; i < x.n; ++i) {
      // The oracle row in double: scores, max over allowed keys, exp, normalisation.
      double row_max = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < x.n; ++j) {
        double dot = 0.0;
        for (int c = 0; c < x.d; ++c) dot += static_cast<double>(q(i, c)) * k(j, c);
        exact[static_cast<size_t>(j)] = mask.allows(i, j) ? dot * scale : -std::numeric_limits<double>::infinity();
        row_max = std::max(row_max, exact[static_cast<size_t>(j)]);
      }
      double total = 0.0;
      for (double& e : exact) {
        e = row_max == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(e - row_max);
        total += e;
      }
      for (double& e : exact) e = total > 0.0 ? e / total : 0.0;
      for (int j = 0; j < x.n; ++j) {
        const double pe = exact[static_cast<size_t>(j)];
        if (!std::isfinite(p(i, j))) worst.not_finite = true;
        if (!mask.allows(i, j) && p(i, j) != 0.0f) worst.masked_nonzero = true;
        const double pr = ref.weights(i, j);
        worst.probs_vs_reference = std::max(worst.probs_vs_reference, relative(p(i, j), pr, pr));
        worst.probs = std::max(worst.probs, relative(p(i, j), pe, pe));
        worst.reference_probs = std::max(worst.reference_probs, relative(ref.weights(i, j), pe, pe));
        if (counts.empty() || counts[static_cast<size_t>(i)]) {
          exact_sums[static_cast<size_t>(j)] += pe;
          reference_sums[static_cast<size_t>(j)] += ref.weights(i, j);
        }
      }
      for (int c = 0; c < x.d; ++c) {
        double out = 0.0, magnitude = 0.0;
        for (int j = 0; j < x.n; ++j) {
          out += exact[static_cast<size_t>(j)] * v(j, c);
          magnitude += exact[static_cast<size_t>(j)] * std::abs(v(j, c));
        }
        const float got = fast.context(i, h * x.d + c);
        if (!std::isfinite(got)) worst.not_finite = true;
        if (total == 0.0 && got != 0.0f) worst.masked_nonzero = true;
        worst.context = std::max(worst.context, relative(got, out, magnitude));
        worst.reference_context = std::max(worst.reference_context, relative(ref.context(i, c), out, magnitude));
      }
    }
    for (int j = 0; j < x.n; ++j) {
      const float got = fast.column_sums(h, j);
      if (!std::isfinite(got)) worst.not_finite = true;
      const double exact_sum = exact_sums[static_cast<size_t>(j)];
      worst.sums = std::max(worst.sums, relative(got, exact_sum, exact_sum));
      const double reference_sum = reference_sums[static_cast<size_t>(j)];
      worst.reference_sums = std::max(worst.reference_sums, relative(reference_sum, exact_sum, exact_sum));
      if (fast.first_rows(h, j) != p(0, j)) worst.first_row_differs = true;  // P's row 0, bit for bit
    }
  }
  return worst;
}

// The checks every case makes; `tolerance` bounds fast vs the reference on probabilities.
void check_differences(const Differences& d, double tolerance) {
  INFO("probs vs reference " << d.probs_vs_reference << " (tolerance " << tolerance << "); vs exact: probs "
                             << d.probs << " (reference " << d.reference_probs << "), context " << d.context
                             << " (reference " << d.reference_context << "), received sums " << d.sums
                             << " (reference " << d.reference_sums << ")");
  CHECK_FALSE(d.not_finite);
  CHECK_FALSE(d.masked_nonzero);
  CHECK_FALSE(d.first_row_differs);
  CHECK(d.probs_vs_reference <= tolerance);
  CHECK(d.probs <= 2.0 * d.reference_probs + 2e-7);
  CHECK(d.context <= 2.0 * d.reference_context + 2e-7);
  CHECK(d.sums <= 2.0 * d.reference_sums + 2e-7);
}

KeyMask random_key_mask(int n, unsigned seed, double keep) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution allowed(keep);
  KeyMask mask;
  mask.key_allowed.resize(static_cast<size_t>(n));
  for (uint8_t& a : mask.key_allowed) a = allowed(rng) ? 1 : 0;
  return mask;
}

}  // namespace


TEST_CASE("fast attention: random inputs, block and chunk edges, odd head sizes", "[fast_attention]") {
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    // (N, H, d) around the edges of 16-key vectors, 4- and 16-row blocks and 512-key chunks, and
    // last blocks of 5, 7, 11 and 13 rows (a last group of 4 rows with 3, 1, 1 and 3 spare ones).
    for (auto [n, heads, d] : std::vector<std::array<int, 3>>{{1, 1, 12}, {2, 4, 12}, {15, 1, 12}, {16, 2, 12},
                                                                {17, 4, 12}, {21, 2, 12}, {23, 1, 12}, {27, 2, 12},
                                                                {29, 1, 7}, {63, 1, 5}, {65, 2, 8}, {257, 4, 12},
                                                                {530, 1, 16}, {1025, 2, 12}, {700, 1, 64},
                                                                // phase C in rows: 16-channel padding, 64-key
                                                                // chunks, groups of 1 to 4 rows
                                                                {1, 1, 64}, {5, 1, 48}, {33, 3, 32}, {197, 6, 64},
                                                                {131, 2, 40}, {70, 1, 80}}) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << " N=" << n << " H=" << heads << " d=" << d) {
        const Heads x = random_heads(n, heads, d, 100 + static_cast<unsigned>(n));
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        const FastResult fast = run_fast(x, scale, KeyMask{}, {});
        REQUIRE(fast.finished);
        const Differences diff = compare(x, scale, KeyMask{}, {}, fast);
        WARN(kernel_isa_name(isa) << " N=" << n << " H=" << heads << " d=" << d << ": probs vs reference "
                                  << diff.probs_vs_reference << "; vs exact: probs " << diff.probs << " (reference "
                                  << diff.reference_probs << "), context " << diff.context << " (reference "
                                  << diff.reference_context << "), received " << diff.sums);
        // Scores here reach about 5: a float rounding of ~5 * 6e-8 on each side of the comparison.
        check_differences(diff, 4e-6);
      }
    }
  }
}

TEST_CASE("fast attention: large logits", "[fast_attention]") {
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    for (int n : {64, 300, 1025}) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << " N=" << n) {
        // Queries x25: scores of about +-80 (largest about 100); exp(s - max) spans the whole float range.
        const Heads x = random_heads(n, 2, 12, 7 + static_cast<unsigned>(n), 25.0f);
        const float scale = 1.0f / std::sqrt(12.0f);
        const FastResult fast = run_fast(x, scale, KeyMask{}, {});
        const Differences diff = compare(x, scale, KeyMask{}, {}, fast);
        WARN(kernel_isa_name(isa) << " N=" << n << " large logits: probs vs reference " << diff.probs_vs_reference
                                  << "; vs exact: probs " << diff.probs << " (reference " << diff.reference_probs
                                  << "), context " << diff.context << ", received " << diff.sums);
        // The rounding of a score of 100 is ~6e-6 on each side, and p inherits it relatively.
        check_differences(diff, 1e-4);
      }
    }
  }
}

TEST_CASE("fast attention: ties give equal weights", "[fast_attention]") {
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      const int n = 100;
      Heads x = random_heads(n, 1, 12, 3);
      // Every key the same: each row is uniform, 1/N to a float rounding, and the output the mean of v.
      for (int j = 1; j < n; ++j) x.qkv.block(j, 12, 1, 12) = x.qkv.block(0, 12, 1, 12);
      FastResult fast = run_fast(x, 0.5f, KeyMask{}, {});
      CHECK((fast.probs[0].array() - 1.0f / n).abs().maxCoeff() <= 2e-7f / n);
      check_differences(compare(x, 0.5f, KeyMask{}, {}, fast), 4e-6);
      // Two keys equal to each other and above the rest: bit-identical weights on both.
      x = random_heads(n, 1, 12, 4);
      x.qkv.block(40, 12, 1, 12) = x.qkv.block(70, 12, 1, 12) = 2.0f * x.qkv.block(0, 0, 1, 12);
      fast = run_fast(x, 0.5f, KeyMask{}, {});
      CHECK(fast.probs[0].col(40) == fast.probs[0].col(70));
      const Differences diff = compare(x, 0.5f, KeyMask{}, {}, fast);
      check_differences(diff, 4e-6);
      WARN(kernel_isa_name(isa) << " ties: probs vs reference " << diff.probs_vs_reference << ", vs exact "
                                << diff.probs);
    }
  }
}

TEST_CASE("fast attention: causal and key masks, one allowed key, no allowed key", "[fast_attention][mask]") {
  IsaGuard guard;
  // Heads of 12 channels (phase C in panels) and of 64 (in rows, where the kernels have it).
  const std::vector<std::array<int, 2>> cases = {{1, 12}, {5, 12}, {17, 12}, {130, 12}, {1030, 12},
                                                 {1, 64}, {5, 64}, {17, 64}, {130, 64}};
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    for (auto [n, d] : cases) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << " N=" << n << " d=" << d) {
        const Heads x = random_heads(n, 2, d, 50 + static_cast<unsigned>(n));
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        std::vector<uint8_t> counts(static_cast<size_t>(n), 1);
        for (int i = 0; i < n; i += 3) counts[static_cast<size_t>(i)] = 0;  // rows left out of the received sums

        KeyMask causal;
        causal.causal = true;
        KeyMask keys = random_key_mask(n, 9, 0.7);
        keys.key_allowed[0] = 1;
        KeyMask both = keys;
        both.causal = true;
        both.key_allowed[0] = 0;  // row 0 (and every row before the first allowed key) has no allowed key
        KeyMask one_key;
        one_key.key_allowed.assign(static_cast<size_t>(n), 0);
        one_key.key_allowed[static_cast<size_t>(n / 2)] = 1;
        KeyMask none;
        none.key_allowed.assign(static_cast<size_t>(n), 0);
        double worst_vs_reference = 0.0, worst_vs_exact = 0.0;
        const std::vector<std::pair<const char*, KeyMask>> masks = {
            {"causal", causal}, {"key mask", keys}, {"causal + key mask", both}, {"one key", one_key}, {"no key", none}};
        for (const auto& [name, mask] : masks) {
          INFO(kernel_isa_name(isa) << " N=" << n << " " << name);
          const FastResult fast = run_fast(x, scale, mask, counts);
          REQUIRE(fast.finished);
          const Differences diff = compare(x, scale, mask, counts, fast);
          check_differences(diff, 4e-6);
          worst_vs_reference = std::max(worst_vs_reference, diff.probs_vs_reference);
          worst_vs_exact = std::max({worst_vs_exact, diff.probs, diff.context, diff.sums});
          if (std::string(name) == "one key") {
            // Weight exactly 1 on the one key, so each output is that key's value exactly.
            CHECK(fast.probs[1].col(n / 2).isOnes(0.0f));
            CHECK(fast.context.middleCols(d, d).rowwise().operator-(x.v(1).row(n / 2)).isZero(0.0f));
          }
          if (std::string(name) == "no key") {
            CHECK(fast.probs[0].isZero(0.0f));
            CHECK(fast.context.isZero(0.0f));
            CHECK(fast.column_sums.isZero(0.0f));
          }
        }
        WARN(kernel_isa_name(isa) << " N=" << n << " d=" << d << " masks: largest probs vs reference "
                                  << worst_vs_reference
                                  << ", largest vs exact (probs, context, received) " << worst_vs_exact);
      }
    }
  }
}

TEST_CASE("fast attention: the same numbers for any thread count", "[fast_attention][threads]") {
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    for (auto [n, d] : std::vector<std::array<int, 2>>{{1500, 12}, {600, 64}}) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << " N=" << n << " d=" << d) {
        const Heads x = random_heads(n, 4, d, 11);
        KeyMask mask = random_key_mask(n, 12, 0.8);
        mask.causal = true;
        const std::vector<uint8_t> counts(static_cast<size_t>(n), 1);
        const FastResult one = run_fast(x, 0.3f, mask, counts, 1);
        for (int threads : {2, 3, 8}) {
          INFO(threads << " threads");
          const FastResult many = run_fast(x, 0.3f, mask, counts, threads);
          CHECK(many.context == one.context);
          CHECK(many.column_sums == one.column_sums);
          CHECK(many.first_rows == one.first_rows);
          for (int h = 0; h < 4; ++h) CHECK(many.probs[static_cast<size_t>(h)] == one.probs[static_cast<size_t>(h)]);
        }
      }
    }
  }
}

TEST_CASE("fast attention: phase C on a pair of rows gives the bits of each row alone", "[fast_attention][pair]") {
  // The leaf kernel directly: rows = 2 against two calls with rows = 1, for every channel count the
  // blocks pass (4, 8, 12), with and without the column sums, keys [16, 16 + 480) of 32 panels.
  const std::vector<std::pair<const char*, const detail::LeafKernels*>> tables = leaf_tables_here();
  constexpr int kD4 = 12, kPanels = 32, kStride = 16 * kD4, kLd = 16 * kPanels, kJ0 = 16, kJ1 = kJ0 + 480;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f), signed_unit(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(kPanels) * kStride), e(2 * kLd);
  for (float& v : values) v = signed_unit(rng);
  for (float& x : e) x = unit(rng);
  const float weights[2] = {0.37f, 0.61f};
  for (const auto& [name, kernels] : tables)
    for (int channels : {4, 8, 12})
      for (bool columns : {false, true}) {
        INFO(name << ", " << channels << " channels, column sums " << columns);
        std::vector<double> pair_sums(2 * kD4), alone_sums(2 * kD4);
        std::vector<float> pair_cols(kLd), alone_cols(kLd);
        for (size_t i = 0; i < pair_sums.size(); ++i) pair_sums[i] = alone_sums[i] = 0.25 * static_cast<double>(i);
        for (int j = 0; j < kLd; ++j) pair_cols[j] = alone_cols[j] = 0.01f * static_cast<float>(j % 7);
        const float* rows[2] = {e.data(), e.data() + kLd};
        double* pair_out[2] = {pair_sums.data(), pair_sums.data() + kD4};
        kernels->weighted_values(2, rows, weights, columns ? pair_cols.data() : nullptr, values.data(), kStride,
                                 channels, kJ0, kJ1, pair_out);
        for (int r = 0; r < 2; ++r) {
          const float* row[2] = {rows[r], nullptr};
          const float weight[2] = {weights[r], 0.0f};
          double* out[2] = {alone_sums.data() + r * kD4, nullptr};
          kernels->weighted_values(1, row, weight, columns ? alone_cols.data() : nullptr, values.data(), kStride,
                                   channels, kJ0, kJ1, out);
        }
        CHECK(pair_sums == alone_sums);
        CHECK(pair_cols == alone_cols);
        // And the sums are the products: within float rounding of a double loop.
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < channels; ++c) {
            double exact = 0.25 * (r * kD4 + c);
            for (int j = kJ0; j < kJ1; ++j)
              exact += static_cast<double>(e[static_cast<size_t>(r * kLd + j)]) *
                       values[static_cast<size_t>((j / 16) * kStride + 16 * c + j % 16)];
            CHECK(std::abs(pair_sums[static_cast<size_t>(r * kD4 + c)] - exact) < 1e-3);
          }
        if (columns) CHECK(pair_cols[kJ0] != 0.01f * static_cast<float>(kJ0 % 7));  // row 0 was added
      }
}

TEST_CASE("fast attention: phase C in rows, any group of rows, against double sums", "[fast_attention][pair]") {
  // The row-layout kernels directly, where a table has them: 1 to 4 rows against each row alone
  // (the same bits), every channel count a multiple of 16 up to 80, keys [16, 16 + 64) of 96 (one
  // chunk, not from key 0), sums that start non-zero; and the column sums of 1 to 4 rows against
  // the rows added one call at a time.
  constexpr int kKeys = 96, kJ0 = 16, kJ1 = kJ0 + detail::kRowChunk, kMaxChannels = 80;
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f), signed_unit(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(kKeys) * kMaxChannels), e(4 * kKeys);
  for (float& v : values) v = signed_unit(rng);
  for (float& x : e) x = unit(rng);
  const float weights[4] = {0.37f, 0.61f, 0.0f, 0.93f};
  int tables_with_rows = 0;
  for (const auto& [name, kernels] : leaf_tables_here()) {
    if (!kernels->context_rows) {
      WARN(name << ": no phase C in rows (the panel kernels run it)");
      continue;
    }
    ++tables_with_rows;
    for (int channels = 16; channels <= kMaxChannels; channels += 16)
      for (int rows = 1; rows <= 4; ++rows) {
        INFO(name << ", " << rows << " rows, " << channels << " channels");
        const float* e_rows[4] = {};
        for (int r = 0; r < rows; ++r) e_rows[r] = e.data() + r * kKeys;
        auto start = [&](std::vector<double>& sums) {
          sums.resize(static_cast<size_t>(4 * channels));
          for (size_t i = 0; i < sums.size(); ++i) sums[i] = 0.25 * static_cast<double>(i);
        };
        std::vector<double> together, alone;
        start(together), start(alone);
        double* out[4] = {};
        for (int r = 0; r < rows; ++r) out[r] = together.data() + r * channels;
        kernels->context_rows(rows, e_rows, values.data(), channels, kJ0, kJ1, out);
        for (int r = 0; r < rows; ++r) {
          const float* row[4] = {e_rows[r]};
          double* one[4] = {alone.data() + r * channels};
          kernels->context_rows(1, row, values.data(), channels, kJ0, kJ1, one);
        }
        CHECK(together == alone);
        // Each sum: 64 float products and additions (|e v| < 1), then one double addition.
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < channels; ++c) {
            double exact = 0.25 * (r * channels + c);
            if (r < rows)
              for (int j = kJ0; j < kJ1; ++j)
                exact += static_cast<double>(e_rows[r][j]) * values[static_cast<size_t>(j * channels + c)];
            CHECK(std::abs(together[static_cast<size_t>(r * channels + c)] - exact) < 64 * 64 * 0x1p-24);
          }

        std::vector<float> columns(kKeys, 0.5f), one_by_one(kKeys, 0.5f);
        kernels->add_column_sums(rows, e_rows, weights, columns.data(), kJ0, kJ1);
        for (int r = 0; r < rows; ++r) {
          const float* row[4] = {e_rows[r]};
          const float weight[4] = {weights[r]};
          kernels->add_column_sums(1, row, weight, one_by_one.data(), kJ0, kJ1);
        }
        CHECK(columns == one_by_one);
        for (int j = 0; j < kKeys; ++j) {
          double exact = 0.5;
          if (j >= kJ0 && j < kJ1)
            for (int r = 0; r < rows; ++r) exact += static_cast<double>(e_rows[r][j]) * weights[r];
          CHECK(std::abs(columns[static_cast<size_t>(j)] - exact) < 8 * 0x1p-24 * 4);
        }
      }
  }
  CHECK(tables_with_rows >= 1);  // the portable kernels have them
}

TEST_CASE("fast attention: one query's row is bit for bit the row of P", "[fast_attention][row]") {
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      const int n = 777, heads = 2, d = 12;
      const Heads x = random_heads(n, heads, d, 21, 4.0f);
      KeyMask masks[3];
      masks[1] = random_key_mask(n, 5, 0.6);
      masks[2] = masks[1];
      masks[2].causal = true;
      for (const KeyMask& mask : masks) {
        const FastResult fast = run_fast(x, 0.25f, mask, {});
        const MatRM panels = key_panels(x.qkv.data() + heads * d, 3 * heads * d, n, heads, d);
        REQUIRE(panels.cols() == aligned_keys(n) * d);
        std::vector<float> row(static_cast<size_t>(n));
        for (int h = 0; h < heads; ++h)
          for (int query : {0, 1, 5, 6, 11, 12, 15, 16, 17, 400, n - 1}) {  // every place in a group of 4
            INFO("head " << h << " query " << query << (mask.causal ? " causal" : ""));
            attention_row_fast(x.qkv.row(query).data() + h * d, panels.row(h).data(), n, d, 0.25f, mask, query,
                               row.data());
            CHECK(ConstMapRM(row.data(), 1, n) == fast.probs[static_cast<size_t>(h)].row(query));
          }
      }
    }
  }
}

TEST_CASE("fast attention: phase A's row maxima stop at N, where the padding keys' scores of 0 start",
          "[fast_attention][row]") {
  // The leaf kernel directly: every score negative, so a maximum that took in a padding key (its
  // zero key panel scores 0) would be 0. max_end at every lane of 64-, 32- and 16-key steps, keys
  // in two chunks as the blocks pass them; the maximum must be the stored scores' over [0, N).
  const std::vector<std::pair<const char*, const detail::LeafKernels*>> tables = leaf_tables_here();
  constexpr int kD = 12, kMaxN = 130;
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> q(4 * kD);
  for (float& x : q) x = -1.0f - unit(rng);
  for (const auto& [name, kernels] : tables)
    for (int n = 1; n <= kMaxN; ++n) {
      INFO(name << ", N " << n);
      const int ld = aligned_keys(n);
      std::vector<float> keys(static_cast<size_t>(ld) * kD, 0.0f);  // zero past N, as pack_panels leaves them
      for (int j = 0; j < n; ++j)
        for (int c = 0; c < kD; ++c) keys[static_cast<size_t>((j / 16) * 16 * kD + 16 * c + j % 16)] = 0.5f + unit(rng);
      std::vector<float> scores(4 * static_cast<size_t>(ld), 1.0f);
      const float* qs[4] = {q.data(), q.data() + kD, q.data() + 2 * kD, q.data() + 3 * kD};
      float* ss[4] = {scores.data(), scores.data() + ld, scores.data() + 2 * ld, scores.data() + 3 * ld};
      float row_max[4];
      std::fill(row_max, row_max + 4, -std::numeric_limits<float>::infinity());
      const int split = std::min(ld, 64);  // two chunks: [0, split) and [split, ld)
      const auto scores_4rows = kernels->scores_4rows[0][1];  // no bias, with row_max
      scores_4rows(qs, keys.data(), kD, 0.25f, nullptr, ss, 0, split, n, row_max);
      if (split < ld) scores_4rows(qs, keys.data(), kD, 0.25f, nullptr, ss, split, ld, n, row_max);
      for (int i = 0; i < 4; ++i) {
        if (n < ld) CHECK(ss[i][ld - 1] == 0.0f);  // a padding key's score
        const float expected = *std::max_element(ss[i], ss[i] + n);
        CHECK(expected < 0.0f);
        CHECK(row_max[i] == expected);
      }
    }
}

TEST_CASE("fast attention: every score far below 0, N not a multiple of 16", "[fast_attention][row]") {
  // Queries -(1 + |q|) * 10 against keys 1 + |k|: scores about -100 +- 12, so exp(s - 0) would
  // underflow if phase A's row maximum took in a padding key's score of 0. Blocks against the
  // reference and the exact oracle, and rows bit for bit against attention_row.
  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    for (int n : {21, 40, 553, 777}) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << " N=" << n) {
        const int heads = 2, d = 12;
        Heads x = random_heads(n, heads, d, 41 + static_cast<unsigned>(n));
        x.qkv.leftCols(heads * d) = -(x.qkv.leftCols(heads * d).array().abs() + 1.0f) * 10.0f;
        x.qkv.middleCols(heads * d, heads * d) = x.qkv.middleCols(heads * d, heads * d).array().abs() + 1.0f;
        const FastResult fast = run_fast(x, 0.25f, KeyMask{}, {});
        REQUIRE(fast.finished);
        CHECK(fast.probs[0].maxCoeff() > 0.0f);
        check_differences(compare(x, 0.25f, KeyMask{}, {}, fast), 1e-4);  // scores of ~100: as large logits
        const MatRM panels = key_panels(x.qkv.data() + heads * d, 3 * heads * d, n, heads, d);
        std::vector<float> row(static_cast<size_t>(n));
        for (int h = 0; h < heads; ++h)
          for (int query : {0, 3, n / 2, n - 1}) {
            INFO("head " << h << " query " << query);
            attention_row_fast(x.qkv.row(query).data() + h * d, panels.row(h).data(), n, d, 0.25f, KeyMask{}, query,
                               row.data());
            CHECK(ConstMapRM(row.data(), 1, n) == fast.probs[static_cast<size_t>(h)].row(query));
          }
      }
    }
  }
}

TEST_CASE("fast attention: cancelling through progress, inconsistent inputs", "[fast_attention]") {
  const Heads x = random_heads(300, 2, 12, 1);
  MatRM context(300, 24), sums(2, 300);
  AttentionInputs in;
  in.tokens = 300, in.heads = 2, in.head_dim = 12;
  in.queries = x.qkv.data(), in.keys = x.qkv.data() + 24, in.values = x.qkv.data() + 48;
  in.query_stride = in.key_stride = in.value_stride = 72;
  AttentionOutputs out;
  out.context = context.data(), out.context_stride = 24;
  out.column_sums = sums.data();
  std::vector<float> reported;
  const bool finished = multi_head_attention(in, out, 2, [&](float f) {
    reported.push_back(f);
    return false;
  });
  CHECK_FALSE(finished);
  REQUIRE(reported.size() == 1);  // the first report comes after the first block
  CHECK(reported[0] > 0.0f);
  CHECK(reported[0] <= 1.0f);
  CHECK(multi_head_attention(in, out, 2, [](float) { return true; }));

  KeyMask short_mask;
  short_mask.key_allowed.assign(299, 1);
  in.mask = &short_mask;
  CHECK_THROWS_WITH(multi_head_attention(in, out), Catch::Contains("299 entries for 300 tokens"));
  in.mask = nullptr;
  in.tokens = 0;
  CHECK_THROWS_WITH(multi_head_attention(in, out), Catch::Contains("must be positive"));
}

TEST_CASE("fast exp: within 1 ulp of exp over the softmax range (1.5 without FMA), 0 below it",
          "[fast_attention][exp]") {
  IsaGuard guard;
  // Every 7th float in [kExpMin, 0] near the ends, plus an even sweep: 600k arguments.
  std::vector<float> x;
  for (float v = 0.0f; v > -1e-3f; v = std::nextafter(v, -1.0f)) {
    x.push_back(v);
    if (x.size() > 100000) break;
  }
  for (int i = 0; i <= 500000; ++i) x.push_back(fast_exp::kExpMin * static_cast<float>(i) / 500000.0f);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      std::vector<float> y(x.size());
      exp_array(x.data(), y.data(), static_cast<int>(x.size()));
      double worst_ulps = 0.0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double exact = std::exp(static_cast<double>(x[i]));
        const float nearest = static_cast<float>(exact);
        const double ulp = std::nextafter(nearest, 2.0f * nearest) - nearest;
        worst_ulps = std::max(worst_ulps, std::abs(y[i] - exact) / ulp);
      }
      WARN(kernel_isa_name(isa) << ": largest exp error " << worst_ulps << " ulp");
      // The portable path rounds each product of the polynomial before adding it.
      CHECK(worst_ulps <= (isa == KernelIsa::Portable ? 1.5 : 1.0));
      const float special[] = {0.0f, -std::numeric_limits<float>::infinity(), std::nextafter(fast_exp::kExpMin, -1e9f),
                               -1000.0f, fast_exp::kExpMin};
      float out[5];
      exp_array(special, out, 5);
      CHECK(out[0] == 1.0f);
      CHECK(out[1] == 0.0f);
      CHECK(out[2] == 0.0f);
      CHECK(out[3] == 0.0f);
      CHECK(out[4] >= std::numeric_limits<float>::min());  // a normal float, not a denormal
    }
  }
}

TEST_CASE("forward without keep_probs: received, class row and rows match the reference, any thread count",
          "[fast_attention][forward]") {
  // 30 x 33 patches + class token = 991 tokens (not a multiple of 16), the last column padding.
  const VitConfig c = test::small_config(16, true, 2);
  const VitModel m = test::random_model(c, 31);
  PatchGrid g;
  g.grid_h = 30, g.grid_w = 33;
  g.patches.resize(30 * 33, c.patch_values());
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Eigen::Index i = 0; i < g.patches.size(); ++i) g.patches.data()[i] = normal(rng);
  g.patch_is_padding.assign(30 * 33, 0);
  for (int row = 0; row < 30; ++row) g.patch_is_padding[static_cast<size_t>(row * 33 + 32)] = 1;

  IsaGuard guard;
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    for (bool causal : {false, true}) {
      DYNAMIC_SECTION(kernel_isa_name(isa) << (causal ? " causal" : "")) {
        ForwardOptions o;
        o.causal = causal;
        o.threads = 2;
        const ForwardResult r = forward(m, g, o);
        REQUIRE(r.tokens == 991);
        REQUIRE(r.received_queries == 991 - 30);
        REQUIRE(r.layers[0].probs.empty());
        double worst = 0.0, largest_score = 0.0;
        auto note = [&](double got, double want) { worst = std::max(worst, std::abs(got - want) / (want + 1e-12)); };
        for (int l = 0; l < 2; ++l)
          for (int h = 0; h < 4; ++h) {
            const LayerState& state = r.layers[static_cast<size_t>(l)];
            const MatRM q = state.qkv.middleCols(h * 12, 12), k = state.qkv.middleCols(48 + h * 12, 12),
                        v = state.qkv.middleCols(96 + h * 12, 12);
            const double scores = (q * k.transpose()).cwiseAbs().maxCoeff() * r.score_scale;
            largest_score = std::max(largest_score, scores);
            const AttentionResult ref = scaled_dot_product_attention(q, k, v, r.mask, r.score_scale);
            for (int j = 0; j < r.tokens; ++j) {
              double column = 0.0;
              for (int i = 0; i < r.tokens; ++i)
                if (i == 0 || !g.patch_is_padding[static_cast<size_t>(i - 1)]) column += ref.weights(i, j);
              note(state.received(h, j), column / r.received_queries);
              note(state.cls_row(h, j), ref.weights(0, j));
            }
            std::vector<float> row(static_cast<size_t>(r.tokens));
            for (int query : {1, 500, 990}) {
              attention_row(m, r, l, h, query, row.data());
              for (int j = 0; j < r.tokens; ++j) note(row[static_cast<size_t>(j)], ref.weights(query, j));
            }
          }
        // The scores of this model reach ~30; each side rounds a score by up to a few |s| * 6e-8.
        const double tolerance = 4.0 * 6e-8 * (1.0 + largest_score);
        WARN(kernel_isa_name(isa) << (causal ? " causal" : "") << ": forward's received, class rows and rows vs the "
                                  << "reference: largest relative difference " << worst << " (scores up to "
                                  << largest_score << ", tolerance " << tolerance << ")");
        CHECK(worst < tolerance);

        // One thread: the same numbers, bit for bit.
        o.threads = 1;
        const ForwardResult one = forward(m, g, o);
        CHECK(one.output == r.output);
        for (int l = 0; l < 2; ++l) {
          CHECK(one.layers[static_cast<size_t>(l)].received == r.layers[static_cast<size_t>(l)].received);
          CHECK(one.layers[static_cast<size_t>(l)].cls_row == r.layers[static_cast<size_t>(l)].cls_row);
        }
      }
    }
  }
}
