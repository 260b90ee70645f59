// bf16.hpp: the float32 -> bfloat16 rounding against a float64 nearest-even reference, the
// emulated product against a float64 sum of the same rounded operands (with the float32
// accumulation bound), and every vector kernel this CPU has against the emulation, bit for bit.
// The AMX kernel on tiles in memory against float64 (its own order of sums), and the AMX
// instructions against it. Kernels the CPU lacks are skipped with a printed reason.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
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
  said = true;
  return kernels;
}

// The AMX instructions, where this CPU runs them (else the reason is printed once).
bool amx_or_skip() {
  static const std::string missing = bf16_kernel_missing(Bf16Kernel::Amx);
  static bool said = false;
  if (!missing.empty() && !said) std::cout << "test_gemm_bf16: skipping the AMX instructions: " << missing << "\n";
  said = true;
  return missing.empty();
}

struct NamedKernels {
  std::string name;
  const detail::Bf16GemmKernels* kern;
};

// Every kernel whose results a test can state without its order of sums: the vector kernels and
// the AMX instructions this CPU runs, the AMX kernel on tiles in memory, the emulation.
std::vector<NamedKernels> every_kernel() {
  std::vector<NamedKernels> kernels;
  for (Bf16Kernel kernel : vector_kernels_or_skip()) kernels.push_back({bf16_kernel_name(kernel), &detail::bf16_kernels(kernel)});
  if (amx_or_skip()) kernels.push_back({"amx", &detail::bf16_kernels(Bf16Kernel::Amx)});
  kernels.push_back({"amx on tiles in memory", &detail::kAmxSoftwareTilesGemm});
  kernels.push_back({"emulated", &detail::kEmulatedBf16Gemm});
  return kernels;
}

// Y = X W^T + b on `kern`.
std::vector<float> product(const detail::Bf16GemmKernels& kern, const std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<float>& b, const Shape& s, int threads,
                           LinearEpilogue epilogue = LinearEpilogue::Store, std::vector<float> y = {}) {
  PackedLinearBf16 packed;
  pack_linear_bf16(w.data(), s.n, s.k, packed);
  y.resize(static_cast<size_t>(s.m) * s.n);
  detail::linear_forward_bf16_with(kern, x.data(), s.k, s.m, packed, b.data(), y.data(), s.n, epilogue, threads);
  return y;
}

// The largest |y - float64 sum of the rounded operands| / ((K + 1) 2^-24 sum |terms|) over Y: at
// most 1 for a float32 accumulation of K exact products and a bias (Higham, Accuracy and
// Stability of Numerical Algorithms, 3.1), whatever the order of the adds. With y0 (Accumulate),
// y0 is one more term and K + 2 the count.
double worst_error_over_bound(const std::vector<float>& y, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& b, const Shape& s, const std::vector<float>* y0 = nullptr) {
  double worst = 0.0;
  const int adds = s.k + (y0 ? 2 : 1);
  for (int i = 0; i < s.m; ++i)
    for (int j = 0; j < s.n; ++j) {
      double ref = b[static_cast<size_t>(j)], magnitude = std::fabs(ref);
      if (y0) ref += (*y0)[static_cast<size_t>(i) * s.n + j], magnitude += std::fabs((*y0)[static_cast<size_t>(i) * s.n + j]);
      for (int p = 0; p < s.k; ++p) {
        const double term = static_cast<double>(round_to_bf16(x[static_cast<size_t>(i) * s.k + p])) *
                            round_to_bf16(w[static_cast<size_t>(j) * s.k + p]);
        ref += term;
        magnitude += std::fabs(term);
      }
      const double bound = adds * std::ldexp(1.0, -24) * magnitude;
      const double err = std::fabs(y[static_cast<size_t>(i) * s.n + j] - ref);
      if (err > bound) return err / std::max(bound, 1e-300);
      if (bound > 0) worst = std::max(worst, err / bound);
    }
  return worst;
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
    const double worst = worst_error_over_bound(product(detail::kEmulatedBf16Gemm, x, w, b, s, 1), x, w, b, s);
    INFO("m " << s.m << " n " << s.n << " k " << s.k << ": largest error / bound " << worst);
    CHECK(worst <= 1.0);
  }
}

// Shapes for the 16 x 48 AMX tile: a whole tile, edges of rows and columns, a pair tail inside a
// K block and after two whole ones (K = 2 x 256 + 38), odd K, K = 0, a ViT-B/16 fc2 at a few rows.
const Shape kAmxShapes[] = {{16, 48, 32},  {16, 48, 256}, {1, 1, 1},  {13, 50, 7},  {37, 97, 300},
                            {33, 96, 550}, {5, 60, 0},    {17, 49, 31}, {20, 768, 3072}};

