#pragma once
// A model's own preprocessing (`--preprocess model`): the transform its library applies before
// the model sees an image, reproduced pixel for pixel, as the other choice to vitlens' whole-image
// mode (prepare_image in image.hpp: the whole image, aspect kept, padding masked).
//
// The steps, in the libraries' order:
//   1. resize  shortest edge to S (aspect kept: long = int(S * long / short)) or to exactly H x W,
//              in 8-bit with Pillow's or torch's arithmetic (resample.hpp)
//   2. crop    the centre H' x W' (top = round((h - H') / 2) half-to-even in torchvision's
//              CenterCrop, which timm uses; (h - H') // 2 in transformers)
//   3. scale   x * rescale_factor (1/255: x / 255 as ToTensor), then (x - mean) / std at patchify
// except with rescale_first (transformers' DINOv3ViTImageProcessor): x * rescale_factor in float32
// first (torch's uint8 tensor * the factor as float), then the resize on the float image (torch's
// antialiased bilinear on a float tensor, resample_rgb32f_torch), the crop, then (x - mean) / std.
// Where the maps can be exact: the file is an 8-bit image of at most kMaxLoadSide a side (larger
// files are reduced by the loader first), decoded to the same bytes as PIL decodes it (PNG always;
// JPEG decoders may differ).
#include <array>
#include <string>

#include "core/io/image.hpp"
#include "core/io/resample.hpp"

namespace vitlens {

enum class ResizeRule { None, ShortestEdge, Exact };
enum class CropRounding { TorchvisionRound, FloorHalf };

// Shapes: every size in pixels; a default ImageTransform is no transform.
struct ImageTransform {
  std::string origin;                  // where it was read, for captions: "timm pretrained_cfg in config.json"
  std::string library;                 // whose pipeline it reproduces: "timm eval transform (PIL)", ...
  ResizeRule resize = ResizeRule::None;
  int resize_short = 0;                // ShortestEdge: the short side after resizing (S)
  int resize_w = 0, resize_h = 0;      // Exact
  ResampleFilter filter = ResampleFilter::Bilinear;
  ResampleEngine engine = ResampleEngine::Pillow;
  bool center_crop = false;
  int crop_w = 0, crop_h = 0;
  CropRounding crop_rounding = CropRounding::TorchvisionRound;
  double rescale_factor = 1.0 / 255.0; // pixels = x * factor (1/255 is computed as x / 255)
  bool rescale_first = false;          // rescale to float before resizing (engine TorchAntialias, Bilinear)
  bool normalize = true;
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};

  bool present() const { return resize != ResizeRule::None || center_crop; }
  // One line: "resize shortest edge 248 bicubic (pillow), center crop 224x224, mean ... std ..."
  std::string describe() const;
};

// The size after step 1 for a w x h image.
cv::Size transform_resized_size(const ImageTransform& t, int w, int h);

// Steps 1 and 2 on 8-bit pixels (a transform with rescale_first is refused: it resizes floats): rgb8 CV_8UC3 (h, w, 3) -> CV_8UC3 (crop or resize size). Throws
// vitlens::Error (naming `what`) when the crop is larger than the resized image.
cv::Mat apply_transform_rgb8(const cv::Mat& rgb8, const ImageTransform& t, const std::string& what);

// The whole transform as a PreparedImage: content = the transformed image, padded to whole
// patches (padding masked as in prepare_image). `config`'s mean/std are replaced by the
// transform's when it normalises (none: mean 0, std 1). The loaded image's float pixels are taken
// back to 8 bits (exact for an 8-bit file). Throws vitlens::Error naming `what`.
PreparedImage prepare_image_transformed(const LoadedImage& image, const VitConfig& config,
                                        const ImageTransform& t, const std::string& what = "image");

// The config patchify should normalise with under a transform.
VitConfig config_with_transform(const VitConfig& config, const ImageTransform& t);

}  // namespace vitlens
