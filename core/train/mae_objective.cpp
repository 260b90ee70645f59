// The masked-autoencoder objective (mae_objective.hpp): MaeOptions, the photo split, crops and
// masks drawn per batch, the fixed validation crops.
#include "core/train/mae_objective.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/base/error.hpp"

namespace vitlens {

// ---------------------------------------------------------------------------------------------
// MaeOptions, the photo split

nlohmann::json MaeOptions::to_json() const {
  nlohmann::json j = shape.to_json();
  j["crops_per_photo"] = crops_per_photo;
  j["min_crop"] = min_crop;
  j["val_crops"] = val_crops;
  j["val_seed"] = val_seed;
  j["norm_pix_loss"] = true;
  j["decoder_pos_embed"] = "learned";
  return j;
}

MaeOptions MaeOptions::from_json(const nlohmann::json& j) {
  MaeOptions o;
  o.shape = train::MaeShape::from_json(j);
  try {
    o.crops_per_photo = j.at("crops_per_photo").get<int>();
    o.min_crop = j.at("min_crop").get<double>();
    o.val_crops = j.at("val_crops").get<int>();
    o.val_seed = j.at("val_seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("MAE options: ") + e.what());
  }
  return o;
}

std::string MaeOptions::validate(const VitConfig& config) const {
  const std::string why = shape.validate(config);
  if (!why.empty()) return why;
  std::ostringstream out;
  if (crops_per_photo < 1 || crops_per_photo > 100000) out << "crops per photo " << crops_per_photo << " is not in [1, 100000]";
  else if (!(min_crop > 0.0 && min_crop <= 1.0)) out << "minimum crop " << min_crop << " is not in (0, 1]";
  else if (val_crops < 1 || val_crops > 100000) out << "validation crops " << val_crops << " is not in [1, 100000]";
  return out.str();
}

namespace {

void append_photo(const PhotoCorpus& from, size_t i, PhotoCorpus* to) {
  to->photos.push_back(from.photos[i]);
  to->heights.push_back(from.heights[i]);
  to->widths.push_back(from.widths[i]);
  to->names.push_back(from.names[i]);
}

}  // namespace

void split_photos(const PhotoCorpus& all, double val_fraction, uint64_t seed, PhotoCorpus* train, PhotoCorpus* val) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error("validation share " + std::to_string(val_fraction) + " is not in [0, 1)");
  *train = PhotoCorpus();
  *val = PhotoCorpus();
  train->source = all.source;
  val->source = all.source + " (held out)";
  const int n = all.size();
  int n_val = static_cast<int>(std::lround(val_fraction * n));
  if (val_fraction > 0.0 && n >= 2) n_val = std::max(n_val, 1);
  n_val = std::min(n_val, n - 1);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);  // not the init or data stream of the same seed
  rng.shuffle(order);
  std::vector<uint8_t> is_val(static_cast<size_t>(n), 0);
  for (int i = 0; i < std::max(n_val, 0); ++i) is_val[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  for (int i = 0; i < n; ++i) append_photo(all, static_cast<size_t>(i), is_val[static_cast<size_t>(i)] ? val : train);
}

bool is_photo_data(const std::string& data) { return data == "photos" || data.rfind("photos:", 0) == 0; }

std::string photo_data_dir(const std::string& data) { return data.size() > 7 ? data.substr(7) : default_photo_dir(); }

PhotoRunData load_photo_run_data(const std::string& data, int img_size, int limit, double val_split, uint64_t seed) {
  PhotoRunData d;
  d.dir = photo_data_dir(data);
  PhotoCorpus all = load_photo_corpus(d.dir, std::max(4 * img_size, 64), &d.report);
  if (limit > 0 && all.size() > limit) {
    const size_t n = static_cast<size_t>(limit);
    all.photos.resize(n);
    all.heights.resize(n);
    all.widths.resize(n);
    all.names.resize(n);
  }
  split_photos(all, val_split, seed, &d.train, &d.val);
  return d;
}

// ---------------------------------------------------------------------------------------------
// MaeObjective

namespace {

// The config, once this MAE run is known to fit in memory (for the member initialisers): the
// encoder on the visible tokens, the decoder on every token, the batch whole (no parts).
const VitConfig& mae_fits_in_memory(const VitConfig& config, const Recipe& recipe, const train::MaeShape& shape) {
  TrainingMemory need;
  need.parameters = static_cast<int64_t>(train::mae_param_layout(config, shape, nullptr).total);
  const int Np = config.grid_h() * config.grid_w();
  const double B = recipe.batch, P = static_cast<double>(need.parameters), K = config.patch_values();
  const int dec_hidden = static_cast<int>(shape.decoder_dim * config.mlp_ratio);
  double floats = 4.0 * P;  // parameters, gradients, Adam's m and v
  floats += block_stack_floats(config.depth, config.embed_dim, config.num_heads, config.mlp_hidden(), shape.visible(Np) + 1, B);
  floats += block_stack_floats(shape.decoder_depth, shape.decoder_dim, shape.decoder_heads, dec_hidden, Np + 1, B);
  // Patches and targets, embeddings, the decoder's input and output, predictions and gradients.
  floats += B * (4.0 * Np * K + 3.0 * (Np + 1) * (config.embed_dim + shape.decoder_dim) + 6.0 * config.img_h * config.img_w);
  need.bytes = 4.0 * floats;
  require_training_memory(need);
  return config;
}

// The kind: the options are MaeOptions::to_json(); the decoder lives in the state file.
MaeOptions options_of(const nlohmann::json& options) {
  if (!options.is_object()) throw Error("MAE options: not a JSON object");
  return MaeOptions::from_json(options);
}
std::string check_options(const VitConfig& config, const nlohmann::json& options) {
  return options_of(options).validate(config);
}
train::ParamLayout layout_of(const VitConfig& config, const nlohmann::json& options) {
  return train::mae_param_layout(config, options_of(options).shape, nullptr);
}
int crops_of(const nlohmann::json& options) { return options_of(options).crops_per_photo; }
int no_head(const nlohmann::json&) { return 0; }
bool encoder_tensor(const std::string& name) { return !train::is_decoder_param(name); }

}  // namespace

const ObjectiveKind kMaeKind = {"mae", "mae", false, check_options, layout_of, crops_of, no_head, encoder_tensor};

MaeObjective::MaeObjective(const VitConfig& config, const Recipe& recipe, const MaeOptions& options,
                           const PhotoCorpus* train, const PhotoCorpus* val)
    : NetObjective(recipe, mae_fits_in_memory(config, recipe, options.shape), options.shape),
      options_(options),
      train_(train),
      val_(val) {
  std::string why = recipe.validate();
  if (why.empty()) why = options.validate(config);
  if (!why.empty()) throw Error(why);
  if (!train || train->size() < 1) throw Error("the training photo corpus is empty");
  if (static_cast<int64_t>(train->size()) * options.crops_per_photo / recipe.batch < 1)
    throw Error("the training photos give " + std::to_string(static_cast<int64_t>(train->size()) * options.crops_per_photo) +
                " crops per epoch, fewer than one batch of " + std::to_string(recipe.batch) +
                " (lower --batch or raise --crops-per-photo)");
  recipe_.shards = 1;  // each batch runs whole here; the saved recipe says so
  net_.threads = recipe.threads;
}

const ObjectiveKind& MaeObjective::kind() const { return kMaeKind; }

void MaeObjective::load_crops(const PhotoCorpus& corpus, const int32_t* photos, int count, Rng& rng, bool flip) {
  const VitConfig& c = config();
  const int S = c.img_h;
  const size_t plane = static_cast<size_t>(S) * S;
  batch_images_.resize(static_cast<size_t>(count) * 3 * plane);
  for (int i = 0; i < count; ++i) {
    float* dst = batch_images_.data() + static_cast<size_t>(i) * 3 * plane;
    crop_photo(corpus, photos[i], rng, S, static_cast<float>(options_.min_crop), flip, dst);
    for (int ch = 0; ch < 3; ++ch) {
      const float mean = c.mean[static_cast<size_t>(ch)], inv_std = 1.0f / c.std[static_cast<size_t>(ch)];
      for (size_t k = 0; k < plane; ++k) dst[ch * plane + k] = (dst[ch * plane + k] - mean) * inv_std;
    }
  }
}

BatchResult MaeObjective::train_batch(const int32_t* items, int count, Rng& rng) {
  const int Np = net_.patches(), Nv = net_.visible();
  // Data draws in a fixed order: every crop of the batch, then every mask.
  load_crops(*train_, items, count, rng, recipe_.flip);
  keep_.resize(static_cast<size_t>(count) * Nv);
  train::random_keep(rng, count, Np, Nv, keep_.data());
  net_.zero_grad();
  BatchResult result;
  result.loss = net_.forward(batch_images_.data(), keep_.data(), count);
  if (std::isfinite(result.loss)) net_.backward();
  return result;
}

EvalReport MaeObjective::evaluate(const std::function<bool(float)>& progress) {
  EvalReport report;
  if (!has_eval()) return report;
  // Every evaluation draws the same crops and masks: a fresh generator from the fixed seed.
  Rng rng(options_.val_seed);
  const int total = val_->size() * options_.val_crops, Np = net_.patches(), Nv = net_.visible();
  std::vector<int32_t> photos;
  double loss_sum = 0.0;
  for (int start = 0; start < total; start += recipe_.batch) {
    const int count = std::min(recipe_.batch, total - start);
    photos.resize(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) photos[static_cast<size_t>(i)] = (start + i) / options_.val_crops;
    load_crops(*val_, photos.data(), count, rng, false);
    keep_.resize(static_cast<size_t>(count) * Nv);
    train::random_keep(rng, count, Np, Nv, keep_.data());
    // Every image hides the same number of patches, so the batch mean weights images equally.
    const float loss = net_.forward(batch_images_.data(), keep_.data(), count);
    loss_sum += static_cast<double>(loss) * count;
    report.images += count;
    if (progress && !progress(static_cast<float>(report.images) / static_cast<float>(total))) break;
  }
  if (report.images > 0) report.loss = loss_sum / report.images;
  return report;
}

std::string MaeObjective::order_mismatch(size_t saved, size_t expected) const {
  return "saved state's data order covers " + std::to_string(saved) + " crops, the photos give " +
         std::to_string(expected) + " (same --data and --val-split?)";
}

}  // namespace vitlens
