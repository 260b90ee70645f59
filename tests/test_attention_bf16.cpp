// Attention with bfloat16 products (attention_bf16.hpp, multi_head_attention_bf16) against an
// oracle in double over the same rounded operands, on every leaf-kernel instruction set this CPU
// runs:
//   probabilities  |p - p_exact| <= 1e-6, p_exact the double softmax of scale * sum_c bf16(q_c) bf16(k_c)
//                  (measured: up to 9e-8 with N(0, 1) entries and d <= 64; an unrounded q or k
//                  moves each score by up to 2^-9 of its terms, p by orders of magnitude more)
//   context        |out - sum_j bf16(p_j) bf16(v_j)| <= 1e-6 sum_j |bf16(p_j) bf16(v_j)| with this
//                  path's own float32 p (measured: up to 1.7e-7; an unrounded p moves out by up to
//                  2^-9 of that scale)
//   received sums  the double sum of this path's float32 p over the counted rows, within 1e-6
//   masked weights exactly 0; a row with no allowed key all 0 with a 0 output
// and bit for bit: any thread count, attention_row_bf16 against the rows of P, forward()'s
// attention_row, and the AVX512-BF16 and AVX2 kernels against the emulation (where the CPU has
// them; skipped with a printed reason where not).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/attention_bf16.hpp"
#include "core/cpu/bf16.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/model/vit.hpp"
#include "test_support.hpp"

using namespace vitlens;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// H heads of N tokens as timm's qkv, (N, 3 H d), N(0, 1) entries.
struct Heads {
  int n = 0, heads = 0, d = 0;
  MatRM qkv;
  float at(int token, int part, int h, int c) const {  // part 0 = q, 1 = k, 2 = v
    return qkv(token, part * heads * d + h * d + c);
  }
};

Heads random_heads(int n, int heads, int d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Heads x{n, heads, d, MatRM(n, 3 * heads * d)};
  for (Eigen::Index i = 0; i < x.qkv.size(); ++i) x.qkv.data()[i] = normal(rng);
  return x;
}

struct Outputs {
  bool finished = false;
  MatRM context, column_sums, first_rows;
  std::vector<MatRM> probs;
};

// One run of multi_head_attention_bf16 (multi_head_attention when not bf16), or of the bf16 path on `kernels`.
Outputs run(const Heads& x, float scale, const KeyMask& mask, const std::vector<uint8_t>& counts, int threads,
            bool bf16 = true, const detail::Bf16GemmKernels* kernels = nullptr) {
  const int hd = x.heads * x.d;
  Outputs r;
  r.context = MatRM::Constant(x.n, hd, kNaN);  // every entry must be written
  r.column_sums = MatRM::Constant(x.heads, x.n, kNaN);
  r.first_rows = MatRM::Constant(x.heads, x.n, kNaN);
  r.probs.assign(static_cast<size_t>(x.heads), MatRM::Constant(x.n, x.n, kNaN));
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
  r.finished = kernels ? detail::multi_head_attention_bf16_with(*kernels, in, out, threads, {})
               : bf16 ? multi_head_attention_bf16(in, out, threads)
                      : multi_head_attention(in, out, threads);
  return r;
}

bool same_bits(const MatRM& a, const MatRM& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.size())) == 0;
}

bool same_bits(const Outputs& a, const Outputs& b) {
  bool same = same_bits(a.context, b.context) && same_bits(a.column_sums, b.column_sums) &&
              same_bits(a.first_rows, b.first_rows);
  for (size_t h = 0; h < a.probs.size(); ++h) same = same && same_bits(a.probs[h], b.probs[h]);
  return same;
}

struct Case {
  const char* name;
  int n, heads, d;
  int mask;  // 0 none, 1 key mask (every third key and the last masked), 2 causal, 3 no key allowed
};
// N across the 8 x 48 tile and the 16-key alignment, d odd, 12 (the card's) and 64 (ViT-S/B).
const Case kCases[] = {{"one token", 1, 1, 8, 0},          {"key mask", 37, 2, 12, 1}, {"causal", 150, 3, 64, 2},
                       {"odd head dim", 200, 2, 7, 0},     {"no key allowed", 20, 2, 16, 3},
                       {"ViT-S/16 shape", 197, 2, 64, 1}};

