// The fused training ops (train_ops_list.inc: linear_gelu_forward, linear_gelu_backward,
// linear_residual_forward) against the separate ops they stand for, on every build of the ops the
// CPU runs: the same bits, since the product's epilogue (gemm.hpp's TileEpilogue) runs the same
// GELU, GELU' and adds as gelu_forward, gelu_backward and residual_forward. Shapes with rows and
// columns that fill no whole tile (edge tiles go through gemm.cpp's padded copies), 1 and 2
// threads, and gradients accumulated onto what dw and db already hold.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "test_support.hpp"
#include "core/cpu/gemm.hpp"
#include "core/train/train_ops.hpp"

using namespace vitlens;

namespace {

std::vector<float> gaussian(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void check_fused(KernelIsa isa, int R, int I, int O, int threads) {
  INFO("build " << test::train_ops_name(isa) << ", R " << R << ", I " << I << ", O " << O << ", threads "
                << threads);
  const test::UseIsa use(isa);
  const size_t RI = static_cast<size_t>(R) * I, RO = static_cast<size_t>(R) * O, OI = static_cast<size_t>(O) * I;
  // Pre-activations around +-3 reach both GELU branches (x < 0 and x >= 0) and its tails.
  const std::vector<float> inp = gaussian(RI, 1, 1.0f), w = gaussian(OI, 2, 0.7f), b = gaussian(O, 3, 0.5f);

  // fc1 + GELU: out = GELU(pre), slope = GELU'(pre) against linear_forward, gelu_forward and
  // gelu_backward with dout = 1 (slope * 1 is the slope itself).
  std::vector<float> out(RO), slope(RO), pre(RO), out_ref(RO), slope_ref(RO);
  train::linear_gelu_forward(inp.data(), w.data(), b.data(), R, I, O, out.data(), slope.data(), threads);
  train::linear_forward(inp.data(), w.data(), b.data(), R, I, O, pre.data(), threads);
  train::gelu_forward(pre.data(), static_cast<int64_t>(RO), out_ref.data(), threads);
  const std::vector<float> ones(RO, 1.0f);
  train::gelu_backward(ones.data(), pre.data(), static_cast<int64_t>(RO), slope_ref.data(), threads);
  CHECK(out == out_ref);
  CHECK(slope == slope_ref);
  // Not a degenerate case: both branches of GELU were hit (but in a single value).
  int negative = 0, positive = 0;
  for (float x : pre) (x < 0 ? negative : positive) += 1;
  if (RO > 1) {
    CHECK(negative > 0);
    CHECK(positive > 0);
  }

  // fc2's backward after that GELU: dpre = (dout @ w2) * slope, dw2 and db2 accumulated, against
  // linear_backward (write_dinp) then gelu_backward on pre.
  const int O2 = I;  // fc2: O inputs (the GELU's width), O2 outputs
  const std::vector<float> w2 = gaussian(static_cast<size_t>(O2) * O, 4, 0.6f);
  const std::vector<float> dout = gaussian(static_cast<size_t>(R) * O2, 5, 1.0f);
  std::vector<float> dw = gaussian(static_cast<size_t>(O2) * O, 6, 0.1f), db = gaussian(O2, 7, 0.1f);
  std::vector<float> dw_ref = dw, db_ref = db;
  std::vector<float> dpre(RO, 123.0f), dgelu(RO), dpre_ref(RO);
  train::linear_gelu_backward(dout.data(), out.data(), slope.data(), w2.data(), R, O, O2, dpre.data(), dw.data(),
                              db.data(), threads);
  train::linear_backward(dout.data(), out.data(), w2.data(), R, O, O2, dgelu.data(), dw_ref.data(), db_ref.data(),
                         threads, true);
  train::gelu_backward(dgelu.data(), pre.data(), static_cast<int64_t>(RO), dpre_ref.data(), threads);
  CHECK(dpre == dpre_ref);
  CHECK(dw == dw_ref);
  CHECK(db == db_ref);

  // proj / fc2 + residual: out = res + (inp @ w^T + b) against linear_forward then residual_forward.
  const std::vector<float> res = gaussian(RO, 8, 1.0f);
  std::vector<float> sum(RO), branch(RO), sum_ref(RO);
  train::linear_residual_forward(inp.data(), w.data(), b.data(), res.data(), R, I, O, sum.data(), threads);
  train::linear_forward(inp.data(), w.data(), b.data(), R, I, O, branch.data(), threads);
  train::residual_forward(res.data(), branch.data(), static_cast<int64_t>(RO), sum_ref.data(), threads);
  CHECK(sum == sum_ref);
}

// The double ops (the finite-difference check's) run the separate ops; the float fused ops must
// agree with them to float rounding.
void check_against_double(int R, int I, int O) {
  INFO("R " << R << ", I " << I << ", O " << O);
  const size_t RI = static_cast<size_t>(R) * I, RO = static_cast<size_t>(R) * O, OI = static_cast<size_t>(O) * I;
  const std::vector<float> inp = gaussian(RI, 11, 1.0f), w = gaussian(OI, 12, 0.7f), b = gaussian(O, 13, 0.5f);
  const std::vector<double> inp_d(inp.begin(), inp.end()), w_d(w.begin(), w.end()), b_d(b.begin(), b.end());
  std::vector<float> out(RO), slope(RO);
  std::vector<double> out_d(RO), slope_d(RO);
  train::linear_gelu_forward(inp.data(), w.data(), b.data(), R, I, O, out.data(), slope.data(), 1);
  train::linear_gelu_forward(inp_d.data(), w_d.data(), b_d.data(), R, I, O, out_d.data(), slope_d.data(), 1);
  for (size_t i = 0; i < RO; ++i) {
    REQUIRE(out[i] == Approx(out_d[i]).margin(1e-5).epsilon(1e-5));
    REQUIRE(slope[i] == Approx(slope_d[i]).margin(1e-5).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("train: fused fc1 + GELU, GELU' + fc2 backward and Linear + residual give the separate ops' bits",
          "[train][fused]") {
  for (KernelIsa isa : test::isas_here())
    for (int threads : {1, 2}) {
      check_fused(isa, 64, 48, 96, threads);   // whole tiles (the card's MLP at 64 rows)
      check_fused(isa, 37, 5, 20, threads);    // edge tiles in rows and columns
      check_fused(isa, 300, 12, 144, threads); // more rows than one block, 144 = 3 AVX-512 panels
      check_fused(isa, 40, 800, 20, threads);  // K = 800 both ways: the epilogue after the last of 3 or 4 k blocks
      check_fused(isa, 64, 800, 48, threads);  // the same with enough work to split between threads
      check_fused(isa, 1, 3, 1, threads);
    }
}

TEST_CASE("train: fused ops in float agree with the double ops", "[train][fused]") {
  for (KernelIsa isa : test::isas_here()) {
    const test::UseIsa use(isa);
    check_against_double(37, 5, 20);
    check_against_double(64, 48, 96);
  }
}

TEST_CASE("gemm: epilogue matrices that do not fit the epilogue are refused", "[gemm][fused]") {
  const std::vector<float> a(4 * 3, 1.0f), b(3 * 2, 1.0f), extra(4 * 2, 1.0f);
  std::vector<float> c(4 * 2, 0.0f);
  const detail::GemmKernels& kern = detail::active_gemm_kernels();
  const GemmOperand A{a.data(), 3, 1}, B{b.data(), 2, 1};
  detail::GemmExtras residual, slope, scale;
  residual.residual = extra.data();
  slope.gelu_slope_out = c.data();
  scale.scale = extra.data();
  CHECK_THROWS_WITH(
      detail::gemm_with(kern, 4, 2, 3, A, B, c.data(), 2, nullptr, LinearEpilogue::Accumulate, 1, residual),
      Catch::Contains("Accumulate"));
  CHECK_THROWS_WITH(detail::gemm_with(kern, 4, 2, 3, A, B, c.data(), 2, nullptr, LinearEpilogue::Store, 1, slope),
                    Catch::Contains("GELU slope without GELU"));
  CHECK_THROWS_WITH(detail::gemm_with(kern, 4, 2, 3, A, B, c.data(), 2, nullptr, LinearEpilogue::Gelu, 1, scale),
                    Catch::Contains("scale matrix needs the Store"));
  detail::GemmExtras aliased;
  aliased.residual = c.data();
  CHECK_THROWS_WITH(detail::gemm_with(kern, 4, 2, 3, A, B, c.data(), 2, nullptr, LinearEpilogue::Store, 1, aliased),
                    Catch::Contains("C itself"));
  // Store with a residual: C = residual + A B, each element 1 + 3.
  detail::gemm_with(kern, 4, 2, 3, A, B, c.data(), 2, nullptr, LinearEpilogue::Store, 1, residual);
  CHECK(c == std::vector<float>(4 * 2, 4.0f));
}

namespace {

// linear_backward's db (the row sums of dout^T, taken by the weight gradient's tiles) against
// sums in double, accumulated onto what db held, and the same bits for 1 and 2 threads.
void check_bias_sums(KernelIsa isa, int R, int I, int O) {
  INFO("build " << test::train_ops_name(isa) << ", R " << R << ", I " << I << ", O " << O);
  const test::UseIsa use(isa);
  const std::vector<float> dout = gaussian(static_cast<size_t>(R) * O, 21, 1.0f);
  const std::vector<float> inp = gaussian(static_cast<size_t>(R) * I, 22, 1.0f);
  const std::vector<float> w = gaussian(static_cast<size_t>(O) * I, 23, 0.5f);
  const std::vector<float> db0 = gaussian(O, 24, 1.0f);
  std::vector<float> db1 = db0, db2 = db0, dw1(static_cast<size_t>(O) * I), dw2 = dw1;
  train::linear_backward(dout.data(), inp.data(), w.data(), R, I, O, static_cast<float*>(nullptr), dw1.data(),
                         db1.data(), 1);
  train::linear_backward(dout.data(), inp.data(), w.data(), R, I, O, static_cast<float*>(nullptr), dw2.data(),
                         db2.data(), 2);
  CHECK(db1 == db2);
  CHECK(dw1 == dw2);
  for (int o = 0; o < O; ++o) {
    double sum = db0[static_cast<size_t>(o)];
    for (int r = 0; r < R; ++r) sum += dout[static_cast<size_t>(r) * O + o];
    REQUIRE(db1[static_cast<size_t>(o)] == Approx(sum).margin(1e-4).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("train: a Linear's bias gradient from the weight gradient's tiles, any shape, 1 and 2 threads",
          "[train][fused]") {
  for (KernelIsa isa : test::isas_here()) {
    check_bias_sums(isa, 6400, 48, 144);  // qkv: rows of dout^T split between threads
    check_bias_sums(isa, 6400, 96, 48);   // fc2: columns split, only the first columns' tiles sum
    check_bias_sums(isa, 800, 5, 20);     // edge panels of rows (20 = 2 x 8 + 4, 3 x 6 + 2), 3 or 4 k blocks
    check_bias_sums(isa, 1, 3, 7);
  }
  // No columns of C (I = 0): no tiles, the sums all the same.
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // dY (3, 2): A = dY^T (2, 3)
  std::vector<float> sums = {10, 20};
  detail::GemmExtras extras;
  extras.a_row_sums = sums.data();
  float c = 0.0f;
  detail::gemm_with(detail::active_gemm_kernels(), 2, 0, 3, GemmOperand{a.data(), 1, 2}, GemmOperand{&c, 0, 1}, &c,
                    0, nullptr, LinearEpilogue::Accumulate, 1, extras);
  CHECK(sums == std::vector<float>{10 + 1 + 3 + 5, 20 + 2 + 4 + 6});
  CHECK_THROWS_WITH(detail::gemm_with(detail::active_gemm_kernels(), 2, 1, 3, GemmOperand{a.data(), 3, 1},
                                      GemmOperand{a.data(), 1, 1}, &c, 1, nullptr, LinearEpilogue::Store, 1, extras),
                    Catch::Contains("row sums"));
}

namespace {

double phi_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Each kernel set's epilogues on their own (the portable set's too, which the training ops'
// portable build does not run for GELU): C = GELU(res + A B + b) with slope_out = GELU'(...), and
// C = scale * (A B + b), against double loops, with K = 800 (3 k blocks of 384, 4 of 256) and
// edge tiles.
void check_epilogues(const detail::GemmKernels& kern, const char* name) {
  INFO("kernels " << name);
  const int M = 37, N = 53, K = 800;
  const std::vector<float> a = gaussian(static_cast<size_t>(M) * K, 31, 0.1f);
  const std::vector<float> b = gaussian(static_cast<size_t>(K) * N, 32, 0.2f);
  const std::vector<float> bias = gaussian(N, 33, 0.5f), res = gaussian(static_cast<size_t>(M) * N, 34, 1.0f);
  const std::vector<float> scale = gaussian(static_cast<size_t>(M) * N, 35, 1.0f);
  std::vector<double> v(static_cast<size_t>(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double sum = bias[static_cast<size_t>(j)];
      for (int p = 0; p < K; ++p)
        sum += static_cast<double>(a[static_cast<size_t>(i) * K + p]) * b[static_cast<size_t>(p) * N + j];
      v[static_cast<size_t>(i) * N + j] = sum;
    }
  const GemmOperand A{a.data(), K, 1}, B{b.data(), N, 1};
  std::vector<float> c(static_cast<size_t>(M) * N), slope(c.size()), scaled(c.size());
  detail::GemmExtras gelu_extras, scale_extras;
  gelu_extras.residual = res.data();
  gelu_extras.gelu_slope_out = slope.data();
  scale_extras.scale = scale.data();
  detail::gemm_with(kern, M, N, K, A, B, c.data(), N, bias.data(), LinearEpilogue::Gelu, 2, gelu_extras);
  detail::gemm_with(kern, M, N, K, A, B, scaled.data(), N, bias.data(), LinearEpilogue::Store, 2, scale_extras);
  for (size_t i = 0; i < c.size(); ++i) {
    const double x = res[i] + v[i];
    const double gelu = x * phi_cdf(x);
    const double gelu_slope = phi_cdf(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    REQUIRE(c[i] == Approx(gelu).margin(1e-5).epsilon(1e-5));
    REQUIRE(slope[i] == Approx(gelu_slope).margin(1e-5).epsilon(1e-5));
    REQUIRE(scaled[i] == Approx(scale[i] * v[i]).margin(1e-5).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("gemm: the residual, GELU-and-slope and scale epilogues of every kernel set against double loops",
          "[gemm][fused]") {
  for (KernelIsa isa : test::isas_here()) check_epilogues(detail::kGemmKernels.get(isa), kernel_isa_id(isa));
}
