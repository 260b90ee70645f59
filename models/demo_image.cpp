// The demo image (assets/images/vitlens-demo.png) and its per-patch labels, drawn by code.
//
// 224 x 224 pixels = 56 x 56 patches of P = 4; positions below are in patches, (row, col).
//   top left      textures: 3 x 3 swatches of 8 x 8 patches (six tiles, two of them twice, and
//                 one swatch of noise), drawn in absolute pixel coordinates so every tile sits on
//                 the patch grid
//   top right     edges: a bright and a dark square (edges at 0 / 90 degrees) and a bright and a
//                 dark diamond (45 / 135 degrees); every straight edge runs through patch centres,
//                 so each edge direction appears on two shapes with the same contrast
//   bottom left   six discs, one per hue
//   bottom right  a smooth grey ramp, and six rectangles with the same hues in another order
// The background is mid grey. The colours have the grey's luminance (hue_rgb), so colour shapes
// make no luminance edges, and the textures and edge shapes are grey: each patch has at most one
// of the three properties the designed heads look for, and the labels say which.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "models/bundled.hpp"

namespace vitlens {

namespace {

constexpr int kSide = 224;
constexpr int kPatch = 4;
constexpr int kGrid = kSide / kPatch;  // 56

constexpr double kGrey = 0.5;              // background, and the mean of every texture and colour
constexpr double kTextureAmplitude = 0.3;  // texture tiles are 0.5 +- 0.3 * pattern
constexpr double kNoiseAmplitude = 0.15;   // uniform grey noise 0.5 +- 0.15
constexpr double kChroma = 0.6;            // distance of each colour from grey in the chroma plane
constexpr double kBright = 0.95, kDark = 0.05;  // edge shapes
constexpr uint32_t kNoiseSeed = 7u;

// A signed distance to a shape's outline at pixel centre (x + 0.5, y + 0.5): > 0 inside.
using SignedDistance = std::function<double(double x, double y)>;

struct Canvas {
  std::vector<double> rgb = std::vector<double>(kSide * kSide * 3, kGrey);  // (H, W, 3) in [0, 1]
  DemoImage labels;

  Canvas() {
    labels.grid_h = labels.grid_w = kGrid;
    labels.texture_class.assign(kGrid * kGrid, -1);
    labels.edge_class.assign(kGrid * kGrid, -1);
    labels.colour_class.assign(kGrid * kGrid, -1);
  }

  void set_grey(int x, int y, double v) {
    for (int c = 0; c < 3; ++c) rgb[(y * kSide + x) * 3 + c] = v;
  }

  // Paints a shape with a one-pixel anti-aliased outline: coverage clamp(d + 1/2, 0, 1). Pixel
  // centres on a straight edge through patch centres get exactly 0, 1/2 or 1. Returns the
  // coverage per pixel (H, W).
  std::vector<double> paint(const SignedDistance& inside, const std::array<double, 3>& colour) {
    std::vector<double> coverage(kSide * kSide, 0.0);
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x) {
        const double a = std::clamp(inside(x + 0.5, y + 0.5) + 0.5, 0.0, 1.0);
        coverage[y * kSide + x] = a;
        for (int c = 0; c < 3; ++c) {
          double& v = rgb[(y * kSide + x) * 3 + c];
          v = v * (1.0 - a) + colour[c] * a;
        }
      }
    return coverage;
  }