KeyMask mask_for(const Case& c) {
  KeyMask mask;
  if (c.mask == 2) mask.causal = true;
  if (c.mask == 1 || c.mask == 3) {
    mask.key_allowed.assign(static_cast<size_t>(c.n), c.mask == 1 ? 1 : 0);
    if (c.mask == 1) {
      for (int j = 0; j < c.n; j += 3) mask.key_allowed[static_cast<size_t>(j)] = 0;
      mask.key_allowed[0] = 1;  // the class token
      mask.key_allowed[static_cast<size_t>(c.n - 1)] = 0;
    }
  }
  return mask;
}

// Rows counted into the received sums: all but every fifth.
std::vector<uint8_t> counts_for(int n) {
  std::vector<uint8_t> counts(static_cast<size_t>(n), 1);
  for (int i = 4; i < n; i += 5) counts[static_cast<size_t>(i)] = 0;
  return counts;
}

double bf(float x) { return static_cast<double>(round_to_bf16(x)); }

}  // namespace

TEST_CASE("bf16 attention against float64 of the rounded operands", "[bf16][attention]") {
  for (KernelIsa isa : test::isas_here()) {
    test::UseIsa use(isa);
    for (const Case& c : kCases) {
      INFO(kernel_isa_id(isa) << ": " << c.name);
      const Heads x = random_heads(c.n, c.heads, c.d, 11u + static_cast<unsigned>(c.n));
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      const KeyMask mask = mask_for(c);
      const std::vector<uint8_t> counts = counts_for(c.n);
      const Outputs got = run(x, scale, mask, counts, 0);
      REQUIRE(got.finished);
      double worst_p = 0.0, worst_context = 0.0, worst_sums = 0.0;
      bool masked_nonzero = false;
      for (int h = 0; h < c.heads; ++h) {
        const MatRM& p = got.probs[static_cast<size_t>(h)];
        std::vector<double> sums(static_cast<size_t>(c.n), 0.0);
        for (int i = 0; i < c.n; ++i) {
          std::vector<double> s(static_cast<size_t>(c.n), 0.0);
          double row_max = -std::numeric_limits<double>::infinity();
          for (int j = 0; j < c.n; ++j) {
            if (!mask.allows(i, j)) continue;
            double dot = 0.0;
            for (int ch = 0; ch < c.d; ++ch) dot += bf(x.at(i, 0, h, ch)) * bf(x.at(j, 1, h, ch));
            s[static_cast<size_t>(j)] = scale * dot;
            row_max = std::max(row_max, s[static_cast<size_t>(j)]);
          }
          double l = 0.0;
          for (int j = 0; j < c.n; ++j)
            if (mask.allows(i, j)) l += std::exp(s[static_cast<size_t>(j)] - row_max);
          for (int j = 0; j < c.n; ++j) {
            const double exact = mask.allows(i, j) ? std::exp(s[static_cast<size_t>(j)] - row_max) / l : 0.0;
            if (!mask.allows(i, j) && p(i, j) != 0.0f) masked_nonzero = true;
            worst_p = std::max(worst_p, std::abs(p(i, j) - exact));
            if (counts[static_cast<size_t>(i)]) sums[static_cast<size_t>(j)] += p(i, j);
          }
          for (int ch = 0; ch < c.d; ++ch) {
            double mixed = 0.0, magnitude = 0.0;
            for (int j = 0; j < c.n; ++j) {
              const double term = bf(p(i, j)) * bf(x.at(j, 2, h, ch));
              mixed += term, magnitude += std::abs(term);
            }
            const double diff = std::abs(got.context(i, h * c.d + ch) - mixed);
            worst_context = std::max(worst_context, magnitude > 0.0 ? diff / magnitude : diff);
          }
        }
        for (int j = 0; j < c.n; ++j)
          worst_sums = std::max(worst_sums, std::abs(got.column_sums(h, j) - sums[static_cast<size_t>(j)]) /
                                                (sums[static_cast<size_t>(j)] + 1e-30));
        CHECK(same_bits(MatRM(got.first_rows.row(h)), MatRM(p.row(0))));
      }
      std::cout << "test_attention_bf16: " << kernel_isa_id(isa) << " " << c.name << ": |p - p_exact| " << worst_p
                << ", context " << worst_context << " of its scale, received sums " << worst_sums << "\n";
      CHECK(worst_p <= 1e-6);
      CHECK(worst_context <= 1e-6);
      CHECK(worst_sums <= 1e-6);
      CHECK_FALSE(masked_nonzero);
      if (c.mask == 3) CHECK(got.context.cwiseAbs().maxCoeff() == 0.0f);
      // The switch changes the numbers (else this would test the float32 path).
      const Outputs fp32 = run(x, scale, mask, counts, 0, false);
      if (c.mask != 3) CHECK((got.context - fp32.context).cwiseAbs().maxCoeff() > 0.0f);
    }
  }
}

