// gemm.hpp's kernels against plain reference loops in double, for every instruction set this CPU
// runs: the Linear products (forward, dX, dW) with every epilogue on odd shapes that cross the
// register tile and the cache blocks, the same numbers for any thread count, GELU over a sweep of
// all floats and special values, LayerNorm rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/cpu.hpp"
#include "core/cpu/gemm.hpp"
#include "test_support.hpp"

using namespace vitlens;

namespace {

using test::IsaGuard;

std::vector<float> random_floats(size_t count, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

double gelu_double(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// nn.GELU() in float, as vitlens computed it before the vector kernels: the 1e-6 promise is about this.
float gelu_float_reference(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

// Float rounding bound for a sum of `terms` products: terms * eps * sum |a b| (plus the extras).
constexpr double kEps = 1.2e-7;

// One product C = A B (+ bias) checked element by element against double loops. a_at(i, p),
// b_at(p, j) read the operands as the kernel under test does; c0 is C before (for accumulate).
template <class AAt, class BAt>
void check_product(int m, int n, int k, AAt a_at, BAt b_at, const float* bias, const std::vector<float>& c0,
                   const std::vector<float>& c, int64_t ldc, LinearEpilogue epilogue) {
  double worst = 0.0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int p = 0; p < k; ++p) {
        exact += static_cast<double>(a_at(i, p)) * b_at(p, j);
        magnitude += std::abs(static_cast<double>(a_at(i, p)) * b_at(p, j));
      }
      if (bias) exact += bias[j], magnitude += std::abs(bias[j]);
      if (epilogue == LinearEpilogue::Accumulate) {
        exact += c0[static_cast<size_t>(i * ldc + j)];
        magnitude += std::abs(c0[static_cast<size_t>(i * ldc + j)]);
      }
      double tolerance = (k + 3) * kEps * magnitude + 1e-30;
      if (epilogue == LinearEpilogue::Gelu) {
        // GELU' is at most 1.13; the vector GELU adds 1e-6 (absolute below 1, relative above).
        tolerance = 1.13 * tolerance + 1e-6 * std::max(1.0, std::abs(exact)) + kEps * std::abs(exact);
        exact = gelu_double(exact);
      }
      const double got = c[static_cast<size_t>(i * ldc + j)];
      const double err = std::abs(got - exact);
      worst = std::max(worst, err / tolerance);
      if (!(err <= tolerance)) {
        FAIL_CHECK("C(" << i << ", " << j << ") = " << got << ", reference " << exact << ", tolerance "
                        << tolerance << " (M " << m << ", N " << n << ", K " << k << ")");
        return;
      }
    }
  CHECK(worst <= 1.0);
}

struct Shape {
  int m, n, k;
};

// Odd sizes around the tiles (4/6/8 rows, 16/48 columns) and blocks (96 rows, 256 or 384 k, 960 columns).
const Shape kShapes[] = {{1, 1, 1},    {1, 17, 3},    {5, 1, 7},     {7, 15, 9},   {13, 33, 48},
                         {97, 50, 255}, {100, 48, 257}, {6, 16, 256},  {37, 144, 48}, {260, 1030, 520},
                         {3, 5, 0},    {193, 7, 31},  {8, 32, 600},  {9, 49, 20},  {17, 97, 300},
                         {8, 48, 600}, {11, 961, 40}, {13, 20, 383}, {7, 33, 385}, {12, 48, 769}};

}  // namespace

TEST_CASE("gemm: Linear forward, every epilogue, odd shapes, against double loops", "[gemm]") {
  IsaGuard guard;
  std::mt19937 rng(10);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      for (const Shape& s : kShapes)
        for (LinearEpilogue epilogue : {LinearEpilogue::Store, LinearEpilogue::Gelu, LinearEpilogue::Accumulate})
          for (bool with_bias : {true, false}) {
            // X (M, K) with a row stride larger than K, W (N, K), Y (M, N) with row stride N + 3.
            const int64_t ldx = s.k + 2, ldy = s.n + 3;
            const std::vector<float> x = random_floats(static_cast<size_t>(s.m * ldx), rng);
            const std::vector<float> w = random_floats(static_cast<size_t>(s.n * s.k) + 1, rng);
            const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
            const std::vector<float> y0 = random_floats(static_cast<size_t>(s.m * ldy), rng, -4.0f, 4.0f);
            std::vector<float> y = y0;
            linear_forward(x.data(), ldx, s.m, s.k, w.data(), s.n, with_bias ? b.data() : nullptr, y.data(), ldy,
                           epilogue, 1);
            check_product(
                s.m, s.n, s.k, [&](int i, int p) { return x[static_cast<size_t>(i * ldx + p)]; },
                [&](int p, int j) { return w[static_cast<size_t>(j * s.k + p)]; }, with_bias ? b.data() : nullptr, y0,
                y, ldy, epilogue);
            // The padding between rows is never written.
            for (int i = 0; i < s.m; ++i)
              for (int64_t j = s.n; j < ldy; ++j) REQUIRE(y[static_cast<size_t>(i * ldy + j)] == y0[static_cast<size_t>(i * ldy + j)]);
          }
    }
  }
}

