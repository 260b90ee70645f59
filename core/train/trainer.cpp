// The training loop's pieces: timm's initialisation, the seeded data order and augmentation, one
// AdamW step per batch, evaluation.
#include "core/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "core/base/error.hpp"
#include "core/base/memory.hpp"
#include "core/base/parallel.hpp"

namespace vitlens {

// ---------------------------------------------------------------------------------------------
// Recipe

nlohmann::json Recipe::to_json() const {
  return {{"epochs", epochs},         {"batch", batch},
          {"lr", lr},                 {"min_lr", min_lr},
          {"weight_decay", weight_decay}, {"warmup_epochs", warmup_epochs},
          {"clip_norm", clip_norm},   {"label_smoothing", label_smoothing},
          {"augment", augment},       {"crop_pad", crop_pad},
          {"flip", flip},             {"beta1", beta1},
          {"beta2", beta2},           {"adam_eps", adam_eps},
          {"seed", seed},             {"threads", threads},
          {"shards", shards},         {"drop_path", drop_path},
          {"optimizer", "AdamW (torch.optim.AdamW semantics)"},
          {"schedule", "linear warmup, then cosine to min_lr"}};
}

Recipe Recipe::from_json(const nlohmann::json& j) {
  Recipe r;
  try {
    r.epochs = j.at("epochs").get<int>();
    r.batch = j.at("batch").get<int>();
    r.lr = j.at("lr").get<double>();
    r.min_lr = j.at("min_lr").get<double>();
    r.weight_decay = j.at("weight_decay").get<double>();
    r.warmup_epochs = j.at("warmup_epochs").get<double>();
    r.clip_norm = j.at("clip_norm").get<double>();
    r.label_smoothing = j.at("label_smoothing").get<double>();
    r.augment = j.at("augment").get<bool>();
    r.crop_pad = j.at("crop_pad").get<int>();
    r.flip = j.at("flip").get<bool>();
    r.beta1 = j.at("beta1").get<double>();
    r.beta2 = j.at("beta2").get<double>();
    r.adam_eps = j.at("adam_eps").get<double>();
    r.seed = j.at("seed").get<uint64_t>();
    r.threads = j.at("threads").get<int>();
    // Absent from checkpoints written before the batch was split: those trained on it whole.
    r.shards = j.contains("shards") ? j.at("shards").get<int>() : 1;
    r.drop_path = j.contains("drop_path") ? j.at("drop_path").get<double>() : 0.0;  // older: none
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("training recipe: ") + e.what());
  }
  const std::string why = r.validate();
  if (!why.empty()) throw Error("training recipe: " + why);
  return r;
}

std::string Recipe::validate() const {
  std::ostringstream why;
  if (epochs < 1 || epochs > 100000) why << "epochs " << epochs << " is not in [1, 100000]";
  else if (batch < 1 || batch > 65536) why << "batch " << batch << " is not in [1, 65536]";
  else if (!(lr > 0.0) || lr > 10.0) why << "lr " << lr << " is not in (0, 10]";
  else if (!(min_lr >= 0.0) || min_lr > lr) why << "min_lr " << min_lr << " is not in [0, lr]";
  else if (!(weight_decay >= 0.0) || weight_decay > 10.0) why << "weight_decay " << weight_decay << " is not in [0, 10]";
  else if (!(warmup_epochs >= 0.0) || warmup_epochs > epochs)
    why << "warmup " << warmup_epochs << " epochs is not in [0, epochs = " << epochs << "]";
  else if (!(clip_norm >= 0.0) || clip_norm > 1e6) why << "clip_norm " << clip_norm << " is not in [0, 1e6]";
  else if (!(label_smoothing >= 0.0) || label_smoothing >= 1.0)
    why << "label_smoothing " << label_smoothing << " is not in [0, 1)";
  else if (!(drop_path >= 0.0) || drop_path >= 1.0) why << "drop_path " << drop_path << " is not in [0, 1)";
  else if (crop_pad < 0 || crop_pad > 64) why << "crop padding " << crop_pad << " is not in [0, 64]";
  else if (!(beta1 >= 0.0) || beta1 >= 1.0 || !(beta2 >= 0.0) || beta2 >= 1.0) why << "Adam betas must be in [0, 1)";
  else if (!(adam_eps > 0.0) || adam_eps > 1.0) why << "Adam eps " << adam_eps << " is not in (0, 1]";
  else if (threads < 0 || threads > 1024) why << "threads " << threads << " is not in [0, 1024]";
  else if (shards < 1 || shards > 64) why << "shards " << shards << " is not in [1, 64]";
  return why.str();
}

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

// ---------------------------------------------------------------------------------------------
// Trainer

