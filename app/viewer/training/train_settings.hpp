#pragma once
// What a Train window run is made of, from its settings (train_settings.cpp): as `vitlens train`
// makes them from its flags, with the same defaults.
#include "core/model/vit.hpp"
#include "core/train/mae_objective.hpp"
#include "core/train/trainer.hpp"
#include "core/train/training_run.hpp"
#include "training/train_session.hpp"

namespace vitlens::viewer {

int image_side(const TrainSettings& s);      // Fashion-MNIST: 28, else img-size
double val_split_of(const TrainSettings& s);  // the CLI's default when val-split < 0
VitConfig config_of(const TrainSettings& s);
Recipe recipe_of(const TrainSettings& s);
MaeOptions mae_options_of(const TrainSettings& s);

}  // namespace vitlens::viewer