TEST_CASE("AMX kernel on tiles in memory against float64 of the rounded operands", "[bf16][amx]") {
  std::mt19937 rng(17);
  for (const Shape& s : kAmxShapes) {
    std::vector<float> x = random_floats(static_cast<size_t>(s.m) * s.k, rng, -4.0f, 4.0f);
    for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;  // several binades
    const std::vector<float> w = random_floats(static_cast<size_t>(s.n) * s.k, rng, -0.5f, 0.5f);
    const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
    const std::vector<float> one = product(detail::kAmxSoftwareTilesGemm, x, w, b, s, 1);
    const double worst = worst_error_over_bound(one, x, w, b, s);
    INFO("m " << s.m << " n " << s.n << " k " << s.k << ": largest error / bound " << worst);
    CHECK(worst <= 1.0);
    // Each element is the same chain whichever thread computes it.
    const std::vector<float> two = product(detail::kAmxSoftwareTilesGemm, x, w, b, s, 2);
    CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    // Accumulate: Y0 + X W^T + b, Y0 read into the tiles.
    const std::vector<float> y0 = random_floats(one.size(), rng);
    const std::vector<float> acc = product(detail::kAmxSoftwareTilesGemm, x, w, b, s, 1, LinearEpilogue::Accumulate, y0);
    CHECK(worst_error_over_bound(acc, x, w, b, s, &y0) <= 1.0);
  }
}

TEST_CASE("AMX kernel sums in TDPBF16PS' order: even and odd products apart, then into C", "[bf16][amx]") {
  // One row, two pairs, W = 1: x = (1, 2^-24, 0, 2^-24). vdpbf16ps' order (the emulation):
  // ((0 + 2^-24) + 1) rounds to 1 (a tie, to even), and + 2^-24 again to 1. TDPBF16PS: the even
  // sum 1 + 0, the odd sum 2^-24 + 2^-24 = 2^-23, then C = 0 + (1 + 2^-23), exact.
  const Shape s{1, 1, 4};
  const float u = std::ldexp(1.0f, -24);
  const std::vector<float> x = {1.0f, u, 0.0f, u}, w = {1.0f, 1.0f, 1.0f, 1.0f}, b = {0.0f};
  CHECK(product(detail::kEmulatedBf16Gemm, x, w, b, s, 1)[0] == 1.0f);
  CHECK(product(detail::kAmxSoftwareTilesGemm, x, w, b, s, 1)[0] == 1.0f + 2 * u);
  if (amx_or_skip())  // which order the silicon keeps, for the record (the bound holds either way)
    std::cout << "test_gemm_bf16: the AMX instructions give " << std::hexfloat
              << product(detail::bf16_kernels(Bf16Kernel::Amx), x, w, b, s, 1)[0] << std::defaultfloat
              << " for (1 + 2^-24 + 2^-24), the manual's order 0x1.000002p+0\n";
}

TEST_CASE("AMX self-check: kernels within the bound agree, a wrong one does not", "[bf16][amx]") {
  // The check bf16_kernel() makes before it runs AMX (gemm_bf16.cpp): two orders of sums pass...
  CHECK(detail::bf16_kernels_agree(detail::kAmxSoftwareTilesGemm, detail::kEmulatedBf16Gemm));
  CHECK(detail::bf16_kernels_agree(detail::kEmulatedBf16Gemm, detail::kEmulatedBf16Gemm));
  // ... a kernel that leaves out one pair of k of each block does not.
  detail::Bf16GemmKernels dropping = detail::kEmulatedBf16Gemm;
  dropping.tile = [](int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b, float* c, int64_t ldc, bool load_c,
                     const float* bias) {
    detail::kEmulatedBf16Gemm.tile(std::max(0, k_pairs - 1), a, a_rs, b, c, ldc, load_c, bias);
  };
  CHECK_FALSE(detail::bf16_kernels_agree(detail::kAmxSoftwareTilesGemm, dropping));
  // The products run on AMX only where VITLENS_AMX=1 asks (the kernel is new to the hardware).
  if (!amx_requested()) CHECK(bf16_kernel() != Bf16Kernel::Amx);
  if (amx_or_skip()) {
    CHECK(detail::bf16_kernels_agree(detail::bf16_kernels(Bf16Kernel::Amx), detail::kAmxSoftwareTilesGemm));
    CHECK(bf16_kernel_missing(Bf16Kernel::Amx).empty());
  }
}

