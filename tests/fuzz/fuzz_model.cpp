// libFuzzer harness: the model loader, as `vitlens --model FILE` and the viewer's File > Open use
// it (parse_model = safetensors header, tensors, the config JSON in __metadata__, every shape
// checked against the config), then one forward pass, since a model that loads must also run.
// Any input may be refused with vitlens::Error; anything else (a crash, a sanitizer report, another
// exception type) is a finding. README "Fuzzing" says how to run it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "models/model_io.hpp"
#include "core/model/vit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vitlens;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  VitModel model;
  try {
    model = parse_model(bytes, "fuzz-input");
  } catch (const Error&) {
    return 0;
  }
  // A mid-grey image of 3 x 2 whole patches plus one row of pixels: a grid of 3 x 3 with a
  // padding row, which is not the config's grid, so the positional table is resized too.
  const int p = model.config.patch_size;
  const cv::Mat grey(2 * p + 1, 3 * p, CV_32FC3, cv::Scalar::all(0.5));
  try {
    const PreparedImage image = prepare_image(grey, model.config, 0, "fuzz-image");
    ForwardOptions options;
    options.threads = 1;
    const ForwardResult result = forward(model, image.grid, options);
    std::vector<float> row(static_cast<size_t>(result.tokens));
    attention_row(model, result, model.config.depth - 1, model.config.num_heads - 1, 0, row.data());
  } catch (const Error&) {
    // e.g. weights whose activations overflow: refused with a message, which is fine
  }
  return 0;
}
