#pragma once
// Images in, patch tokens out. Every user image goes through here, in the CLI and the viewer.
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "vitlens/vit.hpp"

namespace vitlens {

// Largest image (in pixels) vitlens decodes: a 120-megapixel photo is 1.4 GB as float RGB. The
// size is read from the file's header and checked before any pixel is decoded.
constexpr double kMaxImagePixels = 120e6;
// Largest image file vitlens reads (2000 MiB): above any file of kMaxImagePixels pixels (a
// 120-megapixel float RGBA TIFF or EXR is 1831 MiB), and within what one OpenCV buffer holds (its
// length is an int).
constexpr uint64_t kMaxImageFileBytes = uint64_t{2000} << 20;

// Reads any image OpenCV can decode and returns it as CV_32FC3 RGB in [0, 1]:
// 8-bit / 255, 16-bit / 65535, float as is (clamped); grayscale is replicated to RGB; an alpha
// channel is dropped (as PIL's convert("RGB")). OpenCV decodes BGR: converted here. EXIF
// orientation is not applied: pixels are taken as stored, as PIL's Image.open gives them.
// Throws vitlens::Error naming the path when the file is missing, unreadable, larger than
// kMaxImageFileBytes, not an image of a format image_probe.hpp knows, declares more than
// kMaxImagePixels pixels (found in the header, before decoding) or is damaged (truncated).
// The file is read once into one buffer, which the decoder reads in place.
cv::Mat load_image_rgb(const std::string& path);

// A whole file's bytes, read once into the returned string; `kind` names it in errors ("an
// image file"). Throws vitlens::Error for a missing path, a folder, an unreadable file, a file
// larger than max_bytes (checked before reading; the message gives the limit) or too little memory.
std::string read_whole_file(const std::string& path, const std::string& kind, uint64_t max_bytes);

// The same from bytes already in memory. `what` names it in errors.
cv::Mat decode_image_rgb(const unsigned char* bytes, size_t size, const std::string& what);
inline cv::Mat decode_image_rgb(const std::vector<unsigned char>& bytes, const std::string& what) {
  return decode_image_rgb(bytes.data(), bytes.size(), what);
}

// The processed image the model sees, before normalisation.
struct PreparedImage {
  cv::Mat rgb;          // CV_32FC3 RGB in [0, 1], padded_h x padded_w, padding = 0 (black)
  int content_w = 0, content_h = 0;  // the image after resizing, before padding
  int padded_w = 0, padded_h = 0;    // grid * P
  int source_w = 0, source_h = 0;    // as loaded
  bool resized = false;
  PatchGrid grid;       // normalised patches and the padding flags
};

// Size policy: max_side > 0 downscales (area interpolation, aspect kept) so the long side is at
// most max_side; max_side == 0 keeps the native size; an image is never upscaled and an image
// whose size equals the model's img_size is never resampled. The result is padded on the right
// and bottom up to whole patches; padded patches are flagged (and masked as keys by default).
// Throws vitlens::Error when a side is smaller than one patch.
PreparedImage prepare_image(const cv::Mat& rgb01, const VitConfig& config, int max_side,
                            const std::string& what = "image");

// Patchify: (gh*gw, 3*P*P), patches in row-major order, each flattened channel-major (c, y, x)
// exactly as timm's Conv2d patch embedding reads it; pixels normalised (x - mean) / std.
MatRM patchify(const cv::Mat& rgb01, const VitConfig& config);

// The default long side for a model: its img_size's long side.
int default_max_side(const VitConfig& config);

}  // namespace vitlens
