#pragma once
// Training checkpoints, two files side by side:
//   <name>.safetensors        the model exactly as `vitlens view/export/info` open it (save_model:
//                             timm names, head.weight/bias, the config), plus __metadata__["training"]:
//                             a JSON record of the recipe, the data, steps, epochs and the results.
//   <name>.state.safetensors  what resume needs beyond the weights: Adam's moments as
//                             "adam_m.<param>" / "adam_v.<param>", the epoch's data order as
//                             "data_order" (F32, exact below 2^24 images), and in __metadata__ the
//                             step, epoch, position, Adam step, data Rng state, recipe and model size.
// A save replaces both together (FileGroup, files.hpp): a kill, a power loss or a full disk at any
// point leaves either the previous pair or, once the new pair is whole on disk, the new one, which
// the next save or load completes. Loading completes such a save first, then refuses a pair that
// was not saved together and a state the trainers could not have left (NaN or negative moments, a
// first moment Adam cannot reach beside the second, an Adam step that is not the step, an all-zero
// Rng, a data order that is not a shuffle), with one line naming the file and the field.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/train/mae_train.hpp"
#include "models/model_io.hpp"
#include "core/train/trainer.hpp"

namespace vitlens {

// "<dir>/last.safetensors" -> "<dir>/last.state.safetensors"
std::string checkpoint_state_path(const std::string& model_path);

// Parameters (or gradients) in a layout's buffer as timm-named tensors.
TensorMap layout_tensors(const train::ParamLayout& layout, const std::vector<float>& values);

// Writes both files. `training` is stored as the model's __metadata__["training"] (the step and
// epoch are added to it).
void save_checkpoint(const Trainer& trainer, const std::string& model_path, nlohmann::json training);

struct SavedTraining {
  VitConfig config;
  Recipe recipe;
  int num_classes = 0;
  std::vector<float> params, adam_m, adam_v;  // in param_layout(config, num_classes) order
  int64_t adam_step = 0;
  TrainPosition position;
  nlohmann::json training;  // the model's "training" record
};

// Completes an interrupted save in the checkpoint's folder, then reads both files; throws
// vitlens::Error naming the file (and the field) on anything missing, inconsistent or damaged.
SavedTraining load_checkpoint(const std::string& model_path);

// The training record's "objective" of a checkpoint: "classify" (also when absent: older files) or
// "mae" (after completing an interrupted save in its folder). Throws vitlens::Error when the file
// has no training record.
std::string checkpoint_objective(const std::string& model_path);

// MAE checkpoints: the model file holds the ENCODER only (timm names, no head, so view/export/info
// open it as any model), __metadata__["training"] with "objective": "mae", the MAE options and the
// validation loss; the state file also holds the decoder (mask_token, decoder_* with MAE's names)
// besides the Adam moments of every parameter. The model loader refuses decoder tensors (they are
// not part of a VisionTransformer), which is why they live in the state.
void save_mae_checkpoint(const MaeTrainer& trainer, const std::string& model_path, nlohmann::json training);

struct SavedMae {
  VitConfig config;
  Recipe recipe;
  MaeOptions options;
  std::vector<float> params, adam_m, adam_v;  // in mae_param_layout(config, options.shape) order
  int64_t adam_step = 0;
  TrainPosition position;
  nlohmann::json training;
};
SavedMae load_mae_checkpoint(const std::string& model_path);

// The same checks on the two files' bytes already in memory (`model_what` names the model file in
// errors, its state path is derived from it); nothing is read from or completed on disk. The fuzz
// harness uses them.
SavedTraining parse_checkpoint(const std::string& model_bytes, const std::string& state_bytes,
                               const std::string& model_what);
SavedMae parse_mae_checkpoint(const std::string& model_bytes, const std::string& state_bytes,
                              const std::string& model_what);

}  // namespace vitlens
