#pragma once
// Attention maps to pictures: colour maps, upsampling to pixels, blending over the image, the
// montage and the colour bar. The viewer uploads exactly these images as textures, so what is
// exported is what is on screen.
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "vitlens/eigen.hpp"

namespace vitlens {

enum class Upsample { Nearest, Bilinear };

struct HeatmapStyle {
  std::string colormap = "viridis";  // see colormap_names()
  float alpha = 0.6f;                // heat opacity over the image, [0, 1]
  Upsample upsample = Upsample::Nearest;
};

const std::vector<std::string>& colormap_names();  // viridis, inferno, magma, jet, turbo, ...
bool is_colormap(const std::string& name);

// values in [0, 1] (CV_32F, any size) -> CV_8UC3 RGB through the named colour map.
cv::Mat apply_colormap(const cv::Mat& unit_values, const std::string& colormap);

// (gh, gw) map -> CV_32F (gh*P, gw*P) in [0, 1]: divided by `scale_max` (> 0), upsampled.
cv::Mat upsample_map(const MatRM& map, int patch_size, float scale_max, Upsample upsample);

// The map blended over the processed image (CV_32FC3 RGB [0,1]) -> CV_8UC3 RGB of its size.
cv::Mat heatmap_overlay(const cv::Mat& rgb01, const MatRM& map, int patch_size, float scale_max,
                        const HeatmapStyle& style);

// Tiles with a label strip above each, `columns` per row -> CV_8UC3 RGB.
cv::Mat montage(const std::vector<cv::Mat>& tiles, const std::vector<std::string>& labels, int columns);

// A horizontal colour bar with min/max labels, `width` pixels wide -> CV_8UC3 RGB.
cv::Mat colorbar(const std::string& colormap, int width, float low, float high);

}  // namespace vitlens