TEST_CASE("gemm: packed Linear weights give linear_forward's bits, any ISA, 1 and 2 threads", "[gemm][packed]") {
  IsaGuard guard;
  std::mt19937 rng(14);
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  // M = 1 over a wide layer (split by columns between threads); tall (split by rows) with K 300
  // (one k block of 384, two of 256) and 800 (three k blocks of 384, four of 256).
  shapes.push_back({1, 3000, 300});
  shapes.push_back({700, 144, 300});
  shapes.push_back({700, 144, 800});
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      PackedLinear packed;  // reused for every shape, as the forward reuses it for every layer
      for (const Shape& s : shapes) {
        const int64_t ldx = s.k + 2, ldy = s.n + 3;
        const std::vector<float> x = random_floats(static_cast<size_t>(s.m * ldx), rng);
        const std::vector<float> w = random_floats(static_cast<size_t>(s.n * s.k) + 1, rng);
        const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
        const std::vector<float> y0 = random_floats(static_cast<size_t>(s.m * ldy), rng, -4.0f, 4.0f);
        for (int threads : {1, 2}) {
          pack_linear(w.data(), s.n, s.k, packed, threads);
          for (LinearEpilogue epilogue : {LinearEpilogue::Store, LinearEpilogue::Gelu, LinearEpilogue::Accumulate})
            for (bool with_bias : {true, false}) {
              const float* bias = with_bias ? b.data() : nullptr;
              std::vector<float> expected = y0, got = y0;
              linear_forward(x.data(), ldx, s.m, s.k, w.data(), s.n, bias, expected.data(), ldy, epilogue, threads);
              linear_forward_packed(x.data(), ldx, s.m, packed, bias, got.data(), ldy, epilogue, threads);
              INFO("M " << s.m << ", N " << s.n << ", K " << s.k << ", threads " << threads << ", epilogue "
                        << static_cast<int>(epilogue) << ", bias " << with_bias);
              REQUIRE(std::memcmp(expected.data(), got.data(), sizeof(float) * got.size()) == 0);
              if (epilogue == LinearEpilogue::Store && s.m * s.n * s.k < 2000000)  // and right, not only equal
                check_product(
                    s.m, s.n, s.k, [&](int i, int p) { return x[static_cast<size_t>(i * ldx + p)]; },
                    [&](int p, int j) { return w[static_cast<size_t>(j * s.k + p)]; }, bias, y0, got, ldy, epilogue);
            }
        }
      }
    }
  }
}

TEST_CASE("gemm: packed weights after set_kernel_isa still give the active kernels' numbers", "[gemm][packed]") {
  IsaGuard guard;
  std::mt19937 rng(15);
  const std::vector<KernelIsa> isas = test::isas_here();
  const int m = 37, n = 70, k = 300;
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), rng);
  const std::vector<float> w = random_floats(static_cast<size_t>(n * k), rng);
  const std::vector<float> b = random_floats(static_cast<size_t>(n), rng);
  for (KernelIsa packed_for : isas)
    for (KernelIsa run_on : isas) {
      set_kernel_isa(packed_for);
      PackedLinear packed;
      pack_linear(w.data(), n, k, packed, 1);
      set_kernel_isa(run_on);
      std::vector<float> expected(static_cast<size_t>(m * n)), got(expected.size(), -7.0f);
      linear_forward(x.data(), k, m, k, w.data(), n, b.data(), expected.data(), n, LinearEpilogue::Store, 1);
      linear_forward_packed(x.data(), k, m, packed, b.data(), got.data(), n, LinearEpilogue::Store, 1);
      INFO("packed for " << kernel_isa_name(packed_for) << ", run on " << kernel_isa_name(run_on));
      CHECK(std::memcmp(expected.data(), got.data(), sizeof(float) * got.size()) == 0);
    }
  // Never packed: an error, not a read of empty panels.
  PackedLinear empty;
  std::vector<float> y(static_cast<size_t>(m * n));
  CHECK_THROWS_WITH(linear_forward_packed(x.data(), k, m, empty, nullptr, y.data(), n),
                    Catch::Contains("never packed"));
}

