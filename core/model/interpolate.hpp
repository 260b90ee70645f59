#pragma once
// torch.nn.functional.interpolate(mode="bicubic", align_corners=False, antialias=True) on float32,
// one axis at a time, as torch's CPU kernel computes it (aten/src/ATen/native/cpu/UpSampleKernel.cpp,
// the separable antialias path). Used to resize positional tables as timm's
// resample_abs_pos_embed and transformers' Dinov2WithRegisters do.
//
// Unlike the plain bicubic (A = -0.75, four taps at any scale), the antialiased kernel is the
// a = -0.5 cubic of Pillow, stretched by in/out when shrinking, so its window widens, and its
// weights are renormalised to sum to one at the borders (no clamped taps). The two differ at every
// size other than the original, enlarging as well as shrinking. In float32, as torch:
//   scale   = float(in) / out
//   support = 2 * max(scale, 1)
//   center  = float(scale * (i + 0.5))
//   window  = [int(center - support + 0.5), int(center + support + 0.5)) clipped to [0, in)
//   w[j]    = cubic((j - center + 0.5) / max(scale, 1)) / (sum of w)
#include <vector>

namespace vitlens {

struct InterpolationTaps {
  int taps = 0;                    // the most taps of any output
  std::vector<int> first, count;   // (out) input window per output index
  std::vector<float> weights;      // (out, taps)
};

InterpolationTaps antialias_bicubic_taps(int in_size, int out_size);

}  // namespace vitlens
