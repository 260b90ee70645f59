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
#include "core/train/train_ops.hpp"

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

// The training LayerNorm (layernorm_forward / layernorm_backward) in float, for every build of the
// ops, against the same ops in double (the plain row loop, the oracle): widths that fill no whole
// vector of 8 (1, 5, 12, 20, 50) and that do (8, 48), row counts that leave rows outside the groups
// of 4 the float rows run in (37) and cross a task (300 > 256 rows), rows with a large mean (the
// variance is computed around it). Forward within 1e-5, backward within 1e-4 of the largest value.
namespace {

double max_rel(const std::vector<float>& got, const std::vector<double>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / std::max(scale, 1e-30);
}

void check_layernorm(KernelIsa isa, int R, int D) {
  const test::UseIsa use(isa);
  std::mt19937 rng(static_cast<unsigned>(R * 131 + D));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(R) * D;
  std::vector<float> x(n), dy(n), w(D), b(D), dx0(n);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < D; ++i) x[static_cast<size_t>(r) * D + i] = (r % 3 == 0 ? 40.0f : 0.0f) + 2.0f * normal(rng);
  for (float& v : dy) v = normal(rng);
  for (float& v : w) v = 1.0f + 0.3f * normal(rng);
  for (float& v : b) v = 0.2f * normal(rng);
  for (float& v : dx0) v = normal(rng);  // the backward adds to what dinp holds
  std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end()), wd(w.begin(), w.end()),
      bd(b.begin(), b.end()), dxd(dx0.begin(), dx0.end()), yd(n), md(R), sd(R), dwd(D, 0.5), dbd(D, -0.5);
  train::layernorm_forward(xd.data(), wd.data(), bd.data(), 1e-6, R, D, yd.data(), md.data(), sd.data(), 1);
  train::layernorm_backward(dyd.data(), xd.data(), wd.data(), md.data(), sd.data(), R, D, dxd.data(), dwd.data(),
                            dbd.data(), 1);
  std::vector<float> y(n), m(R), s(R), dx = dx0, dw(D, 0.5f), db(D, -0.5f);
  train::layernorm_forward(x.data(), w.data(), b.data(), 1e-6f, R, D, y.data(), m.data(), s.data(), 1);
  train::layernorm_backward(dy.data(), x.data(), w.data(), m.data(), s.data(), R, D, dx.data(), dw.data(), db.data(),
                            1);
  INFO(test::train_ops_name(isa) << ", R = " << R << ", D = " << D);
  CHECK(max_rel(y, yd) <= 1e-5);
  CHECK(max_rel(m, md) <= 1e-6);
  CHECK(max_rel(s, sd) <= 1e-5);
  CHECK(max_rel(dx, dxd) <= 1e-4);
  CHECK(max_rel(dw, dwd) <= 1e-4);
  CHECK(max_rel(db, dbd) <= 1e-4);
  // the same bits for 2 threads
  std::vector<float> y2(n), m2(R), s2(R), dx2 = dx0, dw2(D, 0.5f), db2(D, -0.5f);
  train::layernorm_forward(x.data(), w.data(), b.data(), 1e-6f, R, D, y2.data(), m2.data(), s2.data(), 2);
  train::layernorm_backward(dy.data(), x.data(), w.data(), m2.data(), s2.data(), R, D, dx2.data(), dw2.data(),
                            db2.data(), 2);
  CHECK(y2 == y);
  CHECK(dx2 == dx);
  CHECK(dw2 == dw);
  CHECK(db2 == db);
}

}  // namespace

TEST_CASE("train: float LayerNorm forward and backward match the double ops, any width, on every build",
          "[train][layernorm]") {
  for (KernelIsa isa : test::isas_here())
    for (int D : {1, 5, 8, 12, 20, 48, 50})
      for (int R : {1, 37, 300}) check_layernorm(isa, R, D);
}