TEST_CASE("bf16 attention: the same bits on any thread count and in attention_row_bf16", "[bf16][attention]") {
  for (KernelIsa isa : test::isas_here()) {
    test::UseIsa use(isa);
    for (const Case& c : kCases) {
      INFO(kernel_isa_id(isa) << ": " << c.name);
      const Heads x = random_heads(c.n, c.heads, c.d, 29u + static_cast<unsigned>(c.n));
      const KeyMask mask = mask_for(c);
      const std::vector<uint8_t> counts = counts_for(c.n);
      const Outputs one = run(x, 0.3f, mask, counts, 1), two = run(x, 0.3f, mask, counts, 2),
                    all = run(x, 0.3f, mask, counts, 0);
      CHECK(same_bits(one, two));
      CHECK(same_bits(one, all));
      const int hd = c.heads * c.d;
      std::vector<float> row(static_cast<size_t>(c.n));
      bool rows_equal = true;
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < c.n; ++i) {
          attention_row_bf16(x.qkv.row(i).data() + h * c.d, x.qkv.data() + hd + h * c.d, 3 * hd, c.n, c.d, 0.3f, mask,
                             i, row.data());
          rows_equal = rows_equal &&
                       std::memcmp(row.data(), one.probs[static_cast<size_t>(h)].row(i).data(), sizeof(float) * c.n) == 0;
        }
      CHECK(rows_equal);
    }
  }
}

TEST_CASE("bf16 attention: the vector kernels equal the emulation bit for bit", "[bf16][attention]") {
  // Each bfloat16 kernel under the leaf kernels (the softmax) of the instruction set bf16_kernel()
  // runs it with: AVX512-BF16 under AVX-512, the AVX2 one under AVX2.
  struct Vector {
    Bf16Kernel kernel;
    KernelIsa isa;
    const char* missing;
  };
  const Vector vectors[] = {{Bf16Kernel::Avx512Bf16, KernelIsa::Avx512, "this CPU has no avx512_bf16"},
                            {Bf16Kernel::Avx2, KernelIsa::Avx2, "this CPU has no AVX2 and FMA"}};
  for (const Vector& v : vectors) {
    if (!bf16_kernel_supported(v.kernel)) {
      std::cout << "test_attention_bf16: skipping the " << bf16_kernel_name(v.kernel) << " attention products: "
                << v.missing << "\n";
      continue;
    }
    test::UseIsa use(v.isa);
    // (Where the CPU has AMX, the AVX-512 kernels' bf16 products run on AMX: tested below.)
    REQUIRE((bf16_kernel() == v.kernel || (v.kernel == Bf16Kernel::Avx512Bf16 && bf16_kernel() == Bf16Kernel::Amx)));
    for (const Case& c : kCases) {
      INFO(bf16_kernel_name(v.kernel) << " " << c.name);
      Heads x = random_heads(c.n, c.heads, c.d, 43u + static_cast<unsigned>(c.n));
      // Values that exercise the rounding: ties, denormals (read as zero by both), large magnitudes.
      x.qkv(0, 0) = 1.0f + 1.0f / 256.0f, x.qkv(0, 1) = 1e-39f, x.qkv(c.n - 1, x.qkv.cols() - 1) = 3e4f;
      const KeyMask mask = mask_for(c);
      const std::vector<uint8_t> counts = counts_for(c.n);
      const Outputs emulated = run(x, 0.125f, mask, counts, 2, true, &detail::kEmulatedBf16Gemm);
      const Outputs vector = run(x, 0.125f, mask, counts, 2, true, &detail::bf16_kernels(v.kernel));
      CHECK(same_bits(emulated, vector));
    }
  }
}

