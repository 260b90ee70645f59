// vitlens_preprocess_dump: the pixels `vitlens export --preprocess model` gives a model, written as
// .npy so bench/family_parity.py can compare them with the library's own pipeline.
//
//   vitlens_preprocess_dump --model DIR/model.safetensors --out DIR IMAGE...
//
// For each IMAGE, <out>/<stem>_pixels.npy: float32 (gh*gw, 3*P*P), the normalised patches exactly
// as the forward pass reads them (core/model/vit.hpp PatchGrid: each row one patch, (c, y, x)),
// from the same calls the CLI makes: load_model, read_model_transform, load_image,
// prepare_image_transformed. For a model with an attention pool (SigLIP, timm global_pool 'map')
// also <out>/<stem>_pool.npy: float32 (heads, patch tokens), the pool's latent query's weights
// over the patch tokens (ForwardResult::pool_probs without its prefix columns), from the forward
// the export runs on those patches. Exit code 0 when every image was written, 1 otherwise.
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "core/io/preprocess.hpp"
#include "core/model/vit.hpp"
#include "core/render/export.hpp"  // output_stem
#include "models/model_io.hpp"
#include "models/model_transform.hpp"

int main(int argc, char** argv) {
  using namespace vitlens;
  std::string model_path, out_dir;
  std::vector<std::string> images;
  CLI::App app{"vitlens_preprocess_dump: the normalised patches --preprocess model feeds a checkpoint, as .npy"};
  app.add_option("-m,--model", model_path, "A .safetensors checkpoint with its published transform beside it")->required();
  app.add_option("-o,--out", out_dir, "Folder to write <stem>_pixels.npy into (must exist)")->required();
  app.add_option("IMAGE", images, "Image files")->required();
  CLI11_PARSE(app, argc, argv);

  VitModel model;
  ImageTransform transform;
  try {
    model = load_model(model_path);
    transform = read_model_transform(model_path, model.format);
    if (!transform.present()) throw Error(model_path + " publishes no transform");
    require_writable_dir(out_dir);
  } catch (const Error& e) {
    std::cerr << "vitlens_preprocess_dump: " << e.what() << "\n";
    return 1;
  }
  int failed = 0;
  for (const std::string& path : images) {
    try {
      const PreparedImage prepared = prepare_image_transformed(load_image(path), model.config, transform, path);
      const MatRM& patches = prepared.grid.patches;  // (gh*gw, 3*P*P)
      const std::string file = out_dir + "/" + output_stem(path) + "_pixels.npy";
      write_file_atomic(file, npy_bytes_f32({static_cast<size_t>(patches.rows()), static_cast<size_t>(patches.cols())},
                                            patches.data()));
      if (model.config.attention_pool) {
        const ForwardResult f = forward(model, prepared.grid, ForwardOptions{});
        const MatRM pool = f.pool_probs.rightCols(f.pool_probs.cols() - f.prefix);  // (H, patch tokens)
        write_file_atomic(out_dir + "/" + output_stem(path) + "_pool.npy",
                          npy_bytes_f32({static_cast<size_t>(pool.rows()), static_cast<size_t>(pool.cols())}, pool.data()));
      }
      std::cout << file << " " << prepared.grid.grid_h << "x" << prepared.grid.grid_w << " patches, "
                << transform.describe() << "\n";
    } catch (const Error& e) {
      std::cerr << "vitlens_preprocess_dump: " << e.what() << "\n";
      failed = 1;
    }
  }
  return failed;
}
