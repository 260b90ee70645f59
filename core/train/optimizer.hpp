#pragma once
// AdamW exactly as torch.optim.AdamW (Loshchilov and Hutter 2019: decoupled weight decay, bias
// correction, eps added outside the square root), the learning-rate schedule (linear warmup, then
// cosine decay) and gradient-norm clipping as torch.nn.utils.clip_grad_norm_.
#include <cstdint>
#include <vector>

#include "core/train/vit_train.hpp"

namespace vitlens::train {

struct AdamW {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.05;
  int64_t step = 0;      // updates done so far (torch's state['step'])
  std::vector<float> m;  // (layout.total) first moment, torch's exp_avg
  std::vector<float> v;  // (layout.total) second moment, torch's exp_avg_sq

  // One update at learning rate lr. Weight decay only on entries with decay = true (ParamEntry);
  // torch's per-element order of operations:
  //   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + (1 - b2) g^2
  //   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  void update(const ParamLayout& layout, float* params, const float* grads, double lr);
};

// torch.nn.utils.clip_grad_norm_(max_norm): total = ||g||_2 over all parameters; every gradient is
// scaled by min(1, max_norm / (total + 1e-6)). Returns the norm before clipping. max_norm <= 0: no
// clipping, the norm is still returned.
double clip_grad_norm(std::vector<float>& grads, double max_norm);

// The learning rate for update `step` (0-based) of `total` updates: base * (step + 1) / warmup during
// the first `warmup` updates, then min_lr + (base - min_lr) (1 + cos(pi t)) / 2 with t going from 0 to 1
// over the remaining updates.
double scheduled_lr(double base, double min_lr, int64_t step, int64_t warmup, int64_t total);

}  // namespace vitlens::train
