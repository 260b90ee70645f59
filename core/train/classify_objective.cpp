// The classifier objective (classify_objective.hpp): the batch of labelled images, split into
// parts whose gradients are summed (gradient accumulation), cross-entropy, accuracy.
#include "core/train/classify_objective.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/base/error.hpp"
#include "core/base/parallel.hpp"

namespace vitlens {

namespace {

// The config, once its training is known to fit in memory (for the member initialisers).
const VitConfig& fits_in_memory(const VitConfig& config, const Recipe& recipe, int num_classes) {
  require_training_memory(classifier_training_memory(config, recipe, num_classes));
  return config;
}

int classes_of(const ImageSet* train) { return train && train->num_classes() > 0 ? train->num_classes() : 0; }

// The kind: the options are the class count; every tensor is in the model file.
std::string check_options(const VitConfig&, const nlohmann::json& options) {
  if (!options.is_number_integer() || options.get<int64_t>() < 0 || options.get<int64_t>() > 1000000)
    return "__metadata__['num_classes'] is " + options.dump() + ", not a class count";
  return "";
}
train::ParamLayout layout_of(const VitConfig& config, const nlohmann::json& options) {
  return train::param_layout(config, options.get<int>());
}
int one_copy(const nlohmann::json&) { return 1; }
int head_of(const nlohmann::json& options) { return options.get<int>(); }
bool every_tensor(const std::string&) { return true; }

}  // namespace

const ObjectiveKind kClassifyKind = {"classify", "num_classes", true, check_options, layout_of, one_copy, head_of, every_tensor};

std::string check_image_set(const VitConfig& config, const ImageSet& set, const std::string& what) {
  std::ostringstream why;
  if (set.size() < 1) why << what << " has no images";
  else if (set.height != config.img_h || set.width != config.img_w)
    why << what << " has " << set.height << "x" << set.width << " images, the model takes " << config.img_h << "x"
        << config.img_w;
  else if (set.pixels.size() != static_cast<size_t>(set.size()) * 3 * set.height * set.width)
    why << what << " holds " << set.pixels.size() << " pixel values for " << set.size() << " images";
  return why.str();
}

TrainingMemory classifier_training_memory(const VitConfig& config, const Recipe& recipe, int num_classes) {
  TrainingMemory need;
  need.parameters = static_cast<int64_t>(train::param_layout(config, num_classes).total);
  const double P = static_cast<double>(need.parameters), B = recipe.batch, D = config.embed_dim;
  const double Np = static_cast<double>(config.grid_h()) * config.grid_w(), N = config.tokens(), K = config.patch_values();
  const double pixels = 3.0 * config.img_h * config.img_w;
  // Parameters and gradients in each part's net, Adam's m and v once.
  double floats = (2.0 * std::max(1, recipe.shards) + 2.0) * P;
  floats += block_stack_floats(config.depth, config.embed_dim, config.num_heads, config.mlp_hidden(), config.tokens(), B);
  // Patches, embeddings, the final norm, the images and their gradients, logits (vit_train.cpp).
  floats += B * (2.0 * Np * K + 2.0 * Np * D + 4.0 * N * D + 2.0 * pixels + 3.0 * num_classes);
  need.bytes = 4.0 * floats;
  return need;
}

ClassifyObjective::ClassifyObjective(const VitConfig& config, const Recipe& recipe, const ImageSet* train,
                                     const ImageSet* eval)
    : NetObjective(recipe, fits_in_memory(config, recipe, classes_of(train)), classes_of(train)),
      train_(train),
      eval_(eval) {
  const std::string why = recipe.validate();
  if (!why.empty()) throw Error(why);
  const std::string bad_train = check_image_set(config, *train, "training set " + train->source);
  if (!bad_train.empty()) throw Error(bad_train);
  if (eval) {
    const std::string bad_eval = check_image_set(config, *eval, "evaluation set " + eval->source);
    if (!bad_eval.empty()) throw Error(bad_eval);
  }
  if (train->size() < recipe.batch)
    throw Error("the training set has " + std::to_string(train->size()) + " images, fewer than one batch of " +
                std::to_string(recipe.batch) + " (lower --batch)");
  net_.threads = recipe.threads;
  net_.label_smoothing = static_cast<float>(recipe.label_smoothing);
}

const ObjectiveKind& ClassifyObjective::kind() const { return kClassifyKind; }

std::string ClassifyObjective::order_mismatch(size_t saved, size_t expected) const {
  return "saved state's data order covers " + std::to_string(saved) + " images, the training set has " +
         std::to_string(expected) + " (same --data, --limit, --val-split?)";
}

int ClassifyObjective::shard_count(int count) const { return std::max(1, std::min(recipe_.shards, count)); }

int ClassifyObjective::shard_start(int s, int count) const {
  return static_cast<int>(static_cast<int64_t>(count) * s / shard_count(count));
}

int ClassifyObjective::shard_size(int s, int count) const { return shard_start(s + 1, count) - shard_start(s, count); }

train::VitNet<float>& ClassifyObjective::shard_net(int s) { return s == 0 ? net_ : replicas_[static_cast<size_t>(s - 1)]; }
const train::VitNet<float>& ClassifyObjective::shard_net(int s) const {
  return s == 0 ? net_ : replicas_[static_cast<size_t>(s - 1)];
}

void ClassifyObjective::run_shards(int count, bool with_backward) {
  const int S = shard_count(count);
  while (static_cast<int>(replicas_.size()) < S - 1) replicas_.emplace_back(net_.config(), net_.num_classes());
  // Side by side, one thread each, when the threads are S to 2S - 1 (the parts need no
  // synchronisation then), or when S is a multiple of the threads (each thread takes the next part
  // when done with one: a part of fewer images keeps more of its activations in cache between its
  // forward and its backward); otherwise one part after another, each on every thread, which wastes no core (ops
  // started from inside a pool task would run on threads of their own). Each part's numbers are
  // the same on one thread as on several, so this choice changes no number.
  const int threads = resolve_threads(recipe_.threads);
  const bool side_by_side = S > 1 && threads > 1 && threads < 2 * S && (threads >= S || S % threads == 0);
  for (int s = 0; s < S; ++s) {
    train::VitNet<float>& net = shard_net(s);
    if (s > 0) {
      net.params = net_.params;  // the same size: copies without allocating
      net.label_smoothing = net_.label_smoothing;
    }
    net.threads = side_by_side ? 1 : recipe_.threads;
    // This part's images' columns of the (L, 2, B) drop-path scales, as (L, 2, n).
    net.drop_scale.clear();
    if (with_backward && !drop_scale_.empty()) {
      const int start = shard_start(s, count), n = shard_size(s, count);
      for (size_t row = 0; row < drop_scale_.size() / static_cast<size_t>(count); ++row)
        net.drop_scale.insert(net.drop_scale.end(), drop_scale_.begin() + static_cast<std::ptrdiff_t>(row * count + start),
                              drop_scale_.begin() + static_cast<std::ptrdiff_t>(row * count + start + n));
    }
  }
  shard_loss_.assign(static_cast<size_t>(S), 0.0f);
  const size_t image_values = static_cast<size_t>(3) * config().img_h * config().img_w;
  auto part = [&](int s) {
    train::VitNet<float>& net = shard_net(s);
    const int start = shard_start(s, count), n = shard_size(s, count);
    const float loss = net.forward(batch_images_.data() + static_cast<size_t>(start) * image_values,
                                   batch_labels_.data() + start, nullptr, n);
    shard_loss_[static_cast<size_t>(s)] = loss;
    if (with_backward && std::isfinite(loss)) {
      net.zero_grad();
      net.backward();
    }
  };
  if (side_by_side) run_tasks(S, std::min(S, threads), part);
  else
    for (int s = 0; s < S; ++s) part(s);
  net_.threads = recipe_.threads;  // net() used directly runs on every thread again
  for (int s = 0; s < S; ++s) shard_net(s).drop_scale.clear();  // a later forward (a probe) drops nothing
}

float ClassifyObjective::forward_backward(int count) {
  run_shards(count, true);
  const int S = shard_count(count);
  // Part s's gradient is that of its own mean loss; the batch's is their mean weighted by size,
  // summed in part order (1 part: the gradient as it is).
  double loss = 0.0;
  for (int s = 0; s < S; ++s) loss += static_cast<double>(shard_loss_[static_cast<size_t>(s)]) * shard_size(s, count) / count;
  if (S > 1 && std::isfinite(loss)) {
    std::vector<float> share(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s)
      share[static_cast<size_t>(s)] = static_cast<float>(shard_size(s, count)) / static_cast<float>(count);
    float* g = net_.grads.data();
    for (size_t i = 0; i < net_.grads.size(); ++i) {
      float sum = share[0] * g[i];
      for (int s = 1; s < S; ++s) sum += share[static_cast<size_t>(s)] * replicas_[static_cast<size_t>(s - 1)].grads[i];
      g[i] = sum;
    }
  }
  return static_cast<float>(loss);
}

int ClassifyObjective::count_correct(int count) const {
  const int C = net_.num_classes();
  int correct = 0;
  for (int s = 0; s < shard_count(count); ++s) {
    const train::VitNet<float>& net = shard_net(s);
    const int start = shard_start(s, count), n = shard_size(s, count);
    for (int b = 0; b < n; ++b) {
      const float* row = net.logits() + static_cast<size_t>(b) * C;
      if (std::max_element(row, row + C) - row == batch_labels_[static_cast<size_t>(start + b)]) ++correct;
    }
  }
  return correct;
}

void ClassifyObjective::load_batch(const ImageSet& set, const int32_t* indices, int count, Rng* augment_rng) {
  const int H = set.height, W = set.width;
  const size_t plane = static_cast<size_t>(H) * W;
  batch_images_.resize(static_cast<size_t>(count) * 3 * plane);
  batch_labels_.resize(static_cast<size_t>(count));
  scratch_.resize(3 * plane);
  const VitConfig& c = config();
  for (int i = 0; i < count; ++i) {
    const int index = indices ? indices[i] : i;
    const float* src = set.image(index);
    if (augment_rng) {
      augment_crop_flip(src, H, W, recipe_.crop_pad, recipe_.flip, *augment_rng, scratch_.data());
      src = scratch_.data();
    }
    float* dst = batch_images_.data() + static_cast<size_t>(i) * 3 * plane;
    for (int ch = 0; ch < 3; ++ch) {
      const float mean = c.mean[static_cast<size_t>(ch)], inv_std = 1.0f / c.std[static_cast<size_t>(ch)];
      for (size_t k = 0; k < plane; ++k) dst[ch * plane + k] = (src[ch * plane + k] - mean) * inv_std;
    }
    batch_labels_[static_cast<size_t>(i)] = set.labels[static_cast<size_t>(index)];
  }
}

void ClassifyObjective::draw_drop_path(int count, Rng& rng) {
  drop_scale_.clear();
  const int L = config().depth;
  if (!(recipe_.drop_path > 0.0) || L < 2) return;  // linspace(0, rate, 1) = [0]: nothing dropped
  drop_scale_.assign(static_cast<size_t>(2) * L * count, 1.0f);
  for (int l = 1; l < L; ++l) {
    const double p = recipe_.drop_path * l / (L - 1), keep = 1.0 - p;
    const float kept = static_cast<float>(1.0 / keep);
    for (int branch = 0; branch < 2; ++branch)
      for (int b = 0; b < count; ++b)
        drop_scale_[static_cast<size_t>((2 * l + branch) * count + b)] = rng.uniform() < keep ? kept : 0.0f;
  }
}

BatchResult ClassifyObjective::train_batch(const int32_t* items, int count, Rng& rng) {
  load_batch(*train_, items, count, recipe_.augment ? &rng : nullptr);
  draw_drop_path(count, rng);
  BatchResult result;
  result.loss = forward_backward(count);
  result.accuracy = static_cast<double>(count_correct(count)) / count;
  return result;
}

EvalReport ClassifyObjective::evaluate(const std::function<bool(float)>& progress) {
  return eval_ ? evaluate_set(*eval_, progress) : EvalReport();
}

EvalReport ClassifyObjective::evaluate_set(const ImageSet& set, const std::function<bool(float)>& progress) {
  const std::string bad = check_image_set(config(), set, "evaluation set " + set.source);
  if (!bad.empty()) throw Error(bad);
  EvalReport report;
  const int C = net_.num_classes();
  double loss_sum = 0.0;
  int correct = 0;
  std::vector<int32_t> indices;
  for (int start = 0; start < set.size(); start += recipe_.batch) {
    const int count = std::min(recipe_.batch, set.size() - start);
    indices.resize(static_cast<size_t>(count));
    std::iota(indices.begin(), indices.end(), start);
    load_batch(set, indices.data(), count, nullptr);
    for (int32_t label : batch_labels_)
      if (label < 0 || label >= C)
        throw Error("evaluation set " + set.source + " has label " + std::to_string(label) + ", the model has " +
                    std::to_string(C) + " classes");
    run_shards(count, false);
    for (int s = 0; s < shard_count(count); ++s)
      loss_sum += static_cast<double>(shard_loss_[static_cast<size_t>(s)]) * shard_size(s, count);
    correct += count_correct(count);
    report.images += count;
    if (progress && !progress(static_cast<float>(report.images) / static_cast<float>(set.size()))) break;
  }
  if (report.images > 0) {
    report.loss = loss_sum / report.images;
    report.accuracy = static_cast<double>(correct) / report.images;
  }
  return report;
}

double ClassifyObjective::gradients_of_first_batch() {
  const int count = recipe_.batch;
  load_batch(*train_, nullptr, count, nullptr);
  net_.zero_grad();
  const float loss = net_.forward(batch_images_.data(), batch_labels_.data(), nullptr, count);
  net_.backward();
  return loss;
}

}  // namespace vitlens
