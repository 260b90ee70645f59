#pragma once
// Training a ViT classifier: the recipe, and a Trainer that a command line or a GUI drives one
// step at a time (step(), evaluate(), state readable between steps; run() with a progress callback
// that returns false to stop). Checkpoint files are written by models/ (checkpoint.hpp) from the
// state exposed here, so core/ stays free of file formats.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/dataset.hpp"
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

struct EvalReport {
  double loss = 0.0, accuracy = 0.0;
  int images = 0;
};

// Where training stands: everything beyond the parameters that resume needs to continue
// bit for bit (plus the Adam moments in the optimizer).
struct TrainPosition {
  int64_t step = 0;                 // updates done
  int epoch = 0;                    // current epoch (0-based)
  int64_t position = 0;             // batches of this epoch already done
  std::vector<int32_t> order;       // this epoch's shuffled image order
  uint64_t rng[4] = {0, 0, 0, 0};   // data Rng state at the step boundary
};

class Trainer {
 public:
  // A fresh model initialised from recipe.seed as timm initialises a VisionTransformer. `train`
  // must outlive the trainer; `eval` (may be null) is only checked for image size here, since
  // evaluate() takes the set to evaluate. Throws vitlens::Error on an inconsistent config, a bad
  // recipe, an empty set or images of the wrong size.
  Trainer(const VitConfig& config, const Recipe& recipe, const ImageSet* train, const ImageSet* eval);

  const VitConfig& config() const { return net_.config(); }
  const Recipe& recipe() const { return recipe_; }
  const train::VitNet<float>& net() const { return net_; }
  train::VitNet<float>& net() { return net_; }
  const train::AdamW& optimizer() const { return adam_; }
  const TrainPosition& position() const { return pos_; }
  int num_classes() const { return net_.num_classes(); }

  int64_t steps_per_epoch() const;   // whole batches per epoch (the last partial batch is dropped)
  int64_t total_steps() const;       // epochs * steps_per_epoch
  bool finished() const { return pos_.step >= total_steps(); }

  // One batch: forward, backward, clip, AdamW at the scheduled lr. Throws when finished().
  StepReport step();
  // Mean loss and accuracy over a whole set, in batches of recipe.batch; progress in [0, 1],
  // returning false cancels (then the report covers the images done so far).
  EvalReport evaluate(const ImageSet& set, const std::function<bool(float)>& progress = {});

  // Debug (`--grad-dump`): gradients of the first `batch` images in file order, no augmentation,
  // no drop path, no update. Leaves the gradients in net().grads.
  double gradients_of_first_batch();

  // Restores a saved state (parameters, Adam moments and step, position). Throws vitlens::Error
  // when the sizes do not fit this trainer's model and data.
  void restore(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
               int64_t adam_step, const TrainPosition& position);

  // Stops early (the recipe's epochs can be extended on resume).
  void set_epochs(int epochs) { recipe_.epochs = epochs; }

 private:
  void initialise();
  void start_epoch();
  void load_batch(const ImageSet& set, const int32_t* indices, int count, bool augment);
  void draw_drop_path(int count);  // drop_scale_ for the loaded batch, from the data Rng

  // The first `count` images of the loaded batch, split into Recipe::shards parts: part s is images
  // [shard_start(s), shard_start(s + 1)), run through shard_net(s) (forward, and backward when
  // asked, each part's gradient into its own net); the parts' mean losses into shard_loss_.
  void run_shards(int count, bool with_backward);
  // run_shards with backward, then the batch's gradient into net_.grads; returns the batch's loss.
  float forward_backward(int count);
  int count_correct(int count) const;  // argmax hits of the last run_shards
  int shard_count(int count) const;
  int shard_start(int s, int count) const;
  int shard_size(int s, int count) const;  // images in part s
  train::VitNet<float>& shard_net(int s);
  const train::VitNet<float>& shard_net(int s) const;

  train::VitNet<float> net_;             // the parameters, and part 0 of every batch
  std::vector<train::VitNet<float>> replicas_;  // parts 1.. of a batch: copies of net_'s parameters
  Recipe recipe_;
  const ImageSet* train_ = nullptr;
  train::AdamW adam_;
  TrainPosition pos_;
  Rng rng_;
  std::vector<float> batch_images_;   // (B, 3, H, W) normalised
  std::vector<int32_t> batch_labels_;  // (B)
  std::vector<float> scratch_;         // (3, H, W)
  std::vector<float> shard_loss_;      // (parts) mean loss of each part of the last batch
  std::vector<float> drop_scale_;      // (L, 2, B) this step's drop-path scales; empty when off
};

// timm's initialisation of every tensor in `layout` (Trainer's and MaeTrainer's), drawn from
// Rng(seed) in the layout's order.
void init_vit_params(const train::ParamLayout& layout, float* params, uint64_t seed, int patch_values);

// Memory a training run allocates, estimated from its shape alone (vit_train.cpp's and
// mae_train.cpp's buffers: parameters and gradients of each part's net, Adam's two moments, every
// block's cached activations for the batch, the attention weights). Trainer and MaeTrainer call
// require_training_memory before allocating anything, so a recipe of billions of parameters is
// refused in one line with the numbers instead of failing in an allocation.
struct TrainingMemory {
  int64_t parameters = 0;
  double bytes = 0.0;
};
// Floats of one BlockStack (vit_train.hpp) of L blocks for `images` images of N tokens.
double block_stack_floats(int L, int D, int H, int Hm, int N, double images);
TrainingMemory classifier_training_memory(const VitConfig& config, const Recipe& recipe, int num_classes);
// Throws vitlens::Error "training this model (P parameters) needs about X GiB of memory, but only
// Y GiB is available ..." when `need` is above available_memory_bytes() (memory.hpp).
void require_training_memory(const TrainingMemory& need);

// Images in the set that the model cannot take: "" when every image is config.img_h x img_w.
std::string check_image_set(const VitConfig& config, const ImageSet& set, const std::string& what);

}  // namespace vitlens
