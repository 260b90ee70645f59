// A model's own preprocessing: resize, centre crop, rescale, as timm's and transformers' pipelines.
#include "core/io/preprocess.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "core/base/error.hpp"

namespace vitlens {

std::string ImageTransform::describe() const {
  std::string s;
  char buf[160];
  if (resize == ResizeRule::ShortestEdge) {
    std::snprintf(buf, sizeof buf, "resize shortest edge to %d", resize_short);
    s += buf;
  } else if (resize == ResizeRule::Exact) {
    std::snprintf(buf, sizeof buf, "resize to %dx%d", resize_w, resize_h);
    s += buf;
  }
  if (resize != ResizeRule::None)
    s += std::string(" ") + resample_filter_name(filter) + " (" + resample_engine_name(engine) +
         (rescale_first ? ", on the rescaled float image" : "") + ")";
  if (center_crop) {
    std::snprintf(buf, sizeof buf, "%scenter crop %dx%d", s.empty() ? "" : ", ", crop_w, crop_h);
    s += buf;
  }
  if (normalize) {
    std::snprintf(buf, sizeof buf, ", mean %.4g %.4g %.4g std %.4g %.4g %.4g", mean[0], mean[1], mean[2], std[0], std[1],
                  std[2]);
    s += buf;
  }
  return s;
}

cv::Size transform_resized_size(const ImageTransform& t, int w, int h) {
  if (t.resize == ResizeRule::Exact) return {t.resize_w, t.resize_h};
  if (t.resize == ResizeRule::None) return {w, h};
  // torchvision's _compute_resized_output_size and transformers' get_resize_output_image_size:
  // new_long = int(S * long / short), the division in double; a long side past what an int holds
  // (a hair-thin image) saturates, for checked_resized_size to refuse.
  const int short_side = std::min(w, h), long_side = std::max(w, h);
  if (short_side < 1) return {0, 0};
  const double new_long = std::floor(static_cast<double>(int64_t{t.resize_short} * long_side) / short_side);
  const int long_out = new_long >= static_cast<double>(INT_MAX) ? INT_MAX : static_cast<int>(new_long);
  return w <= h ? cv::Size(t.resize_short, long_out) : cv::Size(long_out, t.resize_short);
}

namespace {

// The most pixels the transform resizes an image to: its largest copy, the float image (12 bytes
// a pixel), within what one image's decode may take (kMaxDecodeBytes), about 45 megapixels. A
// model's own sizes (a side of 224 to about 1200) stay far below it even for a 20:1 panorama
// resized by its shortest edge; a config asking for more is damaged or is not for whole images.
constexpr double kMaxTransformPixels = static_cast<double>(kMaxDecodeBytes) / 12.0;

std::string megapixels(double pixels) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", pixels / 1e6);
  return text;
}

// Python's round() of (free / 2): half to even (torchvision CenterCrop: int(round((h - ch) / 2.0))).
int crop_offset(int free, CropRounding rounding) {
  if (rounding == CropRounding::FloorHalf) return free / 2;
  return static_cast<int>(std::nearbyint(free / 2.0));  // the default rounding mode: half to even
}

// The centre crop of steps 2 (any pixel type).
cv::Mat center_crop(const cv::Mat& resized, const ImageTransform& t, const std::string& what) {
  if (t.crop_w > resized.cols || t.crop_h > resized.rows)
    throw Error(what + ": the model's transform crops " + std::to_string(t.crop_w) + "x" + std::to_string(t.crop_h) +
                " from a " + std::to_string(resized.cols) + "x" + std::to_string(resized.rows) +
                " image, which the libraries pad: vitlens does not; use --preprocess whole");
  const int top = crop_offset(resized.rows - t.crop_h, t.crop_rounding);
  const int left = crop_offset(resized.cols - t.crop_w, t.crop_rounding);
  return resized(cv::Rect(left, top, t.crop_w, t.crop_h)).clone();
}

// The resize's size, refused before anything is allocated when it is empty or larger than
// kMaxTransformPixels (a shortest-edge resize of a thin image, a damaged config's size).
cv::Size checked_resized_size(const ImageTransform& t, const cv::Mat& image, const std::string& what) {
  const cv::Size size = transform_resized_size(t, image.cols, image.rows);
  const std::string size_text = std::to_string(size.width) + "x" + std::to_string(size.height);
  if (size.width < 1 || size.height < 1)
    throw Error(what + ": the model's transform resizes it to " + size_text + ", an empty image");
  const double pixels = static_cast<double>(size.width) * static_cast<double>(size.height);
  if (pixels > kMaxTransformPixels) {
    const std::string rule = t.resize == ResizeRule::ShortestEdge
                                 ? "resizes the shortest edge of this " + std::to_string(image.cols) + "x" +
                                       std::to_string(image.rows) + " image to " + std::to_string(t.resize_short) +
                                       ", giving "
                                 : "resizes it to ";
    throw Error(what + ": the model's transform (" + t.origin + ") " + rule + size_text + " (" + megapixels(pixels) +
                " megapixels), more than vitlens resizes an image to (" + megapixels(kMaxTransformPixels) +
                "); use --preprocess whole");
  }
  return size;
}

// rescale_first: x * factor in float32 (torch: uint8 tensor * factor, the factor as float), the
// float resize, the crop. CV_8UC3 -> CV_32FC3.
cv::Mat apply_transform_rescaled_first(const cv::Mat& rgb8, const ImageTransform& t, const std::string& what) {
  const cv::Size size = checked_resized_size(t, rgb8, what);
  const float factor = static_cast<float>(t.rescale_factor);
  cv::Mat rgbf(rgb8.rows, rgb8.cols, CV_32FC3);
  for (int y = 0; y < rgb8.rows; ++y) {
    const uint8_t* in = rgb8.ptr<uint8_t>(y);
    float* out = rgbf.ptr<float>(y);
    for (int i = 0; i < 3 * rgb8.cols; ++i) out[i] = static_cast<float>(in[i]) * factor;
  }
  if (t.resize != ResizeRule::None && size != rgbf.size())
    rgbf = resample_rgb32f_torch(rgbf, size.width, size.height, t.filter);
  return t.center_crop ? center_crop(rgbf, t, what) : rgbf;
}

}  // namespace

