// The CPU module (core/cpu/cpu.hpp): the features, the choice of instruction set, and that every
// kernel family (fast attention, the SGEMM, the training ops) follows the choice and agrees with
// the portable kernels on every instruction set this CPU runs (the others are said on stderr).
// VITLENS_ISA itself is tested through the binaries (bench/CMakeLists.txt, test_train_loop.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/cpu/cpu.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/cpu/gemm.hpp"
#include "core/train/train_ops.hpp"
#include "test_support.hpp"

using namespace vitlens;

namespace {

std::vector<float> normal_values(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// Largest |a - b| / max(1, |b|).
double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  return worst;
}

// One small call of each kernel family, under the kernels in use: fast attention's context and
// received sums, a Linear with GELU, and the training ops' attention, LayerNorm and fused Linear +
// GELU forwards, all in one vector.
std::vector<float> run_every_family() {
  const int n = 37, heads = 3, d = 12, dim = heads * d;
  const std::vector<float> qkv = normal_values(static_cast<size_t>(n) * 3 * dim, 1);
  std::vector<float> out;
  auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };

  std::vector<float> context(static_cast<size_t>(n) * dim), received(static_cast<size_t>(heads) * n);
  AttentionInputs in;
  in.tokens = n, in.heads = heads, in.head_dim = d, in.scale = 1.0f / std::sqrt(static_cast<float>(d));
  in.queries = qkv.data(), in.keys = qkv.data() + dim, in.values = qkv.data() + 2 * dim;
  in.query_stride = in.key_stride = in.value_stride = 3 * dim;
  AttentionOutputs o;
  o.context = context.data(), o.context_stride = dim, o.column_sums = received.data();
  REQUIRE(multi_head_attention(in, o, 1));
  append(context);
  append(received);

  const int rows = 19, k = 40, cols = 50;
  const std::vector<float> x = normal_values(static_cast<size_t>(rows) * k, 2), w = normal_values(static_cast<size_t>(cols) * k, 3),
                           b = normal_values(cols, 4);
  std::vector<float> y(static_cast<size_t>(rows) * cols);
  linear_forward(x.data(), k, rows, k, w.data(), cols, b.data(), y.data(), cols, LinearEpilogue::Gelu, 1);
  append(y);

  std::vector<float> probs(static_cast<size_t>(heads) * n * n), ctx(static_cast<size_t>(n) * dim);
  train::attention_forward(qkv.data(), nullptr, 1, n, dim, heads, in.scale, probs.data(), ctx.data(), 1);
  append(probs);
  append(ctx);
  std::vector<float> normed(static_cast<size_t>(rows) * k), mean(rows), rstd(rows);
  const std::vector<float> ones(k, 1.0f), zeros(k, 0.0f);
  train::layernorm_forward(x.data(), ones.data(), zeros.data(), 1e-6f, rows, k, normed.data(), mean.data(), rstd.data(), 1);
  append(normed);
  std::vector<float> act(static_cast<size_t>(rows) * cols), slope(act.size());
  train::linear_gelu_forward(x.data(), w.data(), b.data(), rows, k, cols, act.data(), slope.data(), 1);
  append(act);
  append(slope);
  return out;
}

}  // namespace

TEST_CASE("cpu: the features are consistent and the supported instruction sets follow them", "[cpu]") {
  const CpuFeatureFlags& f = cpu_features();
  WARN("cpu features: " << cpu_features_line() << "; kernels in use: " << kernel_isa_name(kernel_isa()));
  CHECK(kernel_isa_supported(KernelIsa::Portable));
  CHECK(kernel_isa_supported(KernelIsa::Avx2) == f.avx2_fma);
  CHECK(kernel_isa_supported(KernelIsa::Avx512) == f.avx512f);
  if (f.avx512f) CHECK(f.avx2_fma);  // AVX-512 counts only with AVX2 + FMA (the kernels' target)
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512_bf16) CHECK(f.avx512f);
  if (!f.amx_bf16) CHECK_FALSE(amx_bf16_usable());
  CHECK(kernel_isa_supported(kernel_isa()));
  CHECK_FALSE(cpu_features_line().empty());
}

TEST_CASE("cpu: instruction set names round trip and an unknown one is refused", "[cpu]") {
  for (KernelIsa isa : kAllKernelIsas) {
    KernelIsa parsed = KernelIsa::Portable;
    REQUIRE(parse_kernel_isa(kernel_isa_id(isa), parsed));
    CHECK(parsed == isa);
    CHECK(kernel_isa_missing(isa).empty() == kernel_isa_supported(isa));
  }
  KernelIsa unchanged = KernelIsa::Avx2;
  CHECK_FALSE(parse_kernel_isa("avx2+fma", unchanged));  // the report's name, not an id
  CHECK_FALSE(parse_kernel_isa("", unchanged));
  CHECK(unchanged == KernelIsa::Avx2);
}

TEST_CASE("cpu: set_kernel_isa refuses an instruction set the CPU lacks, saying which", "[cpu]") {
  const test::UseIsa keep(kernel_isa());
  int lacking = 0;
  for (KernelIsa isa : kAllKernelIsas)
    if (!kernel_isa_supported(isa)) {
      ++lacking;
      CHECK_THROWS_WITH(set_kernel_isa(isa), "set_kernel_isa: " + kernel_isa_missing(isa));
    }
  if (lacking == 0) WARN("this CPU runs every instruction set: nothing to refuse");
  CHECK(kernel_isa_supported(kernel_isa()));
}

TEST_CASE("cpu: every kernel family runs the chosen instruction set and agrees with the portable kernels", "[cpu]") {
  std::vector<float> portable;
  {
    const test::UseIsa use(KernelIsa::Portable);
    portable = run_every_family();
  }
  std::vector<const train::TrainOps<float>*> train_tables;
  for (KernelIsa isa : test::isas_here()) {
    const test::UseIsa use(isa);
    INFO(kernel_isa_name(isa));
    // The three tables hand out this instruction set's kernels.
    CHECK(&detail::active_gemm_kernels() == &detail::kGemmKernels.get(isa));
    CHECK(&detail::kLeafKernels.active() == &detail::kLeafKernels.get(isa));
    train_tables.push_back(&train::train_ops<float>());
    CHECK(std::string(train::train_ops_isa()) == kernel_isa_id(isa));
    const std::vector<float> got = run_every_family();
    CHECK(got == run_every_family());  // the same bits on every call
    if (isa == KernelIsa::Portable) {
      CHECK(got == portable);
      continue;
    }
    // FMA and the order of the lanes' sums move the last bits; the GELU's erf differs within 1e-6.
    const double diff = largest_difference(got, portable);
    WARN(kernel_isa_name(isa) << " vs portable: largest difference " << diff);
    CHECK(diff < 2e-5);
    CHECK(got != portable);  // another build really ran
  }
  std::sort(train_tables.begin(), train_tables.end());
  CHECK(std::unique(train_tables.begin(), train_tables.end()) == train_tables.end());  // a table per build
}