namespace {

// A standard normal from two uniforms (Box-Muller); 1 - u keeps the log finite.
double normal(Rng& rng) {
  const double u1 = rng.uniform(), u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The config, once its training is known to fit in memory (for the member initialisers).
const VitConfig& fits_in_memory(const VitConfig& config, const Recipe& recipe, int num_classes) {
  require_training_memory(classifier_training_memory(config, recipe, num_classes));
  return config;
}

}  // namespace

double block_stack_floats(int L, int D, int H, int Hm, int N, double images) {
  // Per block and token: resid, ln1, qkv (3D), ctx, mid, ln2 (8D with the last residual), the
  // GELU and its slope (2 Hm), four norm statistics; per block and head the (N, N) weights. Then
  // the backward's one-block scratch.
  const double n = N;
  return images * (L * (n * (8.0 * D + 2.0 * Hm + 4.0) + H * n * n) + n * D + n * (6.0 * D + Hm));
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

void require_training_memory(const TrainingMemory& need) {
  const long long available = available_memory_bytes();
  if (available < 0 || need.bytes <= static_cast<double>(available)) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char text[320];
  std::snprintf(text, sizeof text,
                "training this model (%lld parameters) needs about %.1f GiB of memory, but only %.1f GiB is available: "
                "use a smaller --embed-dim, --depth, --mlp-ratio, --img-size or --batch",
                static_cast<long long>(need.parameters), need.bytes / kGiB, static_cast<double>(available) / kGiB);
  throw Error(text);
}

Trainer::Trainer(const VitConfig& config, const Recipe& recipe, const ImageSet* train, const ImageSet* eval)
    : net_(fits_in_memory(config, recipe, train && train->num_classes() > 0 ? train->num_classes() : 0),
           train && train->num_classes() > 0 ? train->num_classes() : 0),
      recipe_(recipe),
      train_(train),
      rng_(recipe.seed + 1) {
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
  adam_.beta1 = recipe.beta1;
  adam_.beta2 = recipe.beta2;
  adam_.eps = recipe.adam_eps;
  adam_.weight_decay = recipe.weight_decay;
  adam_.m.assign(net_.layout().total, 0.0f);
  adam_.v.assign(net_.layout().total, 0.0f);
  initialise();
  start_epoch();
}

void Trainer::initialise() {
  init_vit_params(net_.layout(), net_.params.data(), recipe_.seed, config().patch_values());
}

// timm's VisionTransformer.init_weights (mode ''): pos_embed trunc_normal(std=.02), cls_token
// normal(std=1e-6), every Linear trunc_normal(std=.02) with zero bias (init_weights_vit_timm),
// LayerNorm 1 / 0, and the patch Conv2d left at PyTorch's default, U(-1/sqrt(K), 1/sqrt(K)) for
// weight and bias. timm truncates at +-2 absolute, i.e. 100 standard deviations: a plain normal.
// MAE's extra tensors: mask_token normal(std=.02) as models_mae.py, decoder_pos_embed as pos_embed.
void init_vit_params(const train::ParamLayout& layout, float* params, uint64_t seed, int patch_values) {
  Rng init(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(patch_values));
  for (const train::ParamEntry& e : layout.entries) {
    float* p = params + e.offset;
    if (e.name == "cls_token") {
      for (size_t i = 0; i < e.size; ++i) p[i] = static_cast<float>(1e-6 * normal(init));
    } else if (e.name.rfind("patch_embed.", 0) == 0) {
      for (size_t i = 0; i < e.size; ++i) p[i] = static_cast<float>((2.0 * init.uniform() - 1.0) * bound);
    } else if (e.name == "pos_embed" || e.name == "decoder_pos_embed" || e.name == "mask_token" ||
               (e.shape.size() == 2 && ends_with(e.name, ".weight"))) {
      for (size_t i = 0; i < e.size; ++i) p[i] = static_cast<float>(0.02 * normal(init));
    } else if (ends_with(e.name, "norm1.weight") || ends_with(e.name, "norm2.weight") || ends_with(e.name, "norm.weight")) {
      std::fill(p, p + e.size, 1.0f);
    } else {
      std::fill(p, p + e.size, 0.0f);  // biases
    }
  }
}

int Trainer::shard_count(int count) const { return std::max(1, std::min(recipe_.shards, count)); }

int Trainer::shard_start(int s, int count) const {
  return static_cast<int>(static_cast<int64_t>(count) * s / shard_count(count));
}

int Trainer::shard_size(int s, int count) const { return shard_start(s + 1, count) - shard_start(s, count); }

train::VitNet<float>& Trainer::shard_net(int s) { return s == 0 ? net_ : replicas_[static_cast<size_t>(s - 1)]; }
const train::VitNet<float>& Trainer::shard_net(int s) const {
  return s == 0 ? net_ : replicas_[static_cast<size_t>(s - 1)];
}

void Trainer::run_shards(int count, bool with_backward) {
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

float Trainer::forward_backward(int count) {
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

int Trainer::count_correct(int count) const {
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

int64_t Trainer::steps_per_epoch() const { return train_->size() / recipe_.batch; }
int64_t Trainer::total_steps() const { return steps_per_epoch() * recipe_.epochs; }

void Trainer::start_epoch() {
  pos_.order.resize(static_cast<size_t>(train_->size()));
  std::iota(pos_.order.begin(), pos_.order.end(), 0);
  rng_.shuffle(pos_.order);
  pos_.position = 0;
  std::copy(rng_.s, rng_.s + 4, pos_.rng);
}

void Trainer::load_batch(const ImageSet& set, const int32_t* indices, int count, bool augment) {
  const int H = set.height, W = set.width;
  const size_t plane = static_cast<size_t>(H) * W;
  batch_images_.resize(static_cast<size_t>(count) * 3 * plane);
  batch_labels_.resize(static_cast<size_t>(count));
  scratch_.resize(3 * plane);
  const VitConfig& c = config();
  for (int i = 0; i < count; ++i) {
    const int index = indices ? indices[i] : i;
    const float* src = set.image(index);
    if (augment) {
      augment_crop_flip(src, H, W, recipe_.crop_pad, recipe_.flip, rng_, scratch_.data());
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

void Trainer::draw_drop_path(int count) {
  drop_scale_.clear();
  const int L = config().depth;
  if (!(recipe_.drop_path > 0.0) || L < 2) return;  // linspace(0, rate, 1) = [0]: nothing dropped
  drop_scale_.assign(static_cast<size_t>(2) * L * count, 1.0f);
  for (int l = 1; l < L; ++l) {
    const double p = recipe_.drop_path * l / (L - 1), keep = 1.0 - p;
    const float kept = static_cast<float>(1.0 / keep);
    for (int branch = 0; branch < 2; ++branch)
      for (int b = 0; b < count; ++b)
        drop_scale_[static_cast<size_t>((2 * l + branch) * count + b)] = rng_.uniform() < keep ? kept : 0.0f;
  }
}

StepReport Trainer::step() {
  if (finished()) throw Error("training is finished: no step left");
  // A finished epoch whose successor was not started (the run ended there, then was extended).
  if (pos_.position >= steps_per_epoch()) start_epoch();
  const int B = recipe_.batch;
  load_batch(*train_, pos_.order.data() + pos_.position * B, B, recipe_.augment);
  draw_drop_path(B);

  const float loss = forward_backward(B);
  if (!std::isfinite(loss))
    throw Error("the loss is not finite at step " + std::to_string(pos_.step + 1) + ": lower --lr");
  StepReport report;
  report.grad_norm = train::clip_grad_norm(net_.grads, recipe_.clip_norm);
  const int64_t warmup = static_cast<int64_t>(std::llround(recipe_.warmup_epochs * steps_per_epoch()));
  report.lr = train::scheduled_lr(recipe_.lr, recipe_.min_lr, pos_.step, warmup, total_steps());
  adam_.update(net_.layout(), net_.params.data(), net_.grads.data(), report.lr);

  report.loss = loss;
  report.accuracy = static_cast<double>(count_correct(B)) / B;
  report.epoch = pos_.epoch;
  ++pos_.step;
  ++pos_.position;
  report.step = pos_.step;
  std::copy(rng_.s, rng_.s + 4, pos_.rng);
  if (pos_.position >= steps_per_epoch()) {
    ++pos_.epoch;
    if (!finished()) start_epoch();
  }
  return report;
}

EvalReport Trainer::evaluate(const ImageSet& set, const std::function<bool(float)>& progress) {
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
    load_batch(set, indices.data(), count, false);
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

double Trainer::gradients_of_first_batch() {
  const int count = recipe_.batch;
  load_batch(*train_, nullptr, count, false);
  net_.zero_grad();
  const float loss = net_.forward(batch_images_.data(), batch_labels_.data(), nullptr, count);
  net_.backward();
  return loss;
}

void Trainer::restore(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                      int64_t adam_step, const TrainPosition& position) {
  const size_t total = net_.layout().total;
  if (params.size() != total || m.size() != total || v.size() != total)
    throw Error("saved state has " + std::to_string(params.size()) + " parameters, the model has " +
                std::to_string(total));
  if (position.order.size() != static_cast<size_t>(train_->size()))
    throw Error("saved state's data order covers " + std::to_string(position.order.size()) +
                " images, the training set has " + std::to_string(train_->size()) + " (same --data, --limit, --val-split?)");
  for (int32_t i : position.order)
    if (i < 0 || i >= train_->size()) throw Error("saved state's data order is corrupt");
  if (position.position < 0 || position.position > steps_per_epoch() || position.step < 0 || adam_step < 0)
    throw Error("saved state's position is out of range (same --batch?)");
  net_.params = params;
  adam_.m = m;
  adam_.v = v;
  adam_.step = adam_step;
  pos_ = position;
  std::copy(position.rng, position.rng + 4, rng_.s);
}

}  // namespace vitlens
