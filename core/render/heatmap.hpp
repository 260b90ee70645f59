#pragma once
// Attention maps to pictures: colour maps, upsampling to pixels, blending over the image, the
// montage with its colour bar and caption. The viewer uploads exactly these images as textures, so what is
// exported is what is on screen.
#include <string>
#include <utility>
#include <vector>

#include <opencv2/core.hpp>

#include "core/base/enum_names.hpp"
#include "core/base/eigen.hpp"

namespace vitlens {

enum class Upsample { Nearest, Bilinear };
inline constexpr EnumName<Upsample> kUpsampleNames[] = {{Upsample::Nearest, "nearest"}, {Upsample::Bilinear, "bilinear"}};
const char* upsample_name(Upsample upsample);                     // "nearest", "bilinear"
bool parse_upsample(const std::string& name, Upsample& upsample);

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

// [SECTION] Montage layout
// Text is OpenCV's Hershey simplex font (ASCII). The layout is computed first, as boxes, so tests
// can check that no text leaves the canvas or runs into other text at any image size; drawing
// then only follows the layout.

struct TextItem {
  std::string text;
  cv::Point origin;  // baseline start, as cv::putText takes it
  double scale = 0.4;
  cv::Rect box;      // the pixels the text may touch: origin.y - height .. origin.y + baseline
};

// Width and box height of `text` at `scale` (Hershey simplex, thickness 1).
cv::Size text_extent(const std::string& text, double scale);

// Splits text into lines no wider than max_width pixels at `scale`: at spaces where it can, inside
// a word where the word alone is too wide. Never returns a line wider than max_width (a width
// below one character still gets one character a line). '\n' starts a new line.
std::vector<std::string> wrap_text(const std::string& text, double scale, int max_width);

// A colour bar below the tiles: `ticks` are (position in [0, 1] along the bar, label).
struct ColourBarSpec {
  std::string colormap = "viridis";
  std::string title;  // what the bar's values are, drawn above it
  std::vector<std::pair<float, std::string>> ticks;
};

struct MontageLayout {
  cv::Size canvas;
  int zoom = 1;                 // small tiles are enlarged by this integer factor (nearest)
  std::vector<cv::Rect> tiles;  // where each tile goes (tile size times zoom)
  std::vector<TextItem> texts;  // tile labels, colour bar title and ticks, caption lines
  cv::Rect colour_bar;          // the bar itself (empty without a spec)
};

// Smallest side a montage tile is drawn at: a 16 x 16 image's tiles are enlarged 10 times, so
// labels and colour bar fit beside them in a legible font.
constexpr int kMinMontageTile = 160;
constexpr int kMinLegendWidth = 480;  // the narrowest picture that carries a colour bar or caption

// Tiles of tile_size in `columns` columns, each with its label (wrapped) above it, then the colour
// bar (when `bar` has ticks), then the caption lines (each wrapped to the canvas width).
MontageLayout layout_montage(cv::Size tile_size, const std::vector<std::string>& labels, int tile_count, int columns,
                             const ColourBarSpec* bar, const std::vector<std::string>& caption);

// Draws `tiles` (all the same size, CV_8UC3 RGB) into the layout -> CV_8UC3 RGB.
cv::Mat montage(const std::vector<cv::Mat>& tiles, const std::vector<std::string>& labels, int columns,
                const ColourBarSpec* bar = nullptr, const std::vector<std::string>& caption = {});

}  // namespace vitlens
