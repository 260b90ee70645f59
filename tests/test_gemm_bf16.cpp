// bf16.hpp: the float32 -> bfloat16 rounding against a float64 nearest-even reference, the
// emulated product against a float64 sum of the same rounded operands (with the float32
// accumulation bound), and every vector kernel this CPU has against the emulation, bit for bit.
// Kernels the CPU lacks are skipped with a printed reason.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/bf16.hpp"
#include "core/cpu/cpu.hpp"

using namespace vitlens;

namespace {

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// The bfloat16 nearest to x by comparing the two candidates around it in double; ties to the even
// mantissa. For finite x only.
bf16_t nearest_bf16_reference(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t below = bits & 0xffff0000u, above = below + 0x10000u;
  const double d_below = std::fabs(static_cast<double>(x) - from_bits(below));
  // `above` may be past the largest finite bfloat16: then it is the infinity x rounds to when x is
  // at least halfway there, and its distance is measured to 2^128.
  const double above_value = (above & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                                   : static_cast<double>(from_bits(above));
  const double d_above = std::fabs(static_cast<double>(x) - above_value);
  if (d_below < d_above) return static_cast<bf16_t>(below >> 16);
  if (d_above < d_below) return static_cast<bf16_t>(above >> 16);
  return static_cast<bf16_t>(((below >> 16) & 1u) ? above >> 16 : below >> 16);
}

std::vector<float> random_floats(size_t count, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int m, n, k;
};
// Shapes crossing the 8 x 48 tile (edge rows and columns), odd K (a padded pair), the 128-pair
// K block (K = 300, 513), K = 0 (the bias alone), and a ViT-B/16 MLP's fc2 at a few rows.
const Shape kShapes[] = {{1, 1, 1}, {13, 50, 7}, {8, 48, 256}, {37, 97, 300}, {9, 96, 513}, {5, 60, 0}, {20, 768, 3072}};

std::vector<Bf16Kernel> vector_kernels_or_skip() {
  std::vector<Bf16Kernel> kernels;
  static bool said = false;  // the skip lines once per run
  if (bf16_kernel_supported(Bf16Kernel::Avx512Bf16)) kernels.push_back(Bf16Kernel::Avx512Bf16);
  else if (!said) std::cout << "test_gemm_bf16: skipping the avx512bf16 kernel: this CPU has no avx512_bf16\n";
  if (bf16_kernel_supported(Bf16Kernel::Avx2)) kernels.push_back(Bf16Kernel::Avx2);
  else if (!said) std::cout << "test_gemm_bf16: skipping the avx2 kernel: this CPU has no AVX2 and FMA\n";
  if (!said) std::cout << "test_gemm_bf16: no AMX-BF16 kernel exists in this build (none was written without a CPU to test it)\n";
  said = true;
  return kernels;
}

// The vector kernels this CPU runs, then the emulation.
std::vector<Bf16Kernel> every_kernel() {
  std::vector<Bf16Kernel> kernels = vector_kernels_or_skip();
  kernels.push_back(Bf16Kernel::Emulated);
  return kernels;
}

}  // namespace

TEST_CASE("float_to_bf16 rounds to nearest even and keeps NaN quiet", "[bf16]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(from_bits(0x3f808000u)) == 0x3f80);  // tie, even below
  CHECK(float_to_bf16(from_bits(0x3f818000u)) == 0x3f82);  // tie, even above
  CHECK(float_to_bf16(from_bits(0x3f808001u)) == 0x3f81);  // just past the tie
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest bfloat16
  CHECK(float_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);              // the largest that does not
  // NaNs: every payload stays a NaN, quiet, with its sign; a signalling NaN whose payload is all
  // in the low half would otherwise round to an infinity.
  for (uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fbfffffu, 0xffffffffu}) {
    const bf16_t h = float_to_bf16(from_bits(nan));
    CHECK(std::isnan(bf16_to_float(h)));
    CHECK((h & 0x0040u) != 0);
    CHECK((h & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  // A sweep over every 251st finite bit pattern of both signs against the float64 reference.
  int64_t checked = 0;
  for (uint64_t bits = 0; bits < 0x100000000ull; bits += 251) {
    const float x = from_bits(static_cast<uint32_t>(bits));
    if (!std::isfinite(x)) continue;
    const bf16_t got = float_to_bf16(x), want = nearest_bf16_reference(x);
    if (got != want) FAIL("float_to_bf16(bits 0x" << std::hex << bits << ") = 0x" << got << ", want 0x" << want);
    ++checked;
  }
  CHECK(checked > 16000000);
}

TEST_CASE("Emulated bf16 product against float64 of the rounded operands", "[bf16]") {
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    const std::vector<float> x = random_floats(static_cast<size_t>(s.m) * s.k, rng);
    const std::vector<float> w = random_floats(static_cast<size_t>(s.n) * s.k, rng);
    const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
    PackedLinearBf16 packed;
    pack_linear_bf16(w.data(), s.n, s.k, packed);
    std::vector<float> y(static_cast<size_t>(s.m) * s.n);
    detail::linear_forward_bf16_with(detail::kEmulatedBf16Gemm, x.data(), s.k, s.m, packed, b.data(), y.data(), s.n,
                                     LinearEpilogue::Store, 1);
    // The float32 accumulation of K exact products plus a bias: |error| <= (K + 1) u sum |terms|,
    // u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
    double worst_ratio = 0.0;
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        double ref = b[static_cast<size_t>(j)], magnitude = std::fabs(ref);
        for (int p = 0; p < s.k; ++p) {
          const double term = static_cast<double>(round_to_bf16(x[static_cast<size_t>(i) * s.k + p])) *
                              round_to_bf16(w[static_cast<size_t>(j) * s.k + p]);
          ref += term;
          magnitude += std::fabs(term);
        }
        const double bound = (s.k + 1) * std::ldexp(1.0, -24) * magnitude;
        const double err = std::fabs(y[static_cast<size_t>(i) * s.n + j] - ref);
        REQUIRE(err <= bound);
        if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
      }
    INFO("m " << s.m << " n " << s.n << " k " << s.k << ": largest error / bound " << worst_ratio);
    CHECK(worst_ratio <= 1.0);
  }
}

TEST_CASE("bf16 products equal float64 where every sum is exact", "[bf16]") {
  // Small integers are exact in bfloat16 and every partial sum is exact in float32: the product
  // must be exact whatever the kernel, so a wrong pair, panel or edge shows here.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-8, 8);
  const int m = 11, n = 53, k = 301;
  std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k), b(static_cast<size_t>(n));
  for (float& v : x) v = static_cast<float>(small(rng));
  for (float& v : w) v = static_cast<float>(small(rng));
  for (float& v : b) v = static_cast<float>(small(rng));
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), n, k, packed);
  for (Bf16Kernel kernel : every_kernel()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    detail::linear_forward_bf16_with(detail::bf16_kernels(kernel), x.data(), k, m, packed, b.data(), y.data(), n,
                                     LinearEpilogue::Store, 2);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = b[static_cast<size_t>(j)];
        for (int p = 0; p < k; ++p) ref += static_cast<double>(x[static_cast<size_t>(i) * k + p]) * w[static_cast<size_t>(j) * k + p];
        INFO(bf16_kernel_name(kernel) << " element (" << i << ", " << j << ")");
        REQUIRE(y[static_cast<size_t>(i) * n + j] == static_cast<float>(ref));
      }
  }
}

