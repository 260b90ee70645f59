#pragma once
// The attention-pool head: one learned latent query attends over the output tokens, as timm's
// AttentionPoolLatent (timm/layers/attention_pool.py, VisionTransformer global_pool='map', the
// SigLIP towers) and transformers' SiglipMultiheadAttentionPoolingHead (nn.MultiheadAttention
// with the probe as its query) compute it:
//
//   q  = latent W_q^T + b_q                       (1, D)    timm self.q(latent); HF in_proj rows [0, D)
//   kv = x[prefix:] W_kv^T + b_kv                 (Np, 2D)  timm self.kv(x);     HF in_proj rows [D, 3D)
//   P_h = softmax(q_h k_h^T * scale)              (H, Np)   per head, over the patch tokens
//   o  = concat_h(P_h v_h) W_proj^T + b_proj      (1, D)    timm self.proj;       HF out_proj
//   pooled = o + fc2(act(fc1(LayerNorm(o))))      (1, D)    timm norm + mlp;      HF layernorm + mlp
//
// The keys are the patch tokens only (timm's pool drops the prefix tokens first; SigLIP has
// none). The forward's key mask applies as it does in the blocks: padding and painted patches are
// never attended to (a row whose keys are all masked is all zeros). The scores take the blocks'
// factor (ForwardResult::score_scale: 1/sqrt(d), or the temperature's). It runs in float32 for
// every Precision: one query, and one (Np, D) x (D, 2D) product.
#include "core/model/vit.hpp"

namespace vitlens {

// Fills result.pool_probs (H, N; the prefix columns 0) and result.pooled (1, D) from
// result.output. Throws vitlens::Error when the pool's numbers overflow (NaN or infinity).
void attention_pool_forward(const VitModel& model, ForwardResult& result, int threads);

}  // namespace vitlens