  // Labels with `colour` every patch the shape covers completely.
  void label_covered(const std::vector<double>& coverage, int colour) {
    for (int r = 0; r < kGrid; ++r)
      for (int c = 0; c < kGrid; ++c) {
        bool full = true;
        for (int y = 0; y < kPatch && full; ++y)
          for (int x = 0; x < kPatch && full; ++x) full = coverage[(r * kPatch + y) * kSide + c * kPatch + x] >= 1.0;
        if (full) labels.colour_class[r * kGrid + c] = colour;
      }
  }
};

// A texture swatch of rows x cols patches at patch (r0, c0).
void texture_swatch(Canvas& canvas, int r0, int c0, int rows, int cols, int texture) {
  // In whole 8-bit levels around the background's level, so every tile's mean is exactly the
  // background's: rounding 0.5 + a and 0.5 - a separately leaves a tile half a level darker
  // (127.5 against 128), a colour difference that the head-role measure would see.
  const double grey_level = static_cast<double>(std::lround(kGrey * 255.0));
  for (int y = r0 * kPatch; y < (r0 + rows) * kPatch; ++y)
    for (int x = c0 * kPatch; x < (c0 + cols) * kPatch; ++x) {
      const double step = static_cast<double>(std::lround(kTextureAmplitude * 255.0 * texture_pattern(texture, x, y)));
      canvas.set_grey(x, y, (grey_level + step) / 255.0);
    }
  for (int r = r0; r < r0 + rows; ++r)
    for (int c = c0; c < c0 + cols; ++c) canvas.labels.texture_class[r * kGrid + c] = texture;
}

// Uniform grey noise. It matches no texture tile, so its patches keep texture class -1.
void noise_swatch(Canvas& canvas, int r0, int c0, int rows, int cols, std::mt19937& rng) {
  for (int y = r0 * kPatch; y < (r0 + rows) * kPatch; ++y)
    for (int x = c0 * kPatch; x < (c0 + cols) * kPatch; ++x) {
      // (0, 1) from one 32-bit draw: the same on every standard library, unlike the distributions.
      const double u = (static_cast<double>(rng()) + 0.5) / 4294967296.0;
      canvas.set_grey(x, y, kGrey + kNoiseAmplitude * (2.0 * u - 1.0));
    }
}

// Edge class of a side whose outward normal has direction `outward` (0..7, 45-degree steps): the
// luminance gradient points inward for a bright shape and outward for a dark one.
int edge_class(int outward, bool bright) { return (outward + (bright ? 4 : 0)) % 8; }

// An axis-aligned square whose sides run along the centre lines of patch columns c0, c1 and patch
// rows r0, r1. Each side labels its patches; the four corner patches hold two edges and stay -1.
void edge_square(Canvas& canvas, int r0, int c0, int r1, int c1, double value) {
  const double x0 = c0 * kPatch + 2, x1 = c1 * kPatch + 2, y0 = r0 * kPatch + 2, y1 = r1 * kPatch + 2;
  canvas.paint([=](double x, double y) { return std::min({x - x0, x1 - x, y - y0, y1 - y}); },
               {value, value, value});
  const bool bright = value > kGrey;
  for (int r = r0 + 1; r < r1; ++r) {
    canvas.labels.edge_class[r * kGrid + c0] = edge_class(4, bright);  // left side faces 180
    canvas.labels.edge_class[r * kGrid + c1] = edge_class(0, bright);  // right side faces 0
  }
  for (int c = c0 + 1; c < c1; ++c) {
    canvas.labels.edge_class[r0 * kGrid + c] = edge_class(6, bright);  // top faces 270 (up)
    canvas.labels.edge_class[r1 * kGrid + c] = edge_class(2, bright);  // bottom faces 90 (down)
  }
}

// A diamond |x - cx| + |y - cy| < radius with centre on the patch corner (4 cc, 4 cr) and radius
// 4 rp: its sides x +- y = const run through patch centres. Labelled: the patches whose centre
// lies on a side (none of them contains a vertex, which sit on patch corners).
void edge_diamond(Canvas& canvas, int cr, int cc, int rp, double value) {
  const double cx = cc * kPatch, cy = cr * kPatch, radius = rp * kPatch;
  canvas.paint([=](double x, double y) { return (radius - std::abs(x - cx) - std::abs(y - cy)) * kInvSqrt2; },
               {value, value, value});
  const bool bright = value > kGrey;
  for (int r = 0; r < kGrid; ++r)
    for (int c = 0; c < kGrid; ++c) {
      const int dx = c * kPatch + 2 - cc * kPatch, dy = r * kPatch + 2 - cr * kPatch;
      if (std::abs(dx) + std::abs(dy) != rp * kPatch) continue;
      // Outward normal of the side: (+,+) 45, (-,+) 135, (-,-) 225, (+,-) 315 degrees.
      const int outward = dx > 0 ? (dy > 0 ? 1 : 7) : (dy > 0 ? 3 : 5);
      canvas.labels.edge_class[r * kGrid + c] = edge_class(outward, bright);
    }
}

}  // namespace

DemoImage make_demo_image() {
  Canvas canvas;

  // Textures: a 3 x 3 grid of 8 x 8-patch swatches with one-patch gaps; -1 is the noise swatch.
  const int swatches[3][3] = {{0, 1, 2}, {3, -1, 4}, {5, 0, 3}};
  std::mt19937 rng(kNoiseSeed);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const int r0 = 1 + 9 * i, c0 = 1 + 9 * j;
      if (swatches[i][j] < 0) noise_swatch(canvas, r0, c0, 8, 8, rng);
      else texture_swatch(canvas, r0, c0, 8, 8, swatches[i][j]);
    }

  // Edges: every direction twice, on a bright and on a dark shape.
  edge_square(canvas, 2, 30, 11, 39, kBright);
  edge_square(canvas, 15, 30, 24, 39, kDark);
  edge_diamond(canvas, 7, 48, 6, kDark);
  edge_diamond(canvas, 20, 48, 6, kBright);

  // Colours: discs of radius 14 px, hue 60k degrees; then rectangles on the patch grid.
  for (int k = 0; k < kColourClasses; ++k) {
    const double cx = 20 + 36 * (k % 3), cy = 136 + 44 * (k / 3);
    const auto coverage = canvas.paint(
        [=](double x, double y) { return 14.0 - std::sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy)); },
        hue_rgb(60.0 * k, kChroma));
    canvas.label_covered(coverage, k);
  }
  for (int k = 0; k < kColourClasses; ++k) {
    const int hue = (k + 3) % kColourClasses;
    const double x0 = (30 + 9 * (k % 3)) * kPatch, y0 = (43 + 6 * (k / 3)) * kPatch;
    const double x1 = x0 + 7 * kPatch, y1 = y0 + 5 * kPatch;
    const auto coverage = canvas.paint(
        [=](double x, double y) { return std::min({x - x0, x1 - x, y - y0, y1 - y}); }, hue_rgb(60.0 * hue, kChroma));
    canvas.label_covered(coverage, hue);
  }

  // A smooth gradient: grey ramp from 0.15 to 0.85 left to right over patches rows 29..40, cols
  // 29..55. Its borders lie on patch borders, so no patch holds a step; no labels.
  {
    const int x0 = 29 * kPatch, x1 = kSide - 1, y0 = 29 * kPatch, y1 = 41 * kPatch;
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x <= x1; ++x) canvas.set_grey(x, y, 0.15 + 0.7 * (x - x0) / static_cast<double>(x1 - x0));
  }

  // To 8-bit RGB.
  DemoImage out = std::move(canvas.labels);
  out.rgb.create(kSide, kSide, CV_8UC3);
  for (int y = 0; y < kSide; ++y) {
    auto* row = out.rgb.ptr<cv::Vec3b>(y);
    for (int x = 0; x < kSide; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v = std::clamp(canvas.rgb[(y * kSide + x) * 3 + c], 0.0, 1.0);
        row[x][c] = static_cast<unsigned char>(std::lround(v * 255.0));
      }
  }
  return out;
}

}  // namespace vitlens
