// The training attention op (train_ops.hpp: attention_forward / attention_backward) on its own,
// against a plain triple-loop reference in double written from the formulas:
//   P = softmax(Q K^T * scale) over the allowed keys, O = P V,
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q
// (dqkv is written, not accumulated: it starts full of other values here).
// Shapes include the default recipe's (N = 50, d = 12) and ones that fill no whole vector block
// (N = 13, d = 5; N = 1; N = 65, d = 32). Every float result must be within 2e-6 of the reference
// in the max norm relative to the tensor's largest value (float rounding of sums over N <= 65
// terms: measured up to 5.6e-7); masked keys must get exactly 0, a row with every key masked a
// zero row, and the numbers must be bit-identical for 1 and 2 threads and for inputs at another
// address.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "core/train/train_ops.hpp"

using namespace vitlens;

namespace {

struct AttentionCase {
  int B, N, D, H;
};

struct Reference {
  std::vector<double> probs, ctx, dqkv;
};

// The reference: per image and head, straight from the formulas above.
Reference reference(const AttentionCase& c, const std::vector<float>& qkv, const std::vector<uint8_t>& allowed,
                    const std::vector<float>& dctx, double scale) {
  const int B = c.B, N = c.N, D = c.D, H = c.H, d = D / H;
  Reference r;
  r.probs.assign(static_cast<size_t>(B) * H * N * N, 0.0);
  r.ctx.assign(static_cast<size_t>(B) * N * D, 0.0);
  r.dqkv.assign(static_cast<size_t>(B) * N * 3 * D, 0.0);
  auto at = [&](int b, int i, int part, int h, int t) {
    return (static_cast<size_t>(b) * N + i) * 3 * D + static_cast<size_t>(part) * D + h * d + t;
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::vector<double> p(static_cast<size_t>(N) * N, 0.0), ds(static_cast<size_t>(N) * N, 0.0);
      for (int i = 0; i < N; ++i) {
        std::vector<double> s(N, -INFINITY);
        double top = -INFINITY;
        for (int j = 0; j < N; ++j) {
          if (!allowed[static_cast<size_t>(b) * N + j]) continue;
          double dot = 0.0;
          for (int t = 0; t < d; ++t) dot += static_cast<double>(qkv[at(b, i, 0, h, t)]) * qkv[at(b, j, 1, h, t)];
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        if (top == -INFINITY) continue;  // a zero row
        double sum = 0.0;
        for (int j = 0; j < N; ++j) sum += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - top);
        for (int j = 0; j < N; ++j)
          p[static_cast<size_t>(i) * N + j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - top) / sum;
      }
      for (int i = 0; i < N; ++i) {
        const float* dout_i = dctx.data() + (static_cast<size_t>(b) * N + i) * D + h * d;
        const auto g = [&](int t) { return static_cast<double>(dout_i[t]); };
        for (int t = 0; t < d; ++t) {
          double o = 0.0;
          for (int j = 0; j < N; ++j) o += p[static_cast<size_t>(i) * N + j] * qkv[at(b, j, 2, h, t)];
          r.ctx[(static_cast<size_t>(b) * N + i) * D + h * d + t] = o;
        }
        double row_dot = 0.0;
        std::vector<double> dp(N);
        for (int j = 0; j < N; ++j) {
          double v = 0.0;
          for (int t = 0; t < d; ++t) v += g(t) * qkv[at(b, j, 2, h, t)];
          dp[j] = v;
          row_dot += p[static_cast<size_t>(i) * N + j] * v;
        }
        for (int j = 0; j < N; ++j) {
          const double pij = p[static_cast<size_t>(i) * N + j];
          ds[static_cast<size_t>(i) * N + j] = pij * (dp[j] - row_dot) * scale;
          for (int t = 0; t < d; ++t) r.dqkv[at(b, j, 2, h, t)] += pij * g(t);  // dV = P^T dO
        }
      }
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < N; ++j) {
          const double dsij = ds[static_cast<size_t>(i) * N + j];
          for (int t = 0; t < d; ++t) {
            r.dqkv[at(b, i, 0, h, t)] += dsij * qkv[at(b, j, 1, h, t)];  // dQ = dS K
            r.dqkv[at(b, j, 1, h, t)] += dsij * qkv[at(b, i, 0, h, t)];  // dK = dS^T Q
          }
        }
      const size_t head = (static_cast<size_t>(b) * H + h) * N * N;
      std::copy(p.begin(), p.end(), r.probs.begin() + static_cast<std::ptrdiff_t>(head));
    }
  return r;
}

