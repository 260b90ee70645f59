#pragma once
// What a training run optimises, apart from the optimizer: the net (parameters and gradients in one
// buffer each, addressed by a ParamLayout), what a batch is, the loss head, the evaluation metric and
// what a checkpoint records. Trainer (trainer.hpp) owns the rest -- AdamW, the learning-rate
// schedule, clipping, the epoch's shuffled order of data items, the data Rng and the position -- and
// is the same for every objective.
//
// The objectives: ClassifyObjective (classify_objective.hpp: labelled images, cross-entropy,
// accuracy) and MaeObjective (mae_objective.hpp: photos, masked patch prediction, the validation
// loss). Adding one: a class deriving from Objective and its ObjectiveKind (for checkpoints), listed
// in objective.cpp's table.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/dataset.hpp"
#include "core/train/vit_train.hpp"

namespace vitlens {

struct Recipe;

struct EvalReport {
  double loss = 0.0, accuracy = 0.0;
  int images = 0;
};

// One training batch's result (the gradient is left in Objective::grads()).
struct BatchResult {
  float loss = 0.0f;      // the batch's mean loss
  double accuracy = 0.0;  // share of the batch right, in [0, 1]; 0 for an objective without one
};

// What a checkpoint needs of an objective without making one: how to rebuild the parameter table
// from the options the objective recorded (Objective::options()) and where its tensors live.
struct ObjectiveKind {
  const char* name;         // the checkpoint's tag: the training record's and the state's "objective"
  const char* options_key;  // the record's key and the state's __metadata__ key of the options (JSON)
  bool reports_accuracy;    // the metric is accuracy as well as the loss (BatchResult, EvalReport)
  // "" when the saved options fit a model of `config`, else the reason.
  std::string (*check)(const VitConfig& config, const nlohmann::json& options);
  train::ParamLayout (*layout)(const VitConfig& config, const nlohmann::json& options);
  int (*order_copies)(const nlohmann::json& options);  // how often each data item is in an epoch's order
  int (*head_classes)(const nlohmann::json& options);  // classes of the model file's head (0: none)
  bool (*in_model_file)(const std::string& tensor);    // false: saved in the state file only
};

// The kind named `name` (a checkpoint's tag), or null when this build knows no such objective.
const ObjectiveKind* find_objective_kind(const std::string& name);

class Objective {
 public:
  virtual ~Objective() = default;

  virtual const ObjectiveKind& kind() const = 0;
  virtual nlohmann::json options() const = 0;  // what the checkpoint records (ObjectiveKind::options_key)
  virtual const VitConfig& config() const = 0;
  // The recipe as this objective runs it (MAE runs each batch whole: shards 1).
  virtual const Recipe& recipe() const = 0;
  virtual const train::ParamLayout& layout() const = 0;
  virtual std::vector<float>& params() = 0;  // (layout().total)
  virtual const std::vector<float>& params() const = 0;
  virtual std::vector<float>& grads() = 0;   // (layout().total)
  virtual const std::vector<float>& grads() const = 0;

  // The training data: items 0 .. items() - 1, each copies() times in an epoch's order.
  virtual int items() const = 0;
  virtual int copies() const { return 1; }
  // The restore error when a saved order of `saved` entries does not fit `expected`.
  virtual std::string order_mismatch(size_t saved, size_t expected) const = 0;

  // One batch of the items `items` (count of them): the data and its augmentation drawn from `rng`,
  // forward, and (when the loss is finite) backward with the gradient into grads().
  virtual BatchResult train_batch(const int32_t* items, int count, Rng& rng) = 0;
  // The held-out data's loss (and metric); progress in [0, 1], returning false cancels.
  virtual bool has_eval() const = 0;
  virtual EvalReport evaluate(const std::function<bool(float)>& progress) = 0;
};

}  // namespace vitlens
