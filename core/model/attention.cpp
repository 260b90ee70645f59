// The plain reference attention: builds the score matrix, then a masked softmax per row.
#include "core/model/attention.hpp"

#include <cmath>
#include <limits>

namespace vitlens {

void masked_softmax_rows(MatRM& scores, const KeyMask& mask, int first_query) {
  const int nq = static_cast<int>(scores.rows());
  const int nk = static_cast<int>(scores.cols());
  for (int r = 0; r < nq; ++r) {
    const int query = first_query + r;
    float* row = scores.row(r).data();
    // Max over allowed keys only, so a masked huge score cannot underflow the rest.
    float row_max = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < nk; ++j)
      if (mask.allows(query, j) && row[j] > row_max) row_max = row[j];
    if (row_max == -std::numeric_limits<float>::infinity()) {
      // Every key masked: a zero row, never NaN (PyTorch's -inf fill would give NaN here).
      std::fill(row, row + nk, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (int j = 0; j < nk; ++j) {
      if (mask.allows(query, j)) {
        row[j] = std::exp(row[j] - row_max);
        sum += row[j];
      } else {
        row[j] = 0.0f;
      }
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < nk; ++j) row[j] *= inv;
  }
}

AttentionResult scaled_dot_product_attention(const MatRM& Q, const MatRM& K, const MatRM& V,
                                             const KeyMask& mask, float scale) {
  if (scale < 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(Q.cols()));
  AttentionResult result;
  // scores = Q @ K.T / sqrt(d_k)
  result.weights.noalias() = (Q * K.transpose()) * scale;
  // weights = scores.softmax(dim=-1)
  masked_softmax_rows(result.weights, mask, 0);
  // context = weights @ V
  result.context.noalias() = result.weights * V;
  return result;
}

AttentionResult AttentionHead::forward(const MatRM& x) const {
  // query = self.query(x); key = self.key(x); value = self.value(x)   (nn.Linear: x W^T + b)
  MatRM query = (x * w_query.transpose()).rowwise() + b_query.transpose();
  MatRM key = (x * w_key.transpose()).rowwise() + b_key.transpose();
  MatRM value = (x * w_value.transpose()).rowwise() + b_value.transpose();
  // attention_scores / math.sqrt(self.attention_head_size), softmax(dim=-1), probs @ value
  return scaled_dot_product_attention(query, key, value, KeyMask{},
                                      1.0f / std::sqrt(static_cast<float>(w_query.rows())));
}

}  // namespace vitlens