TEST_CASE("gemm: the products training needs, dX = dY W and dW += dY^T X, and db", "[gemm]") {
  IsaGuard guard;
  std::mt19937 rng(11);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      for (const Shape& s : kShapes) {
        // Linear (K inputs -> N outputs) over M rows: dY (M, N), W (N, K), X (M, K).
        const std::vector<float> dy = random_floats(static_cast<size_t>(s.m * s.n), rng);
        const std::vector<float> w = random_floats(static_cast<size_t>(s.n * s.k) + 1, rng);
        const std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k) + 1, rng);
        for (bool accumulate : {false, true}) {
          const std::vector<float> dx0 = random_floats(static_cast<size_t>(s.m * s.k), rng);
          std::vector<float> dx = dx0;
          linear_backward_input(dy.data(), s.n, s.m, s.n, w.data(), s.k, dx.data(), s.k, accumulate, 2);
          check_product(
              s.m, s.k, s.n, [&](int i, int p) { return dy[static_cast<size_t>(i * s.n + p)]; },
              [&](int p, int j) { return w[static_cast<size_t>(p * s.k + j)]; }, nullptr, dx0, dx, s.k,
              accumulate ? LinearEpilogue::Accumulate : LinearEpilogue::Store);
        }
        const std::vector<float> dw0 = random_floats(static_cast<size_t>(s.n * s.k), rng);
        const std::vector<float> db0 = random_floats(static_cast<size_t>(s.n), rng);
        std::vector<float> dw = dw0, db = db0;
        linear_backward_weight(dy.data(), s.n, s.m, s.n, x.data(), s.k, s.k, dw.data(), db.data(), 2);
        check_product(
            s.n, s.k, s.m, [&](int i, int p) { return dy[static_cast<size_t>(p * s.n + i)]; },
            [&](int p, int j) { return x[static_cast<size_t>(p * s.k + j)]; }, nullptr, dw0, dw, s.k,
            LinearEpilogue::Accumulate);
        for (int j = 0; j < s.n; ++j) {
          double exact = db0[static_cast<size_t>(j)], magnitude = std::abs(exact);
          for (int i = 0; i < s.m; ++i) exact += dy[static_cast<size_t>(i * s.n + j)], magnitude += std::abs(dy[static_cast<size_t>(i * s.n + j)]);
          REQUIRE(std::abs(db[static_cast<size_t>(j)] - exact) <= (s.m + 2) * kEps * magnitude);
        }
      }
    }
  }
}

TEST_CASE("gemm: the same bits for any thread count", "[gemm][threads]") {
  IsaGuard guard;
  std::mt19937 rng(12);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      // Tall (split by rows) and wide (split by columns) products.
      for (const Shape& s : {Shape{700, 144, 48}, Shape{37, 1500, 300}}) {
        const std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), rng);
        const std::vector<float> w = random_floats(static_cast<size_t>(s.n * s.k), rng);
        const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
        std::vector<float> one(static_cast<size_t>(s.m * s.n));
        linear_forward(x.data(), s.k, s.m, s.k, w.data(), s.n, b.data(), one.data(), s.n, LinearEpilogue::Gelu, 1);
        for (int threads : {2, 3, 5}) {
          std::vector<float> many(one.size(), -7.0f);
          linear_forward(x.data(), s.k, s.m, s.k, w.data(), s.n, b.data(), many.data(), s.n, LinearEpilogue::Gelu,
                         threads);
          INFO("threads " << threads << ", M " << s.m << ", N " << s.n);
          CHECK(std::memcmp(one.data(), many.data(), sizeof(float) * one.size()) == 0);
        }
      }
      // Weight gradients dW (N, K) += dY^T X over M = 1000 rows: 144 x 48 (split by rows at
      // multiples of the tile), 48 x 96 (by columns at multiples of the tile), 40 x 40 (fewer rows
      // than one 96-row block).
      for (const Shape& s : {Shape{1000, 144, 48}, Shape{1000, 48, 96}, Shape{1000, 40, 40}}) {
        const std::vector<float> dy = random_floats(static_cast<size_t>(s.m * s.n), rng);
        const std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), rng);
        const std::vector<float> start = random_floats(static_cast<size_t>(s.n * s.k), rng);
        std::vector<float> one = start;
        linear_backward_weight(dy.data(), s.n, s.m, s.n, x.data(), s.k, s.k, one.data(), nullptr, 1);
        for (int threads : {2, 3, 5}) {
          std::vector<float> many = start;
          linear_backward_weight(dy.data(), s.n, s.m, s.n, x.data(), s.k, s.k, many.data(), nullptr, threads);
          INFO("dW, threads " << threads << ", N " << s.n << ", K " << s.k);
          CHECK(std::memcmp(one.data(), many.data(), sizeof(float) * one.size()) == 0);
        }
      }
    }
  }
}

