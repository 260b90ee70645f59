#pragma once
// Training checkpoints, two files side by side:
//   <name>.safetensors        the model exactly as `vitlens view/export/info` open it (save_model:
//                             timm names, head.weight/bias, the config), plus __metadata__["training"]:
//                             a JSON record of the recipe, the data, steps, epochs and the results.
//   <name>.state.safetensors  what resume needs beyond the weights: Adam's moments as
//                             "adam_m.<param>" / "adam_v.<param>", the epoch's data order as
//                             "data_order" (F32, exact below 2^24 images), and in __metadata__ the
//                             step, epoch, position, Adam step, data Rng state, recipe, model size,
//                             and the objective's tag and options (objective.hpp).
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

#include "core/train/objective.hpp"
#include "core/train/trainer.hpp"
#include "models/model_io.hpp"

namespace vitlens {

// "<dir>/last.safetensors" -> "<dir>/last.state.safetensors"
std::string checkpoint_state_path(const std::string& model_path);

// Parameters (or gradients) in a layout's buffer as timm-named tensors.
TensorMap layout_tensors(const train::ParamLayout& layout, const std::vector<float>& values);

// The tensors the model file holds: the objective's parameters that ObjectiveKind::in_model_file
// keeps there (the classifier's all, MAE's encoder), timm-named, as view/export/info open them.
TensorMap model_file_tensors(const Objective& objective);

// Writes both files for any objective. `training` is stored as the model's
// __metadata__["training"], with the objective's tag ("objective"), its options (under
// ObjectiveKind::options_key: the classifier's "num_classes", MAE's "mae"), the step, epoch and
// recipe added. The state file records the same tag and options in its __metadata__ and holds the
// parameters the model file does not (MAE's decoder: mask_token, decoder_*, which the model loader
// refuses as not part of a VisionTransformer) besides the Adam moments of every parameter.
void save_checkpoint(const Trainer& trainer, const std::string& model_path, nlohmann::json training);

struct SavedTraining {
  std::string objective;      // the kind's name: "classify" (also for older files without the tag), "mae"
  nlohmann::json options;     // the objective's options as saved (the class count, MaeOptions::to_json())
  VitConfig config;
  Recipe recipe;
  int num_classes = 0;        // of the model file's head (0: none, as MAE's encoder)
  std::vector<float> params, adam_m, adam_v;  // in the objective's layout order
  int64_t adam_step = 0;
  TrainPosition position;
  nlohmann::json training;  // the model's "training" record
};

// Completes an interrupted save in the checkpoint's folder, then reads both files; throws
// vitlens::Error naming the file (and the field) on anything missing, inconsistent or damaged, or
// (when `objective` is not empty) a checkpoint of another objective.
SavedTraining load_checkpoint(const std::string& model_path, const std::string& objective = "");

// The training record's "objective" of a checkpoint: "classify" (also when absent: older files) or
// "mae" (after completing an interrupted save in its folder). Throws vitlens::Error when the file
// has no training record.
std::string checkpoint_objective(const std::string& model_path);

// The same checks on the two files' bytes already in memory (`model_what` names the model file in
// errors, its state path is derived from it); nothing is read from or completed on disk. The fuzz
// harness uses it.
SavedTraining parse_checkpoint(const std::string& model_bytes, const std::string& state_bytes,
                               const std::string& model_what);

}  // namespace vitlens
