#pragma once
// Training a ViT: the recipe, and the Trainer every objective (objective.hpp) runs under.
// Checkpoint files are written by models/ (training_checkpoint.hpp) from the state exposed here, so
// core/ stays free of file formats.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/data/dataset.hpp"
#include "core/train/objective.hpp"
#include "core/train/optimizer.hpp"
#include "core/train/vit_train.hpp"

namespace vitlens {

// How to train (everything `vitlens train` takes besides the data and the model shape).
struct Recipe {
  int epochs = 10;
  int batch = 128;
  double lr = 2e-3;             // peak learning rate, after warmup
  double min_lr = 1e-5;         // end of the cosine
  double weight_decay = 0.05;   // AdamW, decoupled, on weight matrices only (ParamEntry::decay)
  double warmup_epochs = 0.5;   // linear warmup length, in epochs (fractions allowed)
  double clip_norm = 1.0;       // gradient-norm clipping; 0 = off
  double label_smoothing = 0.0;
  // Stochastic depth (timm's drop_path_rate): block l's attention and MLP branches are each dropped
  // for an image with probability drop_path * l / (depth - 1) (torch.linspace(0, rate, depth)),
  // the kept ones scaled by 1 / (1 - p); training steps only. Absent from older checkpoints: 0.
  double drop_path = 0.0;
  // Random crop with zero padding `crop_pad`, horizontal flip. Off in this struct; `vitlens train`
  // and the viewer's Train window default to it with crop_pad 1 (README, default recipe).
  bool augment = false;
  int crop_pad = 2;
  bool flip = true;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  uint64_t seed = 0;
  int threads = 0;              // 0 = one per core; results depend on the seed, not on this
  // The batch is split into this many parts of (nearly) equal size; each part's forward and
  // backward run on their own, and the parts' gradients are summed in part order, weighted by
  // their share of the batch (PyTorch's gradient accumulation). On `shards` to 2 * `shards` - 1
  // threads, or when `shards` is a multiple of the threads, the parts run side by side, one thread
  // each (a thread takes the next part when done with one), with no synchronisation inside a part;
  // otherwise one after the other on every thread. Same gradient as the whole batch up to float
  // rounding; the numbers depend on this, never on `threads`. Checkpoints written before it existed
  // resume with 1 (the whole batch at once), as they were trained.
  int shards = 4;

  nlohmann::json to_json() const;
  static Recipe from_json(const nlohmann::json& j);  // throws vitlens::Error on a bad key
  std::string validate() const;                      // empty when usable, else one reason
};

struct StepReport {
  int64_t step = 0;      // updates done, this one included
  int epoch = 0;         // 0-based epoch this step belongs to
  double loss = 0.0;     // this batch's mean loss
  double accuracy = 0.0; // this batch's accuracy in [0, 1]
  double lr = 0.0;       // learning rate used
  double grad_norm = 0.0;  // before clipping
};

// Where training stands: everything beyond the parameters that resume needs to continue
// bit for bit (plus the Adam moments in the optimizer).
struct TrainPosition {
  int64_t step = 0;                 // updates done
  int epoch = 0;                    // current epoch (0-based)
  int64_t position = 0;             // batches of this epoch already done
  std::vector<int32_t> order;       // this epoch's shuffled order of data items
  uint64_t rng[4] = {0, 0, 0, 0};   // data Rng state at the step boundary
};

// One training loop for every objective (objective.hpp): the epoch's seeded order of the
// objective's data items, one AdamW step per batch at the scheduled learning rate after gradient
// clipping, evaluation, and the state resume restores. A command line or a GUI drives it one step at
// a time (step(), evaluate(), state readable between steps).
class Trainer {
 public:
  // Takes a constructed objective (which checked its own config, recipe and data, and that its
  // training fits in memory), initialises its parameters from recipe.seed as timm initialises a
  // VisionTransformer and shuffles the first epoch.
  explicit Trainer(std::unique_ptr<Objective> objective);

  const Objective& objective() const { return *objective_; }
  Objective& objective() { return *objective_; }
  // The objective as its own class (for what only it offers); throws vitlens::Error when it is not.
  template <class O>
  O& objective_as() {
    O* o = dynamic_cast<O*>(objective_.get());
    if (!o) throw Error(std::string("this run's objective is '") + objective_->kind().name + "'");
    return *o;
  }
  const VitConfig& config() const { return objective_->config(); }
  const Recipe& recipe() const { return recipe_; }
  const std::vector<float>& params() const { return objective_->params(); }
  const std::vector<float>& grads() const { return objective_->grads(); }
  const train::AdamW& optimizer() const { return adam_; }
  const TrainPosition& position() const { return pos_; }

  int64_t steps_per_epoch() const;   // whole batches per epoch (the last partial batch is dropped)
  int64_t total_steps() const;       // epochs * steps_per_epoch
  bool finished() const { return pos_.step >= total_steps(); }

  // One batch: forward, backward, clip, AdamW at the scheduled lr. Throws when finished().
  StepReport step();
  // The objective's held-out data (has_eval()); progress in [0, 1], returning false cancels (then
  // the report covers the images done so far).
  bool has_eval() const { return objective_->has_eval(); }
  EvalReport evaluate(const std::function<bool(float)>& progress = {}) { return objective_->evaluate(progress); }

  // Restores a saved state (parameters, Adam moments and step, position). Throws vitlens::Error
  // when the sizes do not fit this trainer's model and data.
  void restore(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
               int64_t adam_step, const TrainPosition& position);

  // Stops early (the recipe's epochs can be extended on resume).
  void set_epochs(int epochs) { recipe_.epochs = epochs; }

 private:
  void start_epoch();

  std::unique_ptr<Objective> objective_;
  Recipe recipe_;
  train::AdamW adam_;
  TrainPosition pos_;
  Rng rng_;
};

// timm's initialisation of every tensor in `layout` (every objective's), drawn from Rng(seed) in the
// layout's order.
void init_vit_params(const train::ParamLayout& layout, float* params, uint64_t seed, int patch_values);

// Memory a training run allocates, estimated from its shape alone (vit_train.cpp's and
// mae_train.cpp's buffers: parameters and gradients of each part's net, Adam's two moments, every
// block's cached activations for the batch, the attention weights). Each objective calls
// require_training_memory before allocating anything, so a recipe of billions of parameters is
// refused in one line with the numbers instead of failing in an allocation.
struct TrainingMemory {
  int64_t parameters = 0;
  double bytes = 0.0;
};
// Floats of one BlockStack (vit_train.hpp) of L blocks for `images` images of N tokens.
double block_stack_floats(int L, int D, int H, int Hm, int N, double images);
// Throws vitlens::Error "training this model (P parameters) needs about X GiB of memory, but only
// Y GiB is available ..." when `need` is above available_memory_bytes() (memory.hpp).
void require_training_memory(const TrainingMemory& need);

}  // namespace vitlens
