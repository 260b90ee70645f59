// vitlens_make_assets OUTDIR: writes the bundled assets from their generators,
//   OUTDIR/models/vitlens-designed.safetensors   the hand-designed four-head model
//   OUTDIR/models/vitlens-random.safetensors     the seeded random control
//   OUTDIR/images/vitlens-demo.png               the demo image
// Run it on the source tree's assets/ after changing bundled_model.cpp or demo_image.cpp; the
// test "bundled assets match their generators" fails until the committed files are regenerated.
#include <filesystem>
#include <iostream>

#include "models/bundled.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: vitlens_make_assets OUTDIR   (e.g. the source tree's assets/)\n";
    return 2;
  }
  const std::string out = argv[1];
  try {
    for (const char* sub : {"/models", "/images"}) {
      std::error_code ec;
      std::filesystem::create_directories(out + sub, ec);
      if (ec) throw vitlens::Error(out + sub + ": cannot create the folder (" + ec.message() + ")");
    }
    const vitlens::ModelTensors designed = vitlens::designed_model();
    const vitlens::ModelTensors random = vitlens::random_model();
    const vitlens::DemoImage demo = vitlens::make_demo_image();
    const std::string designed_path = out + "/models/vitlens-designed.safetensors";
    const std::string random_path = out + "/models/vitlens-random.safetensors";
    const std::string image_path = out + "/images/vitlens-demo.png";
    vitlens::save_model(designed_path, designed.config, designed.tensors);
    vitlens::save_model(random_path, random.config, random.tensors);
    vitlens::write_png_atomic(image_path, demo.rgb);
    for (const std::string& p : {designed_path, random_path, image_path}) std::cout << "wrote " << p << "\n";
  } catch (const vitlens::Error& e) {
    std::cerr << "vitlens_make_assets: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
