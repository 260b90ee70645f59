// AdamW, the schedule and clipping; torch/optim/adamw.py (_single_tensor_adamw) and
// torch/nn/utils/clip_grad.py line by line.
#include "core/train/optimizer.hpp"

#include <algorithm>
#include <cmath>

namespace vitlens::train {

void AdamW::update(const ParamLayout& layout, float* params, const float* grads, double lr) {
  if (m.size() != layout.total) m.assign(layout.total, 0.0f);
  if (v.size() != layout.total) v.assign(layout.total, 0.0f);
  ++step;
  // Scalars in double as Python computes them, applied in float as torch's float kernels do.
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const float beta2f = static_cast<float>(beta2), one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const float epsf = static_cast<float>(eps);
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  for (const ParamEntry& e : layout.entries) {
    float* p = params + e.offset;
    const float* g = grads + e.offset;
    float* mm = m.data() + e.offset;
    float* vv = v.data() + e.offset;
    for (size_t i = 0; i < e.size; ++i) {
      if (e.decay) p[i] *= decay;                              // param.mul_(1 - lr * weight_decay)
      mm[i] += one_minus_beta1 * (g[i] - mm[i]);               // exp_avg.lerp_(grad, 1 - beta1)
      vv[i] = vv[i] * beta2f + one_minus_beta2 * g[i] * g[i];  // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
      const float denom = std::sqrt(vv[i]) / bias_correction2_sqrt + epsf;
      p[i] += -step_size * (mm[i] / denom);                    // param.addcdiv_(exp_avg, denom, value=-step_size)
    }
  }
}

double clip_grad_norm(std::vector<float>& grads, double max_norm) {
  double sum = 0.0;
  for (float g : grads) sum += static_cast<double>(g) * g;
  const double total = std::sqrt(sum);
  if (max_norm > 0.0) {
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      for (float& g : grads) g *= c;
    }
  }
  return total;
}

double scheduled_lr(double base, double min_lr, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  return min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * t));
}

}  // namespace vitlens::train