TEST_CASE("Vector bf16 kernels equal the emulation bit for bit", "[bf16]") {
  const std::vector<Bf16Kernel> kernels = vector_kernels_or_skip();
  std::mt19937 rng(5);
  for (Bf16Kernel kernel : kernels)
    for (const Shape& s : kShapes)
      for (LinearEpilogue epilogue : {LinearEpilogue::Store, LinearEpilogue::Gelu, LinearEpilogue::Accumulate}) {
        // Inputs over several binades, so that the order of the adds shows in the last bits.
        std::vector<float> x = random_floats(static_cast<size_t>(s.m) * s.k, rng, -4.0f, 4.0f);
        for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;
        const std::vector<float> w = random_floats(static_cast<size_t>(s.n) * s.k, rng, -0.5f, 0.5f);
        const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
        const std::vector<float> y0 = random_floats(static_cast<size_t>(s.m) * s.n, rng);
        PackedLinearBf16 packed;
        pack_linear_bf16(w.data(), s.n, s.k, packed);
        std::vector<float> want = y0, got = y0;
        detail::linear_forward_bf16_with(detail::kEmulatedBf16Gemm, x.data(), s.k, s.m, packed, b.data(), want.data(),
                                         s.n, epilogue, 1);
        for (int threads : {1, 2}) {
          got = y0;
          detail::linear_forward_bf16_with(detail::bf16_kernels(kernel), x.data(), s.k, s.m, packed, b.data(),
                                           got.data(), s.n, epilogue, threads);
          int differ = 0;
          for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
          INFO(bf16_kernel_name(kernel) << " m " << s.m << " n " << s.n << " k " << s.k << " epilogue "
                                        << static_cast<int>(epilogue) << " threads " << threads);
          CHECK(differ == 0);
        }
      }
}

