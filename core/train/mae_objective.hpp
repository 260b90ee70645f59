#pragma once
// The masked-autoencoder objective (mae_train.hpp's net) on a folder of photos, and how a run reads
// and splits the photos.
#include <string>

#include <nlohmann/json.hpp>

#include "core/data/dataset.hpp"
#include "core/train/mae_train.hpp"
#include "core/train/net_objective.hpp"
#include "core/train/objective.hpp"
#include "core/train/trainer.hpp"

namespace vitlens {

// What MAE pretraining takes beyond the Recipe.
struct MaeOptions {
  train::MaeShape shape;
  int crops_per_photo = 16;     // an epoch = every training photo this many times, shuffled
  double min_crop = 0.4;        // crop side in [min_crop, 1] x the photo's short side
  int val_crops = 4;            // crops per held-out photo in each evaluation
  uint64_t val_seed = 0x5eed;   // the evaluation's crops and masks: the same every epoch
  nlohmann::json to_json() const;
  static MaeOptions from_json(const nlohmann::json& j);  // throws vitlens::Error
  std::string validate(const VitConfig& config) const;
};

// A seeded split of a photo corpus by photo: `val_fraction` of the photos (at least one when there
// are 2 or more and the fraction is > 0) go to `val`; both keep the original order.
void split_photos(const PhotoCorpus& all, double val_fraction, uint64_t seed, PhotoCorpus* train, PhotoCorpus* val);

// `photos` or `photos:DIR`: masked patch prediction on a folder of photos, as `vitlens train --data`
// and the viewer's Train window spell it. "photos" (and "photos:") mean default_photo_dir().
bool is_photo_data(const std::string& data);
std::string photo_data_dir(const std::string& data);

// A run's photos, read once for the CLI and the Train window alike: the corpus of
// photo_data_dir(data) with the long side capped at max(4 img_size, 64) (crops of 40-100 % of the
// short side are then downscaled, never upscaled much), only the first `limit` photos when
// limit > 0, then split_photos(val_split, seed). Throws vitlens::Error on a missing folder, a folder
// without a readable photo or a val_split outside [0, 1).
struct PhotoRunData {
  std::string dir;           // the folder read
  PhotoCorpus train, val;    // val may be empty (val_split 0, or a single photo)
  FolderReport report;       // files skipped as unreadable
};
PhotoRunData load_photo_run_data(const std::string& data, int img_size, int limit, double val_split, uint64_t seed);

extern const ObjectiveKind kMaeKind;  // "mae"; options: MaeOptions::to_json()

// Masked patch prediction on a photo corpus: each item is a photo, each epoch takes
// crops_per_photo random crops of it (random scale, position and flip, drawn from the data Rng,
// then each image's mask); the loss and the evaluation metric are the norm_pix MSE on the hidden
// patches. The checkpoint's model file holds the encoder, its state the decoder too.
class MaeObjective : public NetObjective<train::MaeNet<float>> {
 public:
  // The corpora must outlive the objective; `val` may be null. Throws vitlens::Error when the
  // training does not fit in memory, on a bad config, recipe or options, or a training corpus too
  // small for one batch per epoch. The recipe's label_smoothing and crop_pad are ignored, its shards
  // recorded as 1 (each batch runs whole), its `flip` flips the crops.
  MaeObjective(const VitConfig& config, const Recipe& recipe, const MaeOptions& options, const PhotoCorpus* train,
               const PhotoCorpus* val);

  const ObjectiveKind& kind() const override;
  nlohmann::json options() const override { return options_.to_json(); }
  int items() const override { return train_->size(); }
  int copies() const override { return options_.crops_per_photo; }
  std::string order_mismatch(size_t saved, size_t expected) const override;
  BatchResult train_batch(const int32_t* items, int count, Rng& rng) override;
  // Mean loss over the held-out photos' fixed crops and masks (val_crops each, val_seed).
  bool has_eval() const override { return val_ != nullptr && val_->size() > 0; }
  EvalReport evaluate(const std::function<bool(float)>& progress) override;

  const MaeOptions& mae_options() const { return options_; }

 private:
  // Crops of photos[i] for i in `photos` (count of them) into batch_images_ (normalised), drawing from rng.
  void load_crops(const PhotoCorpus& corpus, const int32_t* photos, int count, Rng& rng, bool flip);

  MaeOptions options_;
  const PhotoCorpus* train_ = nullptr;
  const PhotoCorpus* val_ = nullptr;
  std::vector<float> batch_images_;  // (B, 3, H, W) normalised
  std::vector<int32_t> keep_;        // (B, Nv)
};

}  // namespace vitlens