double max_norm_rel(const float* got, const std::vector<double>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

struct Result {
  std::vector<float> probs, ctx, dqkv;
};

// Runs the op on copies of the inputs placed `shift` floats into fresh buffers (another address),
// dqkv holding `dqkv_start` before (the op writes it: none of it may survive).
Result run(const AttentionCase& c, const std::vector<float>& qkv, const std::vector<uint8_t>& allowed,
           const std::vector<float>& dctx, const std::vector<float>& dqkv_start, float scale, int threads, int shift) {
  const size_t probs_size = static_cast<size_t>(c.B) * c.H * c.N * c.N, ctx_size = dctx.size();
  std::vector<float> in(qkv.size() + shift), grad_out(ctx_size + shift), p(probs_size + shift), o(ctx_size + shift),
      g(qkv.size() + shift);
  std::copy(qkv.begin(), qkv.end(), in.begin() + shift);
  std::copy(dctx.begin(), dctx.end(), grad_out.begin() + shift);
  std::copy(dqkv_start.begin(), dqkv_start.end(), g.begin() + shift);
  train::attention_forward(in.data() + shift, allowed.data(), c.B, c.N, c.D, c.H, scale, p.data() + shift,
                           o.data() + shift, threads);
  train::attention_backward(grad_out.data() + shift, in.data() + shift, p.data() + shift, c.B, c.N, c.D, c.H, scale,
                            g.data() + shift, threads);
  Result r;
  r.probs.assign(p.begin() + shift, p.end());
  r.ctx.assign(o.begin() + shift, o.end());
  r.dqkv.assign(g.begin() + shift, g.end());
  return r;
}

void check_attention(const AttentionCase& c, KernelIsa isa) {
  const test::UseIsa use(isa);
  // set_kernel_isa selects the training ops' build too.
  REQUIRE(train::train_ops_isa() == test::train_ops_name(isa));
  std::mt19937 rng(static_cast<unsigned>(c.N * 131 + c.D));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t rows = static_cast<size_t>(c.B) * c.N;
  std::vector<float> qkv(rows * 3 * c.D), dctx(rows * c.D), dqkv_start(rows * 3 * c.D);
  for (float& v : qkv) v = normal(rng);
  for (float& v : dctx) v = normal(rng);
  for (float& v : dqkv_start) v = normal(rng);
  // Image 0: every key allowed but the last; image 1 (if any): every key masked (zero rows).
  std::vector<uint8_t> allowed(rows, 1);
  allowed[static_cast<size_t>(c.N) - 1] = c.N > 1 ? 0 : 1;
  if (c.B > 1) std::fill(allowed.begin() + c.N, allowed.begin() + 2 * c.N, 0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D / c.H));

  const Result got = run(c, qkv, allowed, dctx, dqkv_start, scale, 1, 0);
  const Reference ref = reference(c, qkv, allowed, dctx, scale);
  const double rel_p = max_norm_rel(got.probs.data(), ref.probs), rel_o = max_norm_rel(got.ctx.data(), ref.ctx);
  const double rel_g = max_norm_rel(got.dqkv.data(), ref.dqkv);
  std::printf("attention B %d N %d D %d H %d (%s ops): max-norm relative difference to double: probs %.1e, ctx %.1e, "
              "dqkv %.1e\n",
              c.B, c.N, c.D, c.H, train::train_ops_isa(), rel_p, rel_o, rel_g);
  CHECK(rel_p <= 2e-6);
  CHECK(rel_o <= 2e-6);
  CHECK(rel_g <= 2e-6);

  // Masked keys exactly 0; an image with every key masked: zero rows, zero output, zero dqkv.
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.N; ++i)
        for (int j = 0; j < c.N; ++j)
          if (!allowed[static_cast<size_t>(b) * c.N + j])
            REQUIRE(got.probs[((static_cast<size_t>(b) * c.H + h) * c.N + i) * c.N + j] == 0.0f);
  for (float v : got.probs) REQUIRE(std::isfinite(v));
  if (c.B > 1) {
    for (size_t i = rows / c.B * c.D; i < 2 * rows / c.B * c.D; ++i) REQUIRE(got.ctx[i] == 0.0f);
    for (size_t i = rows / c.B * 3 * c.D; i < 2 * rows / c.B * 3 * c.D; ++i) REQUIRE(got.dqkv[i] == 0.0f);
  }

  // The same bits for 2 threads and at other addresses.
  for (const auto& [threads, shift] : {std::pair<int, int>{2, 0}, {1, 1}, {2, 3}, {1, 7}}) {
    const Result again = run(c, qkv, allowed, dctx, dqkv_start, scale, threads, shift);
    INFO("threads " << threads << ", inputs shifted by " << shift << " floats");
    CHECK(again.probs == got.probs);
    CHECK(again.ctx == got.ctx);
    CHECK(again.dqkv == got.dqkv);
  }
}

}  // namespace

TEST_CASE("train: attention forward and backward match a double reference, masks give exact zeros",
          "[train][attention]") {
  for (KernelIsa isa : test::isas_here()) {
    check_attention({3, 50, 48, 4}, isa);  // the default recipe's shape: N = 50, d = 12
    check_attention({2, 13, 10, 2}, isa);  // d = 5, N = 13: no whole vector block anywhere
    check_attention({2, 1, 8, 1}, isa);    // one token
    check_attention({1, 65, 64, 2}, isa);  // d = 32, N = 65
    check_attention({2, 17, 16, 1}, isa);  // d = 16, N = 17: one whole 16-wide block and one key
  }
}

TEST_CASE("train: a NaN key makes every query's weights NaN in every build (never a finite map)", "[train][attention]") {
  const int B = 1, N = 9, D = 8, H = 1;
  std::vector<float> qkv(static_cast<size_t>(B) * N * 3 * D);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : qkv) v = normal(rng);
  qkv[3 * 3 * D + D] = std::numeric_limits<float>::quiet_NaN();  // token 3's k, first value
  for (KernelIsa isa : test::isas_here()) {
    const test::UseIsa use(isa);
    std::vector<float> probs(static_cast<size_t>(B) * H * N * N), ctx(static_cast<size_t>(B) * N * D);
    train::attention_forward(qkv.data(), nullptr, B, N, D, H, 1.0f / std::sqrt(8.0f), probs.data(), ctx.data(), 1);
    INFO(train::train_ops_isa() << " ops");
    for (int i = 0; i < N; ++i) CHECK(std::isnan(probs[static_cast<size_t>(i) * N + 3]));
  }
}
