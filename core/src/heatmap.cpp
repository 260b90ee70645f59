// Attention maps to pictures. OpenCV's colour maps (cv::applyColorMap) supply the palettes.
#include "vitlens/heatmap.hpp"

#include <algorithm>
#include <cstdio>

#include <opencv2/imgproc.hpp>

#include "vitlens/error.hpp"

namespace vitlens {

namespace {

struct NamedMap {
  const char* name;
  int cv_code;
};
const NamedMap kColormaps[] = {
    {"viridis", cv::COLORMAP_VIRIDIS}, {"inferno", cv::COLORMAP_INFERNO}, {"magma", cv::COLORMAP_MAGMA},
    {"plasma", cv::COLORMAP_PLASMA},   {"jet", cv::COLORMAP_JET},         {"turbo", cv::COLORMAP_TURBO},
    {"hot", cv::COLORMAP_HOT},         {"bone", cv::COLORMAP_BONE},       {"cividis", cv::COLORMAP_CIVIDIS},
};

int colormap_code(const std::string& name) {
  for (const auto& m : kColormaps)
    if (name == m.name) return m.cv_code;
  std::string known;
  for (const auto& n : colormap_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown colormap '" + name + "' (known: " + known + ")");
}

cv::Mat to_rgb8(const cv::Mat& rgb01) {
  cv::Mat out;
  rgb01.convertTo(out, CV_8UC3, 255.0);
  return out;
}

std::string format_value(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", static_cast<double>(v));
  return buf;
}

}  // namespace

const std::vector<std::string>& colormap_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& m : kColormaps) v.push_back(m.name);
    return v;
  }();
  return names;
}

bool is_colormap(const std::string& name) {
  const auto& names = colormap_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

cv::Mat apply_colormap(const cv::Mat& unit_values, const std::string& colormap) {
  const int code = colormap_code(colormap);
  cv::Mat bytes, bgr, rgb;
  unit_values.convertTo(bytes, CV_8U, 255.0);  // saturating: values are clamped to [0, 255]
  cv::applyColorMap(bytes, bgr, code);
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

cv::Mat upsample_map(const MatRM& map, int patch_size, float scale_max, Upsample upsample) {
  cv::Mat grid(static_cast<int>(map.rows()), static_cast<int>(map.cols()), CV_32F);
  const float inv = scale_max > 0.0f ? 1.0f / scale_max : 0.0f;
  for (int r = 0; r < grid.rows; ++r)
    for (int c = 0; c < grid.cols; ++c) grid.at<float>(r, c) = std::clamp(map(r, c) * inv, 0.0f, 1.0f);
  cv::Mat pixels;
  cv::resize(grid, pixels, cv::Size(grid.cols * patch_size, grid.rows * patch_size), 0, 0,
             upsample == Upsample::Nearest ? cv::INTER_NEAREST : cv::INTER_LINEAR);
  return pixels;
}

cv::Mat heatmap_overlay(const cv::Mat& rgb01, const MatRM& map, int patch_size, float scale_max,
                        const HeatmapStyle& style) {
  if (!(style.alpha >= 0.0f && style.alpha <= 1.0f)) throw Error("alpha must be in [0, 1]");
  const cv::Mat heat = apply_colormap(upsample_map(map, patch_size, scale_max, style.upsample), style.colormap);
  if (heat.size() != rgb01.size()) throw Error("internal: heatmap and image sizes differ");
  cv::Mat out;
  cv::addWeighted(to_rgb8(rgb01), 1.0 - style.alpha, heat, style.alpha, 0.0, out);
  return out;
}

cv::Mat montage(const std::vector<cv::Mat>& tiles, const std::vector<std::string>& labels, int columns) {
  if (tiles.empty()) throw Error("montage: no tiles");
  const int tw = tiles[0].cols, th = tiles[0].rows;
  const int strip = 22;  // label strip height in pixels
  const int gap = 4;
  columns = std::max(1, std::min(columns, static_cast<int>(tiles.size())));
  const int rows = (static_cast<int>(tiles.size()) + columns - 1) / columns;
  cv::Mat out(rows * (th + strip + gap) + gap, columns * (tw + gap) + gap, CV_8UC3, cv::Scalar(24, 24, 24));
  const double font_scale = std::clamp(tw / 260.0, 0.35, 0.6);
  for (size_t i = 0; i < tiles.size(); ++i) {
    const int r = static_cast<int>(i) / columns, c = static_cast<int>(i) % columns;
    const int x = gap + c * (tw + gap), y = gap + r * (th + strip + gap);
    if (i < labels.size()) {
      // Shrink a long label until it fits its tile.
      double scale = font_scale;
      int base = 0;
      while (scale > 0.25 && cv::getTextSize(labels[i], cv::FONT_HERSHEY_SIMPLEX, scale, 1, &base).width > tw - 4)
        scale -= 0.05;
      cv::putText(out, labels[i], cv::Point(x + 2, y + strip - 7), cv::FONT_HERSHEY_SIMPLEX, scale,
                  cv::Scalar(235, 235, 235), 1, cv::LINE_AA);
    }
    tiles[i].copyTo(out(cv::Rect(x, y + strip, tw, th)));
  }
  return out;
}

cv::Mat colorbar(const std::string& colormap, int width, float low, float high) {
  width = std::max(width, 64);
  cv::Mat ramp(1, width, CV_32F);
  for (int x = 0; x < width; ++x) ramp.at<float>(0, x) = static_cast<float>(x) / static_cast<float>(width - 1);
  cv::Mat bar;
  cv::resize(apply_colormap(ramp, colormap), bar, cv::Size(width, 14), 0, 0, cv::INTER_NEAREST);
  cv::Mat out(34, width, CV_8UC3, cv::Scalar(24, 24, 24));
  bar.copyTo(out(cv::Rect(0, 0, width, 14)));
  const std::string lo = format_value(low), hi = format_value(high);
  int base = 0;
  const cv::Size hs = cv::getTextSize(hi, cv::FONT_HERSHEY_SIMPLEX, 0.4, 1, &base);
  cv::putText(out, lo, cv::Point(1, 29), cv::FONT_HERSHEY_SIMPLEX, 0.4, cv::Scalar(235, 235, 235), 1, cv::LINE_AA);
  cv::putText(out, hi, cv::Point(width - hs.width - 1, 29), cv::FONT_HERSHEY_SIMPLEX, 0.4, cv::Scalar(235, 235, 235), 1,
              cv::LINE_AA);
  return out;
}

}  // namespace vitlens
