// The seeds' math: the worked example, AttentionHead (Listing 3.4) and the masks.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/model/attention.hpp"

using namespace vitlens;

namespace {

MatRM matrix(std::initializer_list<std::initializer_list<float>> rows) {
  MatRM m(static_cast<Eigen::Index>(rows.size()), static_cast<Eigen::Index>(rows.begin()->size()));
  Eigen::Index r = 0;
  for (const auto& row : rows) {
    Eigen::Index c = 0;
    for (float v : row) m(r, c++) = v;
    ++r;
  }
  return m;
}

MatRM random_matrix(int rows, int cols, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  MatRM m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = dist(rng);
  return m;
}

}  // namespace

TEST_CASE("seed worked example: 2 queries, 3 keys, to three decimals", "[attention][seed]") {
  const MatRM Q = matrix({{1, 0}, {0, 1}});
  const MatRM K = matrix({{1, 0}, {1, 1}, {0, 1}});
  const MatRM V = matrix({{10, 0}, {0, 5}, {0, 1}});
  const AttentionResult r = scaled_dot_product_attention(Q, K, V);
  // Observed output in the seed (torch.round(..., decimals=3)).
  const MatRM weights = matrix({{0.401f, 0.401f, 0.198f}, {0.198f, 0.401f, 0.401f}});
  const MatRM context = matrix({{4.011f, 2.203f}, {1.978f, 2.407f}});
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) CHECK(std::round(r.weights(i, j) * 1000.0f) / 1000.0f == Approx(weights(i, j)).margin(1e-6));
    for (int j = 0; j < 2; ++j) CHECK(std::round(r.context(i, j) * 1000.0f) / 1000.0f == Approx(context(i, j)).margin(1e-6));
  }
}

TEST_CASE("AttentionHead (seed Listing 3.4) equals a plain-loop reference", "[attention][seed]") {
  std::mt19937 rng(7);
  const int n = 9, hidden = 48, head = 12;
  AttentionHead h;
  h.w_query = random_matrix(head, hidden, rng, 0.3f);
  h.w_key = random_matrix(head, hidden, rng, 0.3f);
  h.w_value = random_matrix(head, hidden, rng, 0.3f);
  h.b_query = random_matrix(head, 1, rng, 0.1f);
  h.b_key = random_matrix(head, 1, rng, 0.1f);
  h.b_value = random_matrix(head, 1, rng, 0.1f);
  const MatRM x = random_matrix(n, hidden, rng);
  const AttentionResult got = h.forward(x);

  // The listing, with loops and doubles: query/key/value linear layers, scores / sqrt(head),
  // softmax over keys, probabilities times values.
  auto linear = [&](const MatRM& w, const VecF& b, int i, int o) {
    double s = b(o);
    for (int c = 0; c < hidden; ++c) s += static_cast<double>(w(o, c)) * x(i, c);
    return s;
  };
  double worst_p = 0.0, worst_o = 0.0;
  for (int i = 0; i < n; ++i) {
    std::vector<double> scores(n);
    double mx = -1e300;
    for (int j = 0; j < n; ++j) {
      double dot = 0.0;
      for (int o = 0; o < head; ++o) dot += linear(h.w_query, h.b_query, i, o) * linear(h.w_key, h.b_key, j, o);
      scores[j] = dot / std::sqrt(static_cast<double>(head));
      mx = std::max(mx, scores[j]);
    }
    double sum = 0.0;
    for (double& s : scores) sum += (s = std::exp(s - mx));
    for (int j = 0; j < n; ++j) worst_p = std::max(worst_p, std::abs(scores[j] / sum - got.weights(i, j)));
    for (int o = 0; o < head; ++o) {
      double out = 0.0;
      for (int j = 0; j < n; ++j) out += scores[j] / sum * linear(h.w_value, h.b_value, j, o);
      worst_o = std::max(worst_o, std::abs(out - got.context(i, o)));
    }
  }
  INFO("max |probs - reference| = " << worst_p << ", max |output - reference| = " << worst_o);
  CHECK(worst_p < 1e-6);
  CHECK(worst_o < 1e-5);
  CHECK(got.weights.rows() == n);
  CHECK(got.context.cols() == head);
}

TEST_CASE("causal mask zeroes exactly the future and renormalises the past", "[attention][mask]") {
  std::mt19937 rng(3);
  const int n = 7, d = 5;
  const MatRM Q = random_matrix(n, d, rng), K = random_matrix(n, d, rng), V = random_matrix(n, d, rng);
  KeyMask causal;
  causal.causal = true;
  const AttentionResult masked = scaled_dot_product_attention(Q, K, V, causal);
  for (int i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int j = 0; j < n; ++j) {
      if (j > i) CHECK(masked.weights(i, j) == 0.0f);
      else CHECK(masked.weights(i, j) > 0.0f);
      sum += masked.weights(i, j);
    }
    CHECK(sum == Approx(1.0).epsilon(1e-6));
    // The allowed part is the softmax of the allowed scores alone.
    const AttentionResult prefix = scaled_dot_product_attention(Q.middleRows(i, 1), K.topRows(i + 1), V.topRows(i + 1));
    for (int j = 0; j <= i; ++j) CHECK(masked.weights(i, j) == Approx(prefix.weights(0, j)).epsilon(1e-5));
  }
  CHECK(masked.weights(0, 0) == 1.0f);
}

TEST_CASE("key mask: forbidden keys get zero weight, a row with every key masked is zero, not NaN", "[attention][mask]") {
  std::mt19937 rng(5);
  const int n = 6, d = 4;
  const MatRM Q = random_matrix(n, d, rng), K = random_matrix(n, d, rng), V = random_matrix(n, d, rng);
  KeyMask mask;
  mask.key_allowed = {1, 0, 1, 0, 0, 1};
  const AttentionResult r = scaled_dot_product_attention(Q, K, V, mask);
  for (int i = 0; i < n; ++i) {
    CHECK(r.weights(i, 1) == 0.0f);
    CHECK(r.weights(i, 3) == 0.0f);
    CHECK(r.weights(i, 4) == 0.0f);
    CHECK(r.weights.row(i).sum() == Approx(1.0f).epsilon(1e-6));
  }

  KeyMask none;
  none.key_allowed.assign(n, 0);
  const AttentionResult empty = scaled_dot_product_attention(Q, K, V, none);
  CHECK(empty.weights.isZero(0.0f));
  CHECK(empty.context.isZero(0.0f));
  CHECK(empty.context.allFinite());

  // Causal plus a key mask that forbids key 0: query 0 has no key left.
  KeyMask both;
  both.causal = true;
  both.key_allowed = {0, 1, 1, 1, 1, 1};
  const AttentionResult c = scaled_dot_product_attention(Q, K, V, both);
  CHECK(c.weights.row(0).isZero(0.0f));
  CHECK(c.weights(1, 1) == 1.0f);
  CHECK(c.weights.allFinite());
}

TEST_CASE("softmax is stable for huge logits and exact on ties", "[attention]") {
  MatRM scores(2, 4);
  scores << 1000.0f, 1000.0f, -1000.0f, 999.0f,  //
      -3e4f, -3e4f, -3e4f, -3e4f;
  masked_softmax_rows(scores, KeyMask{});
  CHECK(scores.allFinite());
  CHECK(scores(0, 0) == scores(0, 1));
  CHECK(scores(0, 2) == 0.0f);
  CHECK(scores(0, 3) == Approx(std::exp(-1.0) / (2.0 + std::exp(-1.0))).epsilon(1e-6));
  for (int j = 0; j < 4; ++j) CHECK(scores(1, j) == 0.25f);
}
