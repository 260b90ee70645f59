#pragma once
// Resampling as the Python image libraries do it, byte for byte, so that `--preprocess model`
// gives the model the pixels a notebook gives it.
//
// Both libraries resize in two separable passes over 8-bit pixels, each output sample a weighted
// sum of a window of input samples. torch runs the horizontal pass first; so did Pillow up to 12,
// while Pillow 13 runs the vertical pass first when the height loses more than twice as many pixels
// as the width (out_h < in_h and in_h - out_h > 2 * (in_w - out_w)); vitlens follows Pillow 13:
//   scale   = in / out                              (> 1 when shrinking)
//   support = filter support * max(scale, 1)       (the kernel is stretched when shrinking:
//                                                    that is the antialiasing)
//   center  = (i + 0.5) * scale
//   window  = [int(center - support + 0.5), int(center + support + 0.5)) clipped to [0, in)
//   w[j]    = filter((j - center + 0.5) / max(scale, 1)) / (sum of the window's w)
// in double, then the weights are turned into integers with `precision` fractional bits and the
// sum is rounded ((1 << (precision - 1)) added, shifted right) and clamped to [0, 255]:
//   Pillow (Resample.c, ImagingResample): precision 22, int32 weights.
//   torch (aten UpSampleKernel.cpp, the uint8 antialias path that torchvision's resize takes for
//     uint8 tensors, and so transformers' torchvision-backend image processors): int16 weights,
//     precision the largest in [0, 22) at which the largest weight of the axis still fits in 15
//     bits. The two agree on most pixels and differ by 1 on some.
// A pass whose size does not change is skipped (both libraries do).
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace vitlens {

// The filters (Pillow's names and numbers; torch's antialiased "bilinear" and "bicubic" are
// Pillow's triangle and a = -0.5 cubic). Pillow's NEAREST (0) is an affine transform, not this
// convolution, and is not reproduced: a config asking for it is refused.
enum class ResampleFilter {
  Box,       // Pillow BOX (4), support 0.5
  Bilinear,  // Pillow BILINEAR (2), triangle, support 1
  Hamming,   // Pillow HAMMING (5), support 1
  Bicubic,   // Pillow BICUBIC (3), cubic convolution a = -0.5, support 2
  Lanczos,   // Pillow LANCZOS (1), support 3
};
const char* resample_filter_name(ResampleFilter filter);  // "bicubic", ...

// Which library's arithmetic.
enum class ResampleEngine {
  Pillow,          // PIL.Image.resize (timm's eval transform, transformers' PIL backend)
  TorchAntialias,  // torch.nn.functional.interpolate(antialias=True) on a uint8 tensor
                   // (torchvision.transforms.v2.functional.resize, transformers' torchvision backend)
};
const char* resample_engine_name(ResampleEngine engine);  // "pillow", "torch-antialias"

// One axis' weights: output i reads input [first[i], first[i] + count[i]) with weights
// weights[i * taps + j] (double, summing to 1). taps = ceil(support) * 2 + 1.
struct AxisWeights {
  int taps = 0;
  std::vector<int> first, count;  // (out)
  std::vector<double> weights;    // (out, taps)
};
AxisWeights axis_weights(int in_size, int out_size, ResampleFilter filter, ResampleEngine engine);

// rgb8: CV_8UC3 (h, w, 3). Returns CV_8UC3 (out_h, out_w, 3). Throws vitlens::Error for a filter
// the engine does not have (torch: Bilinear and Bicubic only) or a size < 1.
cv::Mat resample_rgb8(const cv::Mat& rgb8, int out_w, int out_h, ResampleFilter filter, ResampleEngine engine);

// torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=True) on a
// float32 tensor: the resize transformers' DINOv3ViTImageProcessor runs after rescaling to float
// (rescale, then resize, then normalise). Float arithmetic as torch's CPU kernel (aten
// UpSampleKernel.cpp, the antialias path for float tensors): per axis, in float32
//   scale = in / out, support = scale (>= 1) or 1, invscale = 1 / scale (>= 1) or 1,
//   center = scale * (i + 0.5) (in double, stored as float),
//   window [int(center - support + 0.5), int(center + support + 0.5)) clipped to [0, in),
//   w[j] = triangle(((first + j) - center + 0.5) * invscale) / (their float sum),
// the horizontal pass first into a float image, then the vertical; each output sample
// x0 * w0 then one fused multiply-add per further tap (torch's AVX2 build contracts its
// `out += x * w`). Measured against torch 2.15 on this machine: equal to the bit on photos
// resized by factors up to 1.9 (and enlarged); at factors of 2.5 and more some samples are 1 or 2
// float ulps apart (torch's kernel rounds those differently; tests/test_preprocess.cpp). A pass
// whose size does not change is skipped. rgbf: CV_32FC3 (h, w, 3). Returns CV_32FC3 (out_h, out_w, 3). Throws
// vitlens::Error for a filter other than Bilinear (torch's float bicubic is not reproduced) or a
// size < 1.
cv::Mat resample_rgb32f_torch(const cv::Mat& rgbf, int out_w, int out_h, ResampleFilter filter);

}  // namespace vitlens