cv::Mat apply_transform_rgb8(const cv::Mat& rgb8, const ImageTransform& t, const std::string& what) {
  if (t.rescale_first) throw Error(what + ": internal: a transform that rescales first resizes float pixels");
  const cv::Size size = checked_resized_size(t, rgb8, what);
  cv::Mat resized = size == rgb8.size() ? rgb8 : resample_rgb8(rgb8, size.width, size.height, t.filter, t.engine);
  if (!t.center_crop) return resized;
  return center_crop(resized, t, what);
}

VitConfig config_with_transform(const VitConfig& config, const ImageTransform& t) {
  VitConfig c = config;
  c.mean = t.normalize ? t.mean : std::array<float, 3>{0.0f, 0.0f, 0.0f};
  c.std = t.normalize ? t.std : std::array<float, 3>{1.0f, 1.0f, 1.0f};
  return c;
}

PreparedImage prepare_image_transformed(const LoadedImage& image, const VitConfig& config, const ImageTransform& t,
                                        const std::string& what) {
  if (image.rgb01.type() != CV_32FC3) throw Error(what + ": internal: expected a CV_32FC3 image");
  // Back to the file's bytes: the loader stored x / 255 for an 8-bit file.
  cv::Mat rgb8;
  image.rgb01.convertTo(rgb8, CV_8UC3, 255.0);
  const cv::Mat out8 = t.rescale_first ? apply_transform_rescaled_first(rgb8, t, what)  // CV_32FC3 then
                                       : apply_transform_rgb8(rgb8, t, what);
  const int p = config.patch_size;
  if (out8.cols < p || out8.rows < p)
    throw Error(what + ": the model's transform gives a " + std::to_string(out8.cols) + "x" + std::to_string(out8.rows) +
                " image, smaller than one " + std::to_string(p) + "x" + std::to_string(p) + " patch");
  cv::Mat content;
  if (t.rescale_first)
    content = out8;  // already float, rescaled
  else if (t.rescale_factor == 1.0 / 255.0)
    out8.convertTo(content, CV_32FC3, 1.0 / 255.0);  // as the loader: the same float as ToTensor's x / 255
  else
    out8.convertTo(content, CV_32FC3, t.rescale_factor);
  // The padding and patchify of the whole-image mode, at the transformed image's own size (or
  // kMaxLoadSide a side, as prepare_image caps it): refused here if that makes it thinner than a
  // patch, where --size (prepare_image's advice) has no say.
  const int long_side = std::max(content.cols, content.rows), short_side = std::min(content.cols, content.rows);
  const bool model_size = content.cols == config.img_w && content.rows == config.img_h;  // never resampled
  if (!model_size && long_side > kMaxLoadSide &&
      std::lround(short_side * (static_cast<double>(kMaxLoadSide) / long_side)) < p)
    throw Error(what + ": the model's transform (" + t.origin + ") gives a " + std::to_string(out8.cols) + "x" +
                std::to_string(out8.rows) + " image, thinner than one " + std::to_string(p) + "x" + std::to_string(p) +
                " patch at the " + std::to_string(kMaxLoadSide) +
                " px a side vitlens works at; crop the image to a less elongated part first");
  LoadedImage transformed{content, content.cols, content.rows};
  PreparedImage out = prepare_image(transformed, config_with_transform(config, t), 0, what);
  out.source_w = image.source_w;
  out.source_h = image.source_h;
  out.resized = true;
  return out;
}

}  // namespace vitlens
