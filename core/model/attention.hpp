#pragma once
// Scaled dot-product attention, exactly as the seeds write it:
//   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V            (Vaswani et al. 2017, sec. 3.2.1)
// plus the masks vitlens supports. This file is the plain reference: it builds the score matrix
// and is the oracle every faster path is tested against.
#include <cstdint>
#include <vector>

#include "core/base/eigen.hpp"
#include "core/base/key_mask.hpp"

namespace vitlens {

// KeyMask (which keys a query may attend to) is in core/base/key_mask.hpp.

// In place: scores (Nq, Nk) of queries first_query .. first_query+Nq-1 become softmax weights
// over the allowed keys. Masked entries become exactly 0.
void masked_softmax_rows(MatRM& scores, const KeyMask& mask, int first_query = 0);

struct AttentionResult {
  MatRM weights;  // (Nq, Nk)
  MatRM context;  // (Nq, dv)
};

// softmax(scale * Q K^T) V. scale < 0 means the seeds' 1 / sqrt(d_k).
AttentionResult scaled_dot_product_attention(const MatRM& Q, const MatRM& K, const MatRM& V,
                                             const KeyMask& mask = {}, float scale = -1.0f);

// The seeds' Listing 3.4, AttentionHead: query, key and value nn.Linear(hidden, head_size) with
// bias, scores divided by sqrt(head_size), softmax over keys, weights times values.
struct AttentionHead {
  MatRM w_query, w_key, w_value;  // (d, D) each, nn.Linear layout (out, in)
  VecF b_query, b_key, b_value;   // (d) each; zero vectors when bias=False

  // x: (N, D). Returns (attention_output (N, d), attention_probs (N, N)).
  AttentionResult forward(const MatRM& x) const;
};

}  // namespace vitlens