TEST_CASE("bf16 Gelu epilogue is the Store product then gelu_inplace", "[bf16]") {
  std::mt19937 rng(9);
  const int m = 19, n = 100, k = 70;
  const std::vector<float> x = random_floats(static_cast<size_t>(m) * k, rng, -3.0f, 3.0f);
  const std::vector<float> w = random_floats(static_cast<size_t>(n) * k, rng);
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), n, k, packed);
  std::vector<float> stored(static_cast<size_t>(m) * n), fused(stored.size());
  linear_forward_bf16(x.data(), k, m, packed, nullptr, stored.data(), n, LinearEpilogue::Store, 2);
  linear_forward_bf16(x.data(), k, m, packed, nullptr, fused.data(), n, LinearEpilogue::Gelu, 2);
  gelu_inplace(stored.data(), static_cast<int64_t>(stored.size()));
  CHECK(std::memcmp(stored.data(), fused.data(), stored.size() * sizeof(float)) == 0);
}

TEST_CASE("bf16 products read denormals as zero and flush denormal sums as vdpbf16ps does", "[bf16]") {
  const float tiny = std::ldexp(1.0f, -130);  // a denormal float32 (and bfloat16)
  const float small = std::ldexp(1.0f, -100), min_normal = std::numeric_limits<float>::min();
  const int m = 8, n = 48, k = 4;
  std::vector<float> x(static_cast<size_t>(m) * k, 0.0f), w(static_cast<size_t>(n) * k, 0.0f), b(n, 0.0f);
  // Row 0: a denormal operand times 1 (read as zero). Row 1: two products of 2^-100 * 2^-27 = 2^-127
  // (each exact and denormal: flushed after each add, so the sum stays 0). Row 2: -min_normal * 1
  // (the odd element, first), then 1.5 min_normal * 1: the sum 2^-127 is denormal, flushed.
  // Row 3: tiny * 1 (zero), then 1 * 1.
  // Column 0 of W is 1 everywhere, column 1 holds 2^-27.
  for (int p = 0; p < k; ++p) w[static_cast<size_t>(p)] = 1.0f, w[static_cast<size_t>(k + p)] = std::ldexp(1.0f, -27);
  x[0] = tiny;
  x[static_cast<size_t>(k)] = small, x[static_cast<size_t>(k) + 1] = small;
  x[2 * static_cast<size_t>(k)] = 1.5f * min_normal, x[2 * static_cast<size_t>(k) + 1] = -min_normal;
  x[3 * static_cast<size_t>(k)] = 1.0f, x[3 * static_cast<size_t>(k) + 1] = tiny;
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), n, k, packed);
  for (Bf16Kernel kernel : every_kernel()) {
    // A denormal already in Y, accumulated onto: read as zero too; the bias is added unflushed.
    std::vector<float> y(static_cast<size_t>(m) * n, tiny);
    detail::linear_forward_bf16_with(detail::bf16_kernels(kernel), x.data(), k, m, packed, nullptr, y.data(), n,
                                     LinearEpilogue::Accumulate, 1);
    INFO(bf16_kernel_name(kernel));
    CHECK(y[0] == 0.0f);
    CHECK(y[static_cast<size_t>(n) + 1] == 0.0f);
    CHECK(y[2 * static_cast<size_t>(n)] == 0.0f);
    CHECK(y[3 * static_cast<size_t>(n)] == 1.0f);
    std::vector<float> with_bias(static_cast<size_t>(m) * n);
    b[0] = tiny;
    detail::linear_forward_bf16_with(detail::bf16_kernels(kernel), x.data(), k, m, packed, b.data(), with_bias.data(),
                                     n, LinearEpilogue::Store, 1);
    CHECK(with_bias[0] == tiny);  // 0 + the denormal bias, as the emulation adds it
  }
}

TEST_CASE("bf16 product keeps NaN and infinity", "[bf16]") {
  const int m = 8, n = 48, k = 4;
  std::vector<float> x(static_cast<size_t>(m) * k, 1.0f), w(static_cast<size_t>(n) * k, 1.0f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[static_cast<size_t>(k)] = std::numeric_limits<float>::infinity();
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), n, k, packed);
  for (Bf16Kernel kernel : every_kernel()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    detail::linear_forward_bf16_with(detail::bf16_kernels(kernel), x.data(), k, m, packed, nullptr, y.data(), n,
                                     LinearEpilogue::Store, 1);
    INFO(bf16_kernel_name(kernel));
    CHECK(std::isnan(y[0]));
    CHECK(std::isinf(y[static_cast<size_t>(n)]));
    CHECK(y[2 * static_cast<size_t>(n)] == 4.0f);
  }
}
