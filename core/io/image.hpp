#pragma once
// Images in, patch tokens out. Every user image goes through here, in the CLI and the viewer.
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "core/model/vit.hpp"

namespace vitlens {

// Largest image (in pixels) vitlens decodes: a 120-megapixel photo is 1.4 GB as float RGB. The
// size is read from the file's header and checked before any pixel is decoded.
constexpr double kMaxImagePixels = 120e6;
// Largest image file vitlens reads (2000 MiB): above any file of kMaxImagePixels pixels (a
// 120-megapixel float RGBA TIFF or EXR is 1831 MiB), and within what one OpenCV buffer holds (its
// length is an int).
constexpr uint64_t kMaxImageFileBytes = uint64_t{2000} << 20;

// The longest side vitlens ever works at (`vitlens export --size` takes at most this, the viewer
// less): an image is never decoded into a larger float copy than this.
constexpr int kMaxLoadSide = 2048;
// Most memory one image's decode may take (the decoded pixels plus the codec's own buffers,
// estimated from the header before decoding): an 8-bit RGBA decode of a kMaxImagePixels image
// (458 MiB) fits; a file whose decode does not fit even at 8 bits a sample is refused, naming it.
constexpr uint64_t kMaxDecodeBytes = uint64_t{512} << 20;

// An image as vitlens uses it: at most max_side pixels on its long side, and the size the file
// itself declares (coordinates the user gives, such as a query pixel, are in the file's pixels).
struct LoadedImage {
  cv::Mat rgb01;                   // CV_32FC3 RGB in [0, 1], long side <= the max_side it was loaded for
  int source_w = 0, source_h = 0;  // the file's own size
};

// THE image loader: every image vitlens reads (export, the viewer, training folders and photos)
// comes through here. Returns CV_32FC3 RGB in [0, 1]: 8-bit / 255, 16-bit / 65535, float as is
// (clamped); grayscale is replicated to RGB; an alpha channel is dropped (as PIL's
// convert("RGB")). OpenCV decodes BGR: converted here. EXIF orientation is not applied: pixels
// are taken as stored, as PIL's Image.open gives them.
// The decode is planned from the header before it runs: an image larger than max_side (<= 0 or
// above kMaxLoadSide: kMaxLoadSide) is downscaled by area in its decoded depth, so no full-size
// float copy is ever made, but never so far that its short side falls below min_short_side (for a
// centre crop of that side; a file's own short side if smaller); a JPEG is decoded reduced by
// libjpeg (IMREAD_REDUCED_*) when it is at least twice that size; a decode that would take more
// than kMaxDecodeBytes at its own depth runs at 8 bits a sample, and is refused when even that
// does not fit. An image of at most max_side comes out as the file holds it.
// Throws vitlens::Error naming the path when the file is missing, unreadable (read_whole_file),
// larger than kMaxImageFileBytes, not an image of a format image_probe.hpp knows, declares more
// than kMaxImagePixels pixels, needs more than kMaxDecodeBytes, is damaged (truncated) or when
// memory runs out (the float result counts: a thin strip kept at min_short_side can be refused).
// The file is read once into one buffer, which the decoder reads in place.
LoadedImage load_image(const std::string& path, int max_side = kMaxLoadSide, int min_short_side = 0);

// The same from bytes already in memory. `what` names it in errors.
LoadedImage decode_image(const unsigned char* bytes, size_t size, const std::string& what,
                         int max_side = kMaxLoadSide, int min_short_side = 0);

// load_image's pixels alone, at most kMaxLoadSide a side.
cv::Mat load_image_rgb(const std::string& path);
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
// most max_side; max_side == 0 keeps the loaded size (the native size, at most kMaxLoadSide); an image is never upscaled and an image
// whose size equals the model's img_size is never resampled. The result is padded on the right
// and bottom up to whole patches; padded patches are flagged (and masked as keys by default).
// Throws vitlens::Error when a side is smaller than one patch.
// The working size is computed from the source size, so an image loaded reduced gives the same
// grid as its file would at full size.
PreparedImage prepare_image(const LoadedImage& image, const VitConfig& config, int max_side,
                            const std::string& what = "image");
// The same for pixels that are their own source (source size = rgb01's size).
PreparedImage prepare_image(const cv::Mat& rgb01, const VitConfig& config, int max_side,
                            const std::string& what = "image");

// Patchify: (gh*gw, 3*P*P), patches in row-major order, each flattened channel-major (c, y, x)
// exactly as timm's Conv2d patch embedding reads it; pixels normalised (x - mean) / std.
MatRM patchify(const cv::Mat& rgb01, const VitConfig& config);

// The default long side for a model: its img_size's long side.
int default_max_side(const VitConfig& config);

}  // namespace vitlens
