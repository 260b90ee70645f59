#pragma once
// What an image file declares, read from its header before anything is decoded: the format, the
// pixel size, and whether the file holds all the data its structure promises. A small file can
// declare a huge image (a 2.6 MB PNG of 30000 x 30000 pixels decodes to 2.7 GB), and OpenCV
// decodes a truncated JPEG into a partly grey picture with only a warning on stderr; both are
// found here, from the bytes, in microseconds.
#include <cstddef>
#include <cstdint>
#include <string>

namespace vitlens {

struct ImageProbe {
  std::string format;          // "PNG", "JPEG", ...; empty: not a format vitlens reads
  int64_t width = -1, height = -1;  // as declared; -1 when the header does not say
  // What one pixel holds, as declared: samples (a palette counts as the colours it indexes) and
  // bits per sample (1 to 64). They size the decode before it runs (image.cpp); -1: not declared.
  int channels = -1, bits = -1;
  bool float_samples = false;  // PFM, Radiance HDR, OpenEXR, float TIFF: decoded through float buffers
  bool progressive = false;    // a progressive JPEG: libjpeg holds every DCT coefficient while decoding
  std::string damage;          // empty, or why the file is damaged ("ends before its IEND chunk")
};

// The formats probe_image knows, for messages.
extern const char* const kImageFormatsRead;

// Reads the header (and, for PNG, JPEG, BMP, TIFF, WebP, PNM and PFM, the structure up to the
// end marker or the end of the pixel data). Never reads outside [data, data + size).
ImageProbe probe_image(const unsigned char* data, size_t size);

}  // namespace vitlens
