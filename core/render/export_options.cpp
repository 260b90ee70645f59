// The export's options that need more than a flag: the robust map scale and the measure behind
// it, a painted key mask read from an image file, a query given in the source image's pixels.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/render/export.hpp"

namespace vitlens {

// [SECTION] Map scale

namespace {

std::vector<float> selected_values(const MatRM& map, const PatchSelection& patches) {
  std::vector<float> values;
  values.reserve(static_cast<size_t>(map.size()));
  for (Eigen::Index i = 0; i < map.size(); ++i)
    if (selected(patches, i)) values.push_back(map.data()[i]);
  return values;
}

}  // namespace

float map_percentile(const MatRM& map, float percentile, const PatchSelection& patches) {
  std::vector<float> values = selected_values(map, patches);
  if (values.empty()) return 0.0f;
  // numpy.percentile's default ("linear"): position q/100 * (n - 1) between the sorted values.
  const double position = std::clamp(static_cast<double>(percentile), 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, values.size() - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(below), values.end());
  const float low = values[below];
  // The next larger value is the smallest of those after `below` (nth_element leaves them unsorted).
  const float high = above == below ? low : *std::min_element(values.begin() + static_cast<std::ptrdiff_t>(above), values.end());
  return static_cast<float>(low + (position - static_cast<double>(below)) * (high - low));
}

float saturation_floor(const MatRM& map, float fraction, const PatchSelection& patches) {
  std::vector<float> values = selected_values(map, patches);
  for (float& v : values) v = std::max(0.0f, v);
  std::sort(values.begin(), values.end(), std::greater<float>());
  double total = 0.0;
  for (const float v : values) total += v;
  const double budget = static_cast<double>(fraction) * total;
  // g(t) = sum max(0, v - t) falls as t rises; between the k-th and (k+1)-th largest values it is
  // (sum of the k largest) - k t, so the first k whose solution of g(t) = budget lies at or above
  // the (k+1)-th value gives the smallest t.
  double largest = 0.0;
  for (size_t k = 1; k <= values.size(); ++k) {
    largest += values[k - 1];
    const double t = (largest - budget) / static_cast<double>(k);
    const double next = k < values.size() ? values[k] : 0.0;
    if (t >= next) return static_cast<float>(std::max(0.0, t));
  }
  return 0.0f;
}

float robust_scale_top(const MatRM& map, const PatchSelection& patches) {
  return std::max(map_percentile(map, kRobustPercentile, patches), saturation_floor(map, kMaxSaturatedMass, patches));
}

MatRM display_values(const MatRM& map, float scale, Normalize normalize) {
  if (normalize == Normalize::Log) return log_scaled_map(map, scale);
  MatRM out = MatRM::Zero(map.rows(), map.cols());
  if (!(scale > 0.0f)) return out;
  const float inv = 1.0f / scale;
  for (Eigen::Index i = 0; i < map.size(); ++i) out.data()[i] = std::clamp(map.data()[i] * inv, 0.0f, 1.0f);
  return out;
}

double display_detail_share(const MatRM& display01, const PatchSelection& patches) {
  Eigen::Index inside = 0, counted = 0;
  for (Eigen::Index i = 0; i < display01.size(); ++i) {
    if (!selected(patches, i)) continue;
    const float v = display01.data()[i];
    inside += v >= kDetailBand && v <= 1.0f - kDetailBand;
    ++counted;
  }
  return counted > 0 ? static_cast<double>(inside) / static_cast<double>(counted) : 0.0;
}

// [SECTION] Painted mask from a file

std::vector<uint8_t> key_mask_from_image(const cv::Mat& mask_rgb01, const PreparedImage& image,
                                         const VitConfig& config, const std::string& mask_path) {
  if (mask_rgb01.empty() || mask_rgb01.type() != CV_32FC3) throw Error(mask_path + ": internal: expected a CV_32FC3 mask");
  const double mask_aspect = static_cast<double>(mask_rgb01.cols) / mask_rgb01.rows;
  const double image_aspect = static_cast<double>(image.source_w) / image.source_h;
  if (std::abs(mask_aspect / image_aspect - 1.0) > 0.02)
    throw Error(mask_path + ": the mask is " + std::to_string(mask_rgb01.cols) + "x" + std::to_string(mask_rgb01.rows) +
                " but the image is " + std::to_string(image.source_w) + "x" + std::to_string(image.source_h) +
                "; paint the mask at the image's size (or the same aspect ratio)");
  // Grey is the plain mean of R, G and B (not luma): a pure red stroke counts a third.
  std::vector<cv::Mat> channels;
  cv::split(mask_rgb01, channels);
  const cv::Mat gray = (channels[0] + channels[1] + channels[2]) / 3.0;
  // To the working size (content, before padding): area interpolation averages the mask's pixels.
  cv::Mat content;
  cv::resize(gray, content, cv::Size(image.content_w, image.content_h), 0, 0, cv::INTER_AREA);
  const int p = config.patch_size, gh = image.grid.grid_h, gw = image.grid.grid_w;
  std::vector<uint8_t> forbidden(static_cast<size_t>(gh * gw), 0);
  for (int r = 0; r < gh; ++r)
    for (int c = 0; c < gw; ++c) {
      // The patch's pixels inside the content; padding patches cover few or none.
      const int x0 = c * p, y0 = r * p;
      const int x1 = std::min((c + 1) * p, image.content_w), y1 = std::min((r + 1) * p, image.content_h);
      if (x1 <= x0 || y1 <= y0) continue;  // all padding: masked by the padding rule
      const double mean = cv::mean(content(cv::Rect(x0, y0, x1 - x0, y1 - y0)))[0];
      forbidden[static_cast<size_t>(r * gw + c)] = mean < 0.5 ? 1 : 0;
    }
  return forbidden;
}

// [SECTION] Query in the source image's pixels

void source_to_processed_pixel(const PreparedImage& image, int x, int y, int& px, int& py) {
  if (x < 0 || y < 0 || x >= image.source_w || y >= image.source_h)
    throw Error("query pixel (" + std::to_string(x) + ", " + std::to_string(y) + ") is outside the " +
                std::to_string(image.source_w) + "x" + std::to_string(image.source_h) + " image");
  // The pixel's centre, scaled as prepare_image resized the image (content = source * factor).
  const double fx = static_cast<double>(image.content_w) / image.source_w;
  const double fy = static_cast<double>(image.content_h) / image.source_h;
  px = std::min(image.content_w - 1, static_cast<int>(std::floor((x + 0.5) * fx)));
  py = std::min(image.content_h - 1, static_cast<int>(std::floor((y + 0.5) * fy)));
}

}  // namespace vitlens