TEST_CASE("AMX kernel on tiles in memory refuses tiles outside a configuration", "[bf16][amx]") {
  // The instructions fault on a tile used without ldtilecfg (or after tilerelease): the software
  // tiles throw, so a driver that forgot thread_begin, or used a tile after thread_end, fails here.
  const detail::Bf16GemmKernels& k = detail::kAmxSoftwareTilesGemm;
  std::vector<bf16_t> a(16 * 32, 0), b(16 * 96, 0);
  std::vector<float> c(16 * 48, 1.0f);
  k.thread_begin();
  k.tile(16, a.data(), 32, b.data(), c.data(), 48, true, nullptr);
  k.thread_end();
  CHECK(c[0] == 1.0f);
  CHECK_THROWS_AS(k.tile(16, a.data(), 32, b.data(), c.data(), 48, true, nullptr), std::logic_error);
}

TEST_CASE("AMX instructions agree with the kernel on tiles in memory", "[bf16][amx]") {
  if (!amx_or_skip()) return;
  std::mt19937 rng(19);
  for (const Shape& s : kAmxShapes)
    for (int threads : {1, 2}) {
      std::vector<float> x = random_floats(static_cast<size_t>(s.m) * s.k, rng, -4.0f, 4.0f);
      for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;
      const std::vector<float> w = random_floats(static_cast<size_t>(s.n) * s.k, rng, -0.5f, 0.5f);
      const std::vector<float> b = random_floats(static_cast<size_t>(s.n), rng);
      const std::vector<float> hardware = product(detail::bf16_kernels(Bf16Kernel::Amx), x, w, b, s, threads);
      const std::vector<float> software = product(detail::kAmxSoftwareTilesGemm, x, w, b, s, threads);
      int differ = 0;
      for (size_t i = 0; i < hardware.size(); ++i) differ += std::memcmp(&hardware[i], &software[i], sizeof(float)) != 0;
      INFO("m " << s.m << " n " << s.n << " k " << s.k << " threads " << threads << ": " << differ << " of "
                << hardware.size() << " elements differ in their bits");
      CHECK(worst_error_over_bound(hardware, x, w, b, s) <= 1.0);
      if (differ > 0) std::cout << "test_gemm_bf16: AMX instructions and tiles in memory differ in " << differ << " of "
                                << hardware.size() << " elements (m " << s.m << " n " << s.n << " k " << s.k << ")\n";
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
  for (const NamedKernels& kernel : every_kernel()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    detail::linear_forward_bf16_with(*kernel.kern, x.data(), k, m, packed, b.data(), y.data(), n,
                                     LinearEpilogue::Store, 2);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = b[static_cast<size_t>(j)];
        for (int p = 0; p < k; ++p) ref += static_cast<double>(x[static_cast<size_t>(i) * k + p]) * w[static_cast<size_t>(j) * k + p];
        INFO(kernel.name << " element (" << i << ", " << j << ")");
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
  for (const NamedKernels& kernel : every_kernel()) {
    // A denormal already in Y, accumulated onto: read as zero too; the bias is added unflushed.
    std::vector<float> y(static_cast<size_t>(m) * n, tiny);
    detail::linear_forward_bf16_with(*kernel.kern, x.data(), k, m, packed, nullptr, y.data(), n,
                                     LinearEpilogue::Accumulate, 1);
    INFO(kernel.name);
    CHECK(y[0] == 0.0f);
    CHECK(y[static_cast<size_t>(n) + 1] == 0.0f);
    CHECK(y[2 * static_cast<size_t>(n)] == 0.0f);
    CHECK(y[3 * static_cast<size_t>(n)] == 1.0f);
    std::vector<float> with_bias(static_cast<size_t>(m) * n);
    b[0] = tiny;
    detail::linear_forward_bf16_with(*kernel.kern, x.data(), k, m, packed, b.data(), with_bias.data(),
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
  for (const NamedKernels& kernel : every_kernel()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    detail::linear_forward_bf16_with(*kernel.kern, x.data(), k, m, packed, nullptr, y.data(), n,
                                     LinearEpilogue::Store, 1);
    INFO(kernel.name);
    CHECK(std::isnan(y[0]));
    CHECK(std::isinf(y[static_cast<size_t>(n)]));
    CHECK(y[2 * static_cast<size_t>(n)] == 4.0f);
  }
}