TEST_CASE("bf16 attention on the AMX kernel is the emulation's to float32 rounding", "[bf16][attention][amx]") {
  // The AMX kernel sums in TDPBF16PS' order (bf16.hpp), so its scores and P V differ from the
  // emulation's in the last bits: on tiles in memory everywhere, and the instructions where the CPU
  // has them.
  std::vector<std::pair<const char*, const detail::Bf16GemmKernels*>> amx = {
      {"amx on tiles in memory", &detail::kAmxSoftwareTilesGemm}};
  if (bf16_kernel_supported(Bf16Kernel::Amx)) amx.push_back({"amx", &detail::bf16_kernels(Bf16Kernel::Amx)});
  else std::cout << "test_attention_bf16: skipping the AMX instructions: " << bf16_kernel_missing(Bf16Kernel::Amx) << "\n";
  for (const auto& [name, kernels] : amx)
    for (const Case& c : kCases) {
      INFO(name << " " << c.name);
      const Heads x = random_heads(c.n, c.heads, c.d, 47u + static_cast<unsigned>(c.n));
      const KeyMask mask = mask_for(c);
      const std::vector<uint8_t> counts = counts_for(c.n);
      const Outputs emulated = run(x, 0.125f, mask, counts, 2, true, &detail::kEmulatedBf16Gemm);
      const Outputs got = run(x, 0.125f, mask, counts, 2, true, kernels);
      const Outputs one_thread = run(x, 0.125f, mask, counts, 1, true, kernels);
      CHECK(same_bits(got, one_thread));
      CHECK(got.finished == emulated.finished);
      double worst_p = 0.0;
      for (size_t h = 0; h < got.probs.size(); ++h)
        worst_p = std::max(worst_p, static_cast<double>((got.probs[h] - emulated.probs[h]).cwiseAbs().maxCoeff()));
      CHECK(worst_p <= 1e-5);
      // P is rounded to bfloat16 for P V: a probability a last bit apart may round to the next
      // bfloat16 (2^-8 of it), so each context value may move by up to 2^-8 sum_j p_j |v_j|.
      const int hd = c.heads * c.d;
      const double max_v = x.qkv.middleCols(2 * hd, hd).cwiseAbs().maxCoeff();
      const double worst_context = (got.context - emulated.context).cwiseAbs().maxCoeff();
      CHECK(worst_context <= std::ldexp(1.0, -8) * max_v + 1e-6);
    }
}

TEST_CASE("bf16 attention stops when progress says so", "[bf16][attention]") {
  const Heads x = random_heads(300, 4, 16, 5);
  AttentionInputs in;
  const int hd = x.heads * x.d;
  in.tokens = x.n, in.heads = x.heads, in.head_dim = x.d;
  in.queries = x.qkv.data(), in.keys = x.qkv.data() + hd, in.values = x.qkv.data() + 2 * hd;
  in.query_stride = in.key_stride = in.value_stride = 3 * hd;
  MatRM context(x.n, hd), sums(x.heads, x.n);
  AttentionOutputs out;
  out.context = context.data(), out.context_stride = hd, out.column_sums = sums.data();
  int calls = 0;
  CHECK_FALSE(multi_head_attention_bf16(in, out, 1, [&](float) { return ++calls > 1; }));
  CHECK(calls == 1);
  CHECK(multi_head_attention_bf16(in, out, 1, [](float) { return true; }));
  // The float32 path's input checks.
  in.tokens = 0;
  CHECK_THROWS_WITH(multi_head_attention_bf16(in, out), Catch::Contains("must be positive"));
}

TEST_CASE("A bf16 forward's attention_row equals its probabilities", "[bf16][attention]") {
  VitConfig cfg = test::small_config(24);
  const VitModel model = test::random_model(cfg, 17);
  PatchGrid grid;
  grid.grid_h = grid.grid_w = 6;
  grid.patches = MatRM::Random(36, cfg.patch_values());
  ForwardOptions options;
  options.keep_probs = true;
  options.precision = Precision::Bf16;
  const ForwardResult bf16 = forward(model, grid, options);
  std::vector<float> row(static_cast<size_t>(bf16.tokens));
  for (int h = 0; h < cfg.num_heads; ++h)
    for (int i = 0; i < bf16.tokens; i += 5) {
      attention_row(model, bf16, 0, h, i, row.data());
      CHECK(std::memcmp(row.data(), bf16.layers[0].probs[static_cast<size_t>(h)].row(i).data(),
                        sizeof(float) * row.size()) == 0);
    }
  // The attention itself ran in bfloat16: the float32 row from the same queries and keys differs.
  const LayerState& layer = bf16.layers[0];
  const int dim = cfg.embed_dim, hd = cfg.head_dim();
  const MatRM panels = key_panels(layer.qkv.data() + dim, static_cast<int>(layer.qkv.cols()), bf16.tokens, 1, hd);
  attention_row_fast(layer.qkv.row(1).data(), panels.data(), bf16.tokens, hd, bf16.score_scale, bf16.mask, 1,
                     row.data());
  CHECK((Eigen::Map<const Eigen::RowVectorXf>(row.data(), bf16.tokens) - layer.probs[0].row(1)).cwiseAbs().maxCoeff() >
        0.0f);
}
