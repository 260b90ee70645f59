#pragma once
// The classifier objective: labelled images (augmented by a random crop and flip when the recipe
// says so), timm's VisionTransformer with a linear head (VitNet), cross-entropy with label
// smoothing, stochastic depth, the batch split into Recipe::shards parts; accuracy as the metric.
// Its checkpoint records the class count ("num_classes").
#include <string>
#include <vector>

#include "core/train/net_objective.hpp"
#include "core/train/objective.hpp"
#include "core/train/trainer.hpp"
#include "core/train/vit_train.hpp"

namespace vitlens {

extern const ObjectiveKind kClassifyKind;  // "classify"; options: the class count

class ClassifyObjective : public NetObjective<train::VitNet<float>> {
 public:
  // `train` must outlive the objective; `eval` (may be null) is what evaluate() measures. Throws
  // vitlens::Error when the training does not fit in memory, on a bad recipe, an empty set, images
  // of the wrong size or a set smaller than one batch.
  ClassifyObjective(const VitConfig& config, const Recipe& recipe, const ImageSet* train, const ImageSet* eval);

  const ObjectiveKind& kind() const override;
  nlohmann::json options() const override { return net_.num_classes(); }
  int items() const override { return train_->size(); }
  std::string order_mismatch(size_t saved, size_t expected) const override;
  BatchResult train_batch(const int32_t* items, int count, Rng& rng) override;
  bool has_eval() const override { return eval_ != nullptr; }
  EvalReport evaluate(const std::function<bool(float)>& progress) override;

  int num_classes() const { return net_.num_classes(); }
  // Mean loss and accuracy over any set (the test set after training), in batches of recipe.batch.
  EvalReport evaluate_set(const ImageSet& set, const std::function<bool(float)>& progress = {});
  // Debug (`--grad-dump`): gradients of the first `batch` images in file order, no augmentation,
  // no drop path, no update. Leaves the gradients in grads().
  double gradients_of_first_batch();

 private:
  void load_batch(const ImageSet& set, const int32_t* indices, int count, Rng* augment_rng);
  void draw_drop_path(int count, Rng& rng);  // drop_scale_ for the loaded batch

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

  // net_: the parameters, and part 0 of every batch
  std::vector<train::VitNet<float>> replicas_;  // parts 1.. of a batch: copies of net_'s parameters
  const ImageSet* train_ = nullptr;
  const ImageSet* eval_ = nullptr;
  std::vector<float> batch_images_;   // (B, 3, H, W) normalised
  std::vector<int32_t> batch_labels_;  // (B)
  std::vector<float> scratch_;         // (3, H, W)
  std::vector<float> shard_loss_;      // (parts) mean loss of each part of the last batch
  std::vector<float> drop_scale_;      // (L, 2, B) this step's drop-path scales; empty when off
};

TrainingMemory classifier_training_memory(const VitConfig& config, const Recipe& recipe, int num_classes);

// Images in the set that the model cannot take: "" when every image is config.img_h x img_w.
std::string check_image_set(const VitConfig& config, const ImageSet& set, const std::string& what);

}  // namespace vitlens
