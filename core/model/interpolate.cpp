// torch's antialiased bicubic weights in float32 (see interpolate.hpp).
#include "core/model/interpolate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace vitlens {

namespace {

// HelperInterpCubic::aa_filter<float>: the a = -0.5 cubic convolution, in float.
float aa_cubic(float x) {
  constexpr float a = -0.5f;
  x = std::abs(x);
  if (x < 1.0f) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0f) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0f;
}

}  // namespace

InterpolationTaps antialias_bicubic_taps(int in_size, int out_size) {
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  const float support = scale >= 1.0f ? 2.0f * scale : 2.0f;  // interp_size 4, halved, stretched
  const float invscale = scale >= 1.0f ? 1.0f / scale : 1.0f;
  InterpolationTaps t;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(t.taps), 0.0f);
  for (int i = 0; i < out_size; ++i) {
    // The expressions mix float and double exactly as torch's do (0.5 is a double literal there).
    const float center = static_cast<float>(scale * (i + 0.5));
    const int64_t first = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t count = std::min(static_cast<int64_t>(center + support + 0.5), int64_t{in_size}) - first;
    count = std::clamp(count, int64_t{0}, int64_t{t.taps});
    float* w = &t.weights[static_cast<size_t>(i) * static_cast<size_t>(t.taps)];
    float total = 0.0f;
    for (int64_t j = 0; j < count; ++j) {
      w[j] = aa_cubic(static_cast<float>((static_cast<float>(j + first) - center + 0.5) * invscale));
      total += w[j];
    }
    if (total != 0.0f)
      for (int64_t j = 0; j < count; ++j) w[j] /= total;
    t.first[static_cast<size_t>(i)] = static_cast<int>(first);
    t.count[static_cast<size_t>(i)] = static_cast<int>(count);
  }
  return t;
}

}  // namespace vitlens
