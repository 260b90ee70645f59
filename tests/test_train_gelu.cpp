// The training GELU (train_ops.hpp: gelu_forward / gelu_backward) on its own, for every build of
// the ops the CPU runs (portable, AVX2, AVX-512), against the formulas in double:
//   GELU(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)),  GELU'(x) = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi).
// The vector builds' float ops use a polynomial erfc (avx2_math.hpp and its 16-lane copy
// avx512_math.hpp, Abramowitz & Stegun 7.1.26) with
// one exp for both terms of the derivative, the portable build Eigen's erf: each value must be within
// 1e-6 of the formula (absolute, or relative where the value is above 1; for the backward, times
// |dout|). Also: tails that fill no whole vector, in place (dinp == dout), the same bits at another
// address and for 1 and 2 threads, and the limits at +-inf.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "vitlens/train_ops.hpp"

using namespace vitlens;

namespace {

double phi_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double gelu_ref(double x) { return x * phi_cdf(x); }
double gelu_slope_ref(double x) { return phi_cdf(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

// Every float in [-10, 10] at a step of 2^-12 (81,921 values, enough for many vectors and chunks),
// then large values where erfc underflows, then 5 more: 81,934 values, so the last chunk of the ops
// (32,768 values each) ends in a tail of 6 that fills no whole vector.
std::vector<float> sweep() {
  std::vector<float> x;
  for (int i = -40960; i <= 40960; ++i) x.push_back(static_cast<float>(i) / 4096.0f);
  for (float v : {-30.0f, -13.5f, -12.0f, 11.0f, 14.0f, 50.0f, 1e10f, -1e10f}) x.push_back(v);
  for (float v : {0.3f, -0.7f, 2.5f, -3.25f, 7.0f}) x.push_back(v);
  return x;
}

void check_gelu(KernelIsa isa) {
  const test::UseIsa use(isa);
  const std::vector<float> x = sweep();
  const int64_t n = static_cast<int64_t>(x.size());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> g(x.size());
  for (float& v : g) v = uniform(rng);

  std::vector<float> y(x.size()), dx(x.size());
  train::gelu_forward(x.data(), n, y.data(), 1);
  train::gelu_backward(g.data(), x.data(), n, dx.data(), 1);
  double worst_f = 0.0, worst_b = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = gelu_ref(x[i]), slope = gelu_slope_ref(x[i]);
    const double err_f = std::abs(y[i] - ref) / std::max(1.0, std::abs(ref));
    const double err_b =
        std::abs(dx[i] - slope * g[i]) / std::max(1e-30, std::abs(g[i]) * std::max(1.0, std::abs(slope)));
    if (!(err_f <= 1e-6) || !(err_b <= 1e-6)) {  // a NaN fails too
      INFO("x = " << x[i] << ": gelu " << y[i] << " (formula " << ref << "), slope * g " << dx[i] << " (formula "
                  << slope * g[i] << ")");
      REQUIRE(err_f <= 1e-6);
      REQUIRE(err_b <= 1e-6);
    }
    worst_f = std::max(worst_f, err_f);
    worst_b = std::max(worst_b, err_b);
  }
  std::printf("train gelu (%s ops): largest difference to the double formula: forward %.1e, backward %.1e\n",
              train::train_ops_isa(), worst_f, worst_b);

  // The same bits in place (dinp == dout), at another address and for 2 threads.
  std::vector<float> in_place = g;
  train::gelu_backward(in_place.data(), x.data(), n, in_place.data(), 2);
  CHECK(in_place == dx);
  std::vector<float> xs(x.size() + 3), gs(x.size() + 3), ys(x.size() + 3), dxs(x.size() + 3);
  std::copy(x.begin(), x.end(), xs.begin() + 3);
  std::copy(g.begin(), g.end(), gs.begin() + 3);
  train::gelu_forward(xs.data() + 3, n, ys.data() + 3, 2);
  train::gelu_backward(gs.data() + 3, xs.data() + 3, n, dxs.data() + 3, 2);
  CHECK(std::vector<float>(ys.begin() + 3, ys.end()) == y);
  CHECK(std::vector<float>(dxs.begin() + 3, dxs.end()) == dx);

  // A tail alone (3 values) gives the values it has inside the long sweep.
  const int64_t at = 40960 + 4096;  // x = 1
  float y3[3], d3[3];
  train::gelu_forward(x.data() + at, 3, y3, 1);
  train::gelu_backward(g.data() + at, x.data() + at, 3, d3, 1);
  for (int i = 0; i < 3; ++i) {
    CHECK(y3[i] == y[static_cast<size_t>(at + i)]);
    CHECK(d3[i] == dx[static_cast<size_t>(at + i)]);
  }

  // The limits in the vector builds: GELU(-inf) = 0, GELU(+inf) = +inf, slopes 0 and 1 (Eigen's
  // formulas give NaN there: -inf * 0 and inf * exp(-inf)).
  if (std::string(train::train_ops_isa()) != "portable") {
    const float inf = std::numeric_limits<float>::infinity();
    const float xi[2] = {-inf, inf}, gi[2] = {1.0f, 1.0f};
    float yi[2], di[2];
    train::gelu_forward(xi, 2, yi, 1);
    train::gelu_backward(gi, xi, 2, di, 1);
    CHECK(yi[0] == 0.0f);
    CHECK(yi[1] == inf);
    CHECK(di[0] == 0.0f);
    CHECK(di[1] == 1.0f);
  }
}

}  // namespace

TEST_CASE("train: GELU forward and backward within 1e-6 of the erf formulas, on every build of the ops",
          "[train][gelu]") {
  const std::vector<KernelIsa> isas = test::isas_here();
  if (isas.size() == 1) WARN("this CPU has no AVX2 + FMA: only the portable build of the ops is checked");
  for (KernelIsa isa : isas) check_gelu(isa);
}