TEST_CASE("gelu: within 1e-6 of the std::erf formula over a sweep of all floats, special values", "[gemm][gelu]") {
  IsaGuard guard;
  // Every 97th bit pattern of the finite floats (44 million), both signs.
  std::vector<float> x;
  x.reserve(45000000);
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 97) {
    float v;
    const uint32_t b32 = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b32, sizeof v);
    x.push_back(v);
    x.push_back(-v);
  }
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      std::vector<float> y = x;
      gelu_inplace(y.data(), static_cast<int64_t>(y.size()));
      double worst = 0.0;
      float worst_x = 0.0f;
      size_t failures = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float ref = gelu_float_reference(x[i]);
        const double err = std::abs(static_cast<double>(y[i]) - ref) / std::max(1.0, std::abs(static_cast<double>(ref)));
        if (!(err <= 1e-6)) ++failures;
        if (err > worst || std::isnan(err)) worst = err, worst_x = x[i];
      }
      WARN(kernel_isa_name(isa) << ": largest GELU difference " << worst << " (scaled by max(1, |GELU|)) at x = "
                                << worst_x << " over " << x.size() << " floats");
      CHECK(failures == 0);
      CHECK(worst <= 1e-6);

      const float inf = std::numeric_limits<float>::infinity();
      float special[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                         std::numeric_limits<float>::denorm_min(), 1.0f, -1.0f, -5.5f};
      gelu_inplace(special, 11);
      CHECK(special[0] == 0.0f);
      CHECK(special[1] == 0.0f);
      CHECK(special[2] == inf);
      CHECK(special[3] == 0.0f);  // the limit (the float formula gives -inf * 0 = NaN)
      CHECK(std::isnan(special[4]));
      CHECK(special[5] == std::numeric_limits<float>::max());
      CHECK(special[6] == 0.0f);
      CHECK(std::abs(special[7]) <= std::numeric_limits<float>::min());
      CHECK(special[8] == Approx(gelu_double(1.0)).epsilon(1e-6));
      CHECK(special[9] == Approx(gelu_double(-1.0)).epsilon(1e-6));
      // GELU(-5.5) = -1.04e-7: the float formula loses it to cancellation in 1 + erf (error 6e-8,
      // within the promised 1e-6); the vector kernels compute erfc directly, to about 1 %.
      CHECK(std::abs(special[10] - gelu_double(-5.5)) <= 1e-6);
      if (isa != KernelIsa::Portable) CHECK(std::abs(special[10] - gelu_double(-5.5)) <= 1e-2 * std::abs(gelu_double(-5.5)));
      // Lengths that are not a multiple of the vector width round as the full vectors do.
      std::vector<float> odd(x.begin(), x.begin() + 37), full(x.begin(), x.begin() + 48);
      gelu_inplace(odd.data(), 37);
      gelu_inplace(full.data(), 48);
      CHECK(std::memcmp(odd.data(), full.data(), sizeof(float) * 37) == 0);
    }
  }
}

