#pragma once
// The models and the image that ship with vitlens, made by code (tools: vitlens_make_assets):
//   - the designed model: one block, four heads whose W_q, W_k are written from formulas so that
//     each head has one documented job (assets/README.md explains the design);
//   - the random model: the same shape with a seeded timm-like random init, as the control;
//   - the demo image, with per-patch labels saying which class each patch belongs to, so the tests
//     can measure whether each designed head does its job.
//
// The design vocabulary below (edge directions, texture tiles, hue colours) is shared by the model
// generator and the image generator: the model's filters are computed from the same tile and
// colour definitions the image is drawn with, and the tests name classes with the same numbers.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "models/model_io.hpp"

namespace vitlens {

// [SECTION] Design vocabulary

// The designed model's heads, in order.
enum DesignedHead : int { kEdgeHead = 0, kTextureHead = 1, kColourHead = 2, kPositionHead = 3 };

// Edge classes are luminance gradient directions in image coordinates (x right, y down), in steps
// of 45 degrees: class k = direction 45k degrees, 0 = brighter to the right, 2 = brighter below.
// Classes k and k + 4 are the same orientation with opposite polarity; the edge head tells them
// apart (a bilinear q . k changes sign with the contrast, so it cannot ignore polarity).
constexpr int kEdgeClasses = 8;

// Texture classes: grid-aligned 4x4-periodic luminance tiles, see texture_pattern().
constexpr int kTextureClasses = 6;
const char* texture_name(int texture);  // "vertical stripes (period 2)", ...

// Zero-mean pattern value in [-1, 1] of `texture` at absolute pixel (x, y). Every pattern repeats
// every 4 pixels in x and y, so on the 4-pixel patch grid each patch holds the same tile.
float texture_pattern(int texture, int x, int y);

// Colour classes: hues 60k degrees, k = 0..5 (red, yellow, green, cyan, blue, magenta).
constexpr int kColourClasses = 6;
const char* colour_name(int colour);

// The chroma plane: two unit RGB axes orthogonal to grey (1, 1, 1). Hue is the angle in this
// plane measured from `kChromaRed` towards `kChromaGreenBlue`; red = 0, yellow = 60, ...
constexpr double kInvSqrt6 = 0.40824829046386301637;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr std::array<double, 3> kChromaRed{2.0 * kInvSqrt6, -kInvSqrt6, -kInvSqrt6};  // (2R - G - B) / sqrt 6
constexpr std::array<double, 3> kChromaGreenBlue{0.0, kInvSqrt2, -kInvSqrt2};          // (G - B) / sqrt 2

// RGB in [0, 1] of the colour with hue `hue_degrees` at distance `chroma` from mid grey in the
// chroma plane. Its channel mean is 0.5: on the mid-grey background it has no luminance edge.
std::array<double, 3> hue_rgb(double hue_degrees, double chroma);

// [SECTION] Models

struct ModelTensors {
  VitConfig config;
  TensorMap tensors;  // timm names, see model_io.hpp
};

// The designed model "vitlens-designed-4head": depth 1, P = 4, D = 48, H = 4, 224 x 224.
ModelTensors designed_model();

// The control "vitlens-random-4head": the same shape, timm-like init from std::mt19937(seed).
constexpr uint32_t kRandomModelSeed = 20240611u;
ModelTensors random_model(uint32_t seed = kRandomModelSeed);

// Every tensor of any config filled from N(0, scale^2), LayerNorm weights from 1 + N(0, 0.1^2):
// attention far from uniform, for tests and benchmarks. std::normal_distribution, so the values
// may differ between standard libraries (unlike random_model, whose bytes are shipped).
TensorMap gaussian_tensors(const VitConfig& config, uint32_t seed, float scale = 0.3f);

// [SECTION] Demo image

struct DemoImage {
  cv::Mat rgb;                     // CV_8UC3 RGB, 224 x 224
  int grid_h = 0, grid_w = 0;      // gh = gw = 56 patches of 4 px
  std::vector<int> texture_class;  // (gh*gw) 0..5 patch filled with one texture tile, else -1
  std::vector<int> edge_class;     // (gh*gw) 0..7 a straight luminance edge through the centre, else -1
  std::vector<int> colour_class;   // (gh*gw) 0..5 patch filled with one hue, else -1
};

// Deterministic: same pixels and labels on every call and machine (fixed noise seed).
DemoImage make_demo_image();

}  // namespace vitlens
