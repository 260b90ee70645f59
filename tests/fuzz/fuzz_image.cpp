// libFuzzer harness: an image file's bytes through the path every user image takes in vitlens
// (decode_image_rgb: OpenCV decode, depth and channel conversion, pixel cap; then prepare_image
// for the bundled models' shape: resize to the working size, padding, patchify).
// Any input may be refused with vitlens::Error; anything else is a finding. README "Fuzzing".
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "core/model/vit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vitlens;
  const std::vector<unsigned char> bytes(data, data + size);
  try {
    const cv::Mat rgb = decode_image_rgb(bytes, "fuzz-input");
    const VitConfig config;  // P = 4, 224 x 224: the bundled models' shape
    (void)prepare_image(rgb, config, default_max_side(config), "fuzz-input");
  } catch (const Error&) {
    // not an image, too large, smaller than a patch: refused with a message, which is fine
  }
  return 0;
}
