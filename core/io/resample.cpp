// Pillow's and torch's 8-bit separable resampling (see resample.hpp for the algorithm). Written
// from the algorithm's description in Pillow's libImaging/Resample.c and torch's
// aten/src/ATen/native/cpu/UpSampleKernel.cpp; each library's own filter formulas are kept (they
// group the cubic's terms differently, which can move a rounding).
#include "core/io/resample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/base/error.hpp"

namespace vitlens {

const char* resample_filter_name(ResampleFilter filter) {
  switch (filter) {
    case ResampleFilter::Box: return "box";
    case ResampleFilter::Bilinear: return "bilinear";
    case ResampleFilter::Hamming: return "hamming";
    case ResampleFilter::Bicubic: return "bicubic";
    case ResampleFilter::Lanczos: return "lanczos";
  }
  return "?";
}

const char* resample_engine_name(ResampleEngine engine) {
  return engine == ResampleEngine::Pillow ? "pillow" : "torch-antialias";
}

namespace {

constexpr double kPi = 3.14159265358979323846;

// [SECTION] Pillow's filters (Resample.c)

double pillow_box(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double pillow_bilinear(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double pillow_hamming(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * kPi;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // Pillow's constants are floats
}

double pillow_bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * kPi;
  return std::sin(x) / x;
}

double pillow_lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0; }

// [SECTION] torch's antialias filters (UpSampleKernel.cpp, HelperInterpLinear / HelperInterpCubic)

double torch_bilinear(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double torch_bicubic(double x) {
  constexpr double a = -0.5;  // torch's antialiased bicubic takes Pillow's a, not its own -0.75
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

struct Kernel {
  double (*fn)(double);
  double support;
};

Kernel kernel_of(ResampleFilter filter, ResampleEngine engine) {
  if (engine == ResampleEngine::TorchAntialias) {
    if (filter == ResampleFilter::Bilinear) return {torch_bilinear, 1.0};
    if (filter == ResampleFilter::Bicubic) return {torch_bicubic, 2.0};
    throw Error(std::string("torch's antialiased resize has no '") + resample_filter_name(filter) +
                "' filter (only bilinear and bicubic)");
  }
  switch (filter) {
    case ResampleFilter::Box: return {pillow_box, 0.5};
    case ResampleFilter::Bilinear: return {pillow_bilinear, 1.0};
    case ResampleFilter::Hamming: return {pillow_hamming, 1.0};
    case ResampleFilter::Bicubic: return {pillow_bicubic, 2.0};
    case ResampleFilter::Lanczos: return {pillow_lanczos, 3.0};
  }
  throw Error("unknown resample filter");
}

// Integer weights: (out, taps) with `precision` fractional bits.
struct FixedWeights {
  int precision = 0;
  std::vector<int32_t> weights;
};

int32_t to_fixed(double w, int precision) {
  const double v = w * static_cast<double>(int64_t{1} << precision);
  return static_cast<int32_t>(v < 0 ? -0.5 + v : 0.5 + v);  // both libraries round half away from 0
}

FixedWeights fixed_weights(const AxisWeights& axis, ResampleEngine engine) {
  FixedWeights f;
  if (engine == ResampleEngine::Pillow) {
    f.precision = 32 - 8 - 2;  // Pillow's PRECISION_BITS
  } else {
    // torch: the most fractional bits (< 22) at which the largest weight, doubled, fits int16.
    const double wt_max = axis.weights.empty() ? 0.0 : *std::max_element(axis.weights.begin(), axis.weights.end());
    for (f.precision = 0; f.precision < 22; ++f.precision) {
      const int next = static_cast<int>(0.5 + wt_max * static_cast<double>(1 << (f.precision + 1)));
      if (next >= (1 << 15)) break;
    }
  }
  f.weights.resize(axis.weights.size());
  for (size_t i = 0; i < axis.weights.size(); ++i) f.weights[i] = to_fixed(axis.weights[i], f.precision);
  return f;
}

uint8_t round_clamp(int64_t sum, int precision) {
  const int64_t v = sum >> precision;  // the sum started at half a unit: this rounds
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

// One pass along x (horizontal) or y: src (h, w, 3) -> dst (h, out, 3) or (out, w, 3).
cv::Mat resample_pass(const cv::Mat& src, const AxisWeights& axis, const FixedWeights& fixed, bool horizontal) {
  const int out = static_cast<int>(axis.first.size());
  cv::Mat dst(horizontal ? src.rows : out, horizontal ? out : src.cols, CV_8UC3);
  const int64_t half = int64_t{1} << (fixed.precision - 1);
  for (int y = 0; y < dst.rows; ++y) {
    uint8_t* row = dst.ptr<uint8_t>(y);
    for (int x = 0; x < dst.cols; ++x) {
      const int i = horizontal ? x : y;
      const int32_t* w = &fixed.weights[static_cast<size_t>(i) * static_cast<size_t>(axis.taps)];
      int64_t sum[3] = {half, half, half};
      for (int j = 0; j < axis.count[static_cast<size_t>(i)]; ++j) {
        const int at = axis.first[static_cast<size_t>(i)] + j;
        const uint8_t* px = horizontal ? src.ptr<uint8_t>(y) + 3 * at : src.ptr<uint8_t>(at) + 3 * x;
        for (int c = 0; c < 3; ++c) sum[c] += static_cast<int64_t>(px[c]) * w[j];
      }
      for (int c = 0; c < 3; ++c) row[3 * x + c] = round_clamp(sum[c], fixed.precision);
    }
  }
  return dst;
}

}  // namespace

AxisWeights axis_weights(int in_size, int out_size, ResampleFilter filter, ResampleEngine engine) {
  if (in_size < 1 || out_size < 1) throw Error("resample: sizes must be >= 1");
  const Kernel kernel = kernel_of(filter, engine);
  const double scale = static_cast<double>(in_size) / out_size;
  const double stretch = std::max(scale, 1.0);  // the kernel widens when shrinking
  const double support = kernel.support * stretch;
  const double inv_stretch = 1.0 / stretch;
  AxisWeights axis;
  axis.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  axis.first.resize(static_cast<size_t>(out_size));
  axis.count.resize(static_cast<size_t>(out_size));
  axis.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(axis.taps), 0.0);
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    const int first = std::max(static_cast<int>(center - support + 0.5), 0);
    int count = std::min(static_cast<int>(center + support + 0.5), in_size) - first;
    count = std::clamp(count, 0, axis.taps);  // torch clips a rare extra tap; Pillow never has one
    double* w = &axis.weights[static_cast<size_t>(i) * static_cast<size_t>(axis.taps)];
    double total = 0.0;
    for (int j = 0; j < count; ++j) {
      w[j] = kernel.fn((j + first - center + 0.5) * inv_stretch);
      total += w[j];
    }
    if (total != 0.0)
      for (int j = 0; j < count; ++j) w[j] /= total;
    axis.first[static_cast<size_t>(i)] = first;
    axis.count[static_cast<size_t>(i)] = count;
  }
  return axis;
}

cv::Mat resample_rgb8(const cv::Mat& rgb8, int out_w, int out_h, ResampleFilter filter, ResampleEngine engine) {
  if (rgb8.type() != CV_8UC3) throw Error("resample: internal: expected a CV_8UC3 image");
  if (out_w < 1 || out_h < 1) throw Error("resample: the output size must be at least 1x1");
  kernel_of(filter, engine);  // refuses a filter the engine lacks, even when no pass runs
  const bool horizontal = out_w != rgb8.cols, vertical = out_h != rgb8.rows;
  auto pass = [&](const cv::Mat& src, bool along_x) {
    const AxisWeights axis = along_x ? axis_weights(rgb8.cols, out_w, filter, engine)
                                     : axis_weights(rgb8.rows, out_h, filter, engine);
    return resample_pass(src, axis, fixed_weights(axis, engine), along_x);
  };
  // The 8-bit image between the passes is rounded, so the order changes bytes. torch and Pillow
  // before 13 always run the horizontal pass first; Pillow 13 runs the vertical one first when the
  // height loses more than twice as many pixels as the width (ImagingResampleInner, "if height is
  // scaled down significantly more than width"; measured: 0 mismatches over 5,400 sizes and the 5
  // filters).
  const bool vertical_first = engine == ResampleEngine::Pillow && horizontal && vertical &&
                              out_h < rgb8.rows && (rgb8.rows - out_h) > 2 * (rgb8.cols - out_w);
  cv::Mat img = rgb8;
  if (vertical_first) {
    img = pass(pass(img, false), true);
  } else {
    if (horizontal) img = pass(img, true);
    if (vertical) img = pass(img, false);
  }
  return img.data == rgb8.data ? rgb8.clone() : img;
}

// [SECTION] torch's antialiased resize on float32 tensors

namespace {

// One axis of torch's float antialias weights, computed in float as torch computes them.
struct FloatAxis {
  std::vector<int> first, count;  // (out)
  std::vector<float> weights;     // (out, taps)
  int taps = 0;
};

FloatAxis float_axis_weights(int in_size, int out_size) {
  FloatAxis a;
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  const float support = scale >= 1.0f ? scale : 1.0f;  // (interp_size / 2) * scale, interp_size 2
  const float invscale = scale >= 1.0f ? static_cast<float>(1.0 / static_cast<double>(scale)) : 1.0f;
  a.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<size_t>(out_size));
  a.count.resize(static_cast<size_t>(out_size));
  a.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(a.taps), 0.0f);
  for (int i = 0; i < out_size; ++i) {
    const float center = static_cast<float>(static_cast<double>(scale) * (i + 0.5));
    const int first = std::max(static_cast<int>(static_cast<double>(center - support) + 0.5), 0);
    const int last = std::min(static_cast<int>(static_cast<double>(center + support) + 0.5), in_size);
    const int count = std::min(last - first, a.taps);
    float* w = a.weights.data() + static_cast<size_t>(i) * static_cast<size_t>(a.taps);
    float total = 0.0f;
    for (int j = 0; j < count; ++j) {
      const float offset = static_cast<float>(j + first) - center;
      float x = static_cast<float>((static_cast<double>(offset) + 0.5) * static_cast<double>(invscale));
      x = std::fabs(x);
      w[j] = x < 1.0f ? 1.0f - x : 0.0f;  // the triangle
      total += w[j];
    }
    if (total != 0.0f)
      for (int j = 0; j < count; ++j) w[j] /= total;
    a.first[static_cast<size_t>(i)] = first;
    a.count[static_cast<size_t>(i)] = count;
  }
  return a;
}

// One pass over a CV_32FC3 image along x or y.
cv::Mat float_pass(const cv::Mat& src, const FloatAxis& a, int out_size, bool along_x) {
  const int rows = along_x ? src.rows : out_size, cols = along_x ? out_size : src.cols;
  cv::Mat dst(rows, cols, CV_32FC3);
  for (int y = 0; y < rows; ++y) {
    float* out = dst.ptr<float>(y);
    for (int x = 0; x < cols; ++x) {
      const int i = along_x ? x : y;
      const int first = a.first[static_cast<size_t>(i)], count = a.count[static_cast<size_t>(i)];
      const float* w = a.weights.data() + static_cast<size_t>(i) * static_cast<size_t>(a.taps);
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int k) {
          return along_x ? src.ptr<float>(y)[3 * (first + k) + c] : src.ptr<float>(first + k)[3 * x + c];
        };
        float acc = at(0) * w[0];
        for (int k = 1; k < count; ++k) acc = std::fma(at(k), w[k], acc);
        out[3 * x + c] = acc;
      }
    }
  }
  return dst;
}

}  // namespace

cv::Mat resample_rgb32f_torch(const cv::Mat& rgbf, int out_w, int out_h, ResampleFilter filter) {
  if (rgbf.type() != CV_32FC3) throw Error("resample: internal: expected a CV_32FC3 image");
  if (out_w < 1 || out_h < 1) throw Error("resample: the output size must be at least 1x1");
  if (filter != ResampleFilter::Bilinear)
    throw Error(std::string("torch's antialiased resize of a float image is reproduced for bilinear only, not '") +
                resample_filter_name(filter) + "'");
  cv::Mat img = rgbf;
  if (out_w != img.cols) img = float_pass(img, float_axis_weights(img.cols, out_w), out_w, true);
  if (out_h != img.rows) img = float_pass(img, float_axis_weights(img.rows, out_h), out_h, false);
  return img.data == rgbf.data ? rgbf.clone() : img;
}

}  // namespace vitlens