TEST_CASE("layer norm rows: against double loops, offsets, in place", "[gemm][layer_norm]") {
  IsaGuard guard;
  std::mt19937 rng(13);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      for (int dim : {1, 7, 8, 16, 17, 48, 63, 384, 769})
        for (float offset : {0.0f, 1000.0f}) {
          const int rows = 5;
          const int64_t ldx = dim + 1;
          std::vector<float> x = random_floats(static_cast<size_t>(rows * ldx), rng);
          for (float& v : x) v += offset;
          const std::vector<float> w = random_floats(static_cast<size_t>(dim), rng, -2.0f, 2.0f);
          const std::vector<float> b = random_floats(static_cast<size_t>(dim), rng);
          const float eps = 1e-6f;
          std::vector<float> out(static_cast<size_t>(rows * dim));
          layer_norm_rows(x.data(), ldx, rows, dim, w.data(), b.data(), eps, out.data(), dim);
          for (int i = 0; i < rows; ++i) {
            const float* row = x.data() + i * ldx;
            double mean = 0.0, var = 0.0;
            for (int c = 0; c < dim; ++c) mean += row[c];
            mean /= dim;
            for (int c = 0; c < dim; ++c) var += (row[c] - mean) * (row[c] - mean);
            var /= dim;
            for (int c = 0; c < dim; ++c) {
              const double normed = (row[c] - mean) / std::sqrt(var + eps);
              const double exact = normed * w[static_cast<size_t>(c)] + b[static_cast<size_t>(c)];
              // Three float roundings (normed, * w, + b) of at most half an ulp each.
              const double tolerance = 2 * kEps * (std::abs(normed * w[static_cast<size_t>(c)]) + std::abs(exact)) + 1e-30;
              REQUIRE(std::abs(out[static_cast<size_t>(i * dim + c)] - exact) <= tolerance);
            }
          }
          // In place (out == x, same stride) gives the same numbers.
          layer_norm_rows(x.data(), ldx, rows, dim, w.data(), b.data(), eps, x.data(), ldx);
          for (int i = 0; i < rows; ++i)
            CHECK(std::memcmp(x.data() + i * ldx, out.data() + i * dim, sizeof(float) * static_cast<size_t>(dim)) == 0);
        }
    }
  }
}

TEST_CASE("gemm: a row's bits do not depend on whether it falls in a full or an edge row panel", "[gemm]") {
  // The forward's products have 197 rows: 24 whole row panels of 8 and an edge of 5, which the
  // AVX-512 tile computes on a copy padded with zero rows. Row i of X W^T must be the same FMA
  // chain there as in a whole panel: run the same rows as the last rows of a product (an edge of
  // 1 to 7 rows with the 8-row tile; the other tiles, of 6 and 4 rows, cut elsewhere) and inside a
  // product whose panels are whole, and compare the bits.
  IsaGuard guard;
  std::mt19937 rng(31);
  for (KernelIsa isa : test::isas_here()) {
    set_kernel_isa(isa);
    DYNAMIC_SECTION(kernel_isa_name(isa)) {
      for (const int k : {48, 384, 600, 1000}) {  // k blocks of 384 (of 256): 1 (1), 1 (2), 2 (3), 3 (4)
        const int n = 96;
        const std::vector<float> w = random_floats(static_cast<size_t>(n) * k, rng);
        const std::vector<float> b = random_floats(static_cast<size_t>(n), rng);
        PackedLinear packed;
        pack_linear(w.data(), n, k, packed);
        for (const int edge : {1, 3, 5, 7}) {
          // Rows [0, 16 + edge) end in an edge of `edge` rows; rows [8, 24) are two whole panels.
          const std::vector<float> x = random_floats(static_cast<size_t>(24) * k, rng);
          const int m = 16 + edge;
          std::vector<float> tail(static_cast<size_t>(m) * n), head(static_cast<size_t>(16) * n);
          for (const LinearEpilogue epilogue : {LinearEpilogue::Store, LinearEpilogue::Gelu}) {
            linear_forward_packed(x.data(), k, m, packed, b.data(), tail.data(), n, epilogue);
            // Row 16 + e of the first product is row 8 + e of the second.
            linear_forward_packed(x.data() + static_cast<size_t>(8) * k, k, 16, packed, b.data(), head.data(), n,
                                  epilogue);
            INFO("K " << k << ", edge " << edge << ", epilogue " << static_cast<int>(epilogue));
            CHECK(std::memcmp(tail.data() + static_cast<size_t>(16) * n, head.data() + static_cast<size_t>(8) * n,
                              sizeof(float) * static_cast<size_t>(edge) * n) == 0);
          }
        }
      }
    }
  }
}
