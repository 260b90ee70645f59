// The attention-pool head after the blocks, step by step as timm's AttentionPoolLatent.forward.
#include "core/model/attention_pool.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/base/error.hpp"
#include "core/cpu/gemm.hpp"

namespace vitlens {

void attention_pool_forward(const VitModel& model, ForwardResult& result, int threads) {
  const VitConfig& cfg = model.config;
  const AttentionPoolWeights& w = model.w.pool;
  const int dim = cfg.embed_dim, heads = cfg.num_heads, hd = cfg.head_dim(), hidden = cfg.mlp_hidden();
  const int n = result.tokens, prefix = result.prefix, patches = n - prefix;
  if (result.output.rows() != n || result.output.cols() != dim)
    throw Error("internal: the attention pool needs the (" + std::to_string(n) + ", " + std::to_string(dim) + ") output tokens");

  // q = self.q(self.latent): (1, D), head h in columns [h d, (h + 1) d).
  MatRM q(1, dim);
  linear_forward(w.latent, dim, 1, dim, w.q_w, dim, w.q_b, q.data(), dim, LinearEpilogue::Store, 1);
  // kv = self.kv(x[:, num_prefix_tokens:]).reshape(B, N, 2, H, d): columns [K heads | V heads].
  MatRM kv(patches, 2 * dim);
  linear_forward(result.output.row(prefix).data(), dim, patches, dim, w.kv_w, 2 * dim, w.kv_b, kv.data(), 2 * dim,
                 LinearEpilogue::Store, threads);
  if (!q.allFinite() || !kv.allFinite())
    throw Error("model '" + cfg.name + "' produces non-finite queries/keys/values (NaN or infinity) in its attention pool on this image");

  // attn = (q * scale) @ k.transpose(-2, -1); attn = attn.softmax(dim=-1); x = attn @ v, per head.
  const std::vector<uint8_t>& allowed = result.mask.key_allowed;
  auto key_allowed = [&](int j) { return allowed.empty() || allowed[static_cast<size_t>(prefix + j)] != 0; };
  result.pool_probs = MatRM::Zero(heads, n);
  MatRM context = MatRM::Zero(1, dim);
  std::vector<double> scores(static_cast<size_t>(patches));
  for (int h = 0; h < heads; ++h) {
    const float* q_h = q.data() + h * hd;
    double top = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < patches; ++j) {
      if (!key_allowed(j)) continue;
      const float* k_jh = kv.row(j).data() + h * hd;
      float dot = 0.0f;
      for (int i = 0; i < hd; ++i) dot += q_h[i] * k_jh[i];
      scores[static_cast<size_t>(j)] = static_cast<double>(dot * result.score_scale);
      top = std::max(top, scores[static_cast<size_t>(j)]);
    }
    if (!std::isfinite(top)) continue;  // every key masked: a zero row and a zero output, as the blocks'
    double sum = 0.0;
    for (int j = 0; j < patches; ++j)
      if (key_allowed(j)) sum += scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - top);
    auto row = result.pool_probs.row(h);
    for (int j = 0; j < patches; ++j) {
      if (!key_allowed(j)) continue;
      const float p = static_cast<float>(scores[static_cast<size_t>(j)] / sum);
      row[prefix + j] = p;
      const float* v_jh = kv.row(j).data() + dim + h * hd;
      for (int i = 0; i < hd; ++i) context(0, h * hd + i) += p * v_jh[i];
    }
  }

  // x = self.proj(x); x = x + self.mlp(self.norm(x))
  result.pooled.resize(1, dim);
  linear_forward(context.data(), dim, 1, dim, w.proj_w, dim, w.proj_b, result.pooled.data(), dim, LinearEpilogue::Store, 1);
  MatRM normed(1, dim), mlp_hidden(1, hidden);
  layer_norm_rows(result.pooled.data(), dim, 1, dim, w.norm_w, w.norm_b, cfg.norm_eps, normed.data(), dim);
  linear_forward(normed.data(), dim, 1, dim, w.fc1_w, hidden, w.fc1_b, mlp_hidden.data(), hidden, LinearEpilogue::Store, 1);
  activation_inplace(cfg.act, mlp_hidden.data(), hidden);
  linear_forward(mlp_hidden.data(), hidden, 1, hidden, w.fc2_w, dim, w.fc2_b, result.pooled.data(), dim,
                 LinearEpilogue::Accumulate, 1);
  if (!result.pooled.allFinite())
    throw Error("model '" + cfg.name + "' produces a non-finite pooled vector (NaN or infinity) in its attention pool on this image");
}

}  // namespace vitlens
