// libFuzzer harness: the training checkpoint reader, as `vitlens train --resume` uses it. The input
// holds both files of a checkpoint: the model file's length (4 bytes, little-endian), the model
// file, then the optimizer state file. parse_checkpoint runs every check
// resume does (the model as load_model reads it, the pair's steps, the moments, Adam step, Rng and
// data order); a pair either accepts must then restore into a trainer on data of the size it names
// and run one step, since a state that passes the checks must also train. Any input may be refused
// with vitlens::Error; anything else (a crash, a sanitizer report, another exception type) is a
// finding. README "Fuzzing" says how to run it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"
#include "models/training_checkpoint.hpp"
#include "core/base/error.hpp"

namespace {

using namespace vitlens;

// Small enough to train one step of within a fuzzing run's time and memory.
bool small(const VitConfig& c, const Recipe& r, size_t images) {
  return c.img_h * c.img_w <= 32 * 32 && c.embed_dim <= 64 && c.depth <= 4 && r.batch <= 64 && images <= 512;
}

void train_one_step(const SavedTraining& saved) {
  if (!small(saved.config, saved.recipe, saved.position.order.size()) || saved.num_classes > 100) return;
  ImageSet images;
  images.height = saved.config.img_h;
  images.width = saved.config.img_w;
  const size_t n = saved.position.order.size();
  images.pixels.assign(n * 3 * static_cast<size_t>(images.height) * static_cast<size_t>(images.width), 0.5f);
  for (size_t i = 0; i < n; ++i) images.labels.push_back(static_cast<int32_t>(i % static_cast<size_t>(std::max(1, saved.num_classes))));
  for (int k = 0; k < saved.num_classes; ++k) images.class_names.push_back("class" + std::to_string(k));
  images.source = "fuzz";
  Recipe recipe = saved.recipe;
  recipe.threads = 1;
  Trainer trainer(std::make_unique<ClassifyObjective>(saved.config, recipe, &images, nullptr));
  trainer.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  if (!trainer.finished()) trainer.step();
}

void train_one_mae_step(const SavedTraining& saved) {
  const MaeOptions options = MaeOptions::from_json(saved.options);
  const int copies = options.crops_per_photo;
  if (copies < 1 || !small(saved.config, saved.recipe, saved.position.order.size())) return;
  PhotoCorpus photos;
  const int side = saved.config.img_h + 3;  // crops are resized from photos a little larger
  for (size_t i = 0; i < saved.position.order.size() / static_cast<size_t>(copies); ++i) {
    photos.photos.emplace_back(static_cast<size_t>(3 * side * side), 0.25f + 0.01f * static_cast<float>(i % 50));
    photos.heights.push_back(side);
    photos.widths.push_back(side);
    photos.names.push_back("photo" + std::to_string(i));
  }
  photos.source = "fuzz";
  Recipe recipe = saved.recipe;
  recipe.threads = 1;
  Trainer trainer(std::make_unique<MaeObjective>(saved.config, recipe, options, &photos, nullptr));
  trainer.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  if (!trainer.finished()) trainer.step();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t model_size = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8 |
                            static_cast<size_t>(data[2]) << 16 | static_cast<size_t>(data[3]) << 24;
  if (model_size > size - 4) return 0;
  const std::string model(reinterpret_cast<const char*>(data) + 4, model_size);
  const std::string state(reinterpret_cast<const char*>(data) + 4 + model_size, size - 4 - model_size);
  const std::string what = "fuzz/last.safetensors";
  try {
    const SavedTraining saved = parse_checkpoint(model, state, what);
    if (saved.objective == "mae") train_one_mae_step(saved);
    else train_one_step(saved);
  } catch (const Error&) {
  }
  return 0;
}
