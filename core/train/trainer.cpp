// The training loop every objective runs under: timm's initialisation, the seeded data order, one
// AdamW step per batch; the recipe and the memory estimate.
#include "core/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "core/base/error.hpp"
#include "core/base/memory.hpp"

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

}  // namespace

double block_stack_floats(int L, int D, int H, int Hm, int N, double images) {
  // Per block and token: resid, ln1, qkv (3D), ctx, mid, ln2 (8D with the last residual), the
  // GELU and its slope (2 Hm), four norm statistics; per block and head the (N, N) weights. Then
  // the backward's one-block scratch.
  const double n = N;
  return images * (L * (n * (8.0 * D + 2.0 * Hm + 4.0) + H * n * n) + n * D + n * (6.0 * D + Hm));
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

Trainer::Trainer(std::unique_ptr<Objective> objective)
    : objective_(std::move(objective)), recipe_(objective_->recipe()), rng_(recipe_.seed + 1) {
  adam_.beta1 = recipe_.beta1;
  adam_.beta2 = recipe_.beta2;
  adam_.eps = recipe_.adam_eps;
  adam_.weight_decay = recipe_.weight_decay;
  adam_.m.assign(objective_->layout().total, 0.0f);
  adam_.v.assign(objective_->layout().total, 0.0f);
  init_vit_params(objective_->layout(), objective_->params().data(), recipe_.seed, config().patch_values());
  start_epoch();
}

int64_t Trainer::steps_per_epoch() const {
  return static_cast<int64_t>(objective_->items()) * objective_->copies() / recipe_.batch;
}
int64_t Trainer::total_steps() const { return steps_per_epoch() * recipe_.epochs; }

// Every item copies() times (the classifier's images once, MAE's photos once per crop), shuffled.
void Trainer::start_epoch() {
  const size_t n = static_cast<size_t>(objective_->items());
  pos_.order.resize(n * static_cast<size_t>(objective_->copies()));
  for (size_t i = 0; i < pos_.order.size(); ++i) pos_.order[i] = static_cast<int32_t>(i % n);
  rng_.shuffle(pos_.order);
  pos_.position = 0;
  std::copy(rng_.s, rng_.s + 4, pos_.rng);
}

StepReport Trainer::step() {
  if (finished()) throw Error("training is finished: no step left");
  // A finished epoch whose successor was not started (the run ended there, then was extended).
  if (pos_.position >= steps_per_epoch()) start_epoch();
  const int B = recipe_.batch;
  const BatchResult batch = objective_->train_batch(pos_.order.data() + pos_.position * B, B, rng_);
  if (!std::isfinite(batch.loss))
    throw Error("the loss is not finite at step " + std::to_string(pos_.step + 1) + ": lower --lr");
  StepReport report;
  std::vector<float>& grads = objective_->grads();
  report.grad_norm = train::clip_grad_norm(grads, recipe_.clip_norm);
  const int64_t warmup = static_cast<int64_t>(std::llround(recipe_.warmup_epochs * steps_per_epoch()));
  report.lr = train::scheduled_lr(recipe_.lr, recipe_.min_lr, pos_.step, warmup, total_steps());
  adam_.update(objective_->layout(), objective_->params().data(), grads.data(), report.lr);

  report.loss = batch.loss;
  report.accuracy = batch.accuracy;
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

void Trainer::restore(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                      int64_t adam_step, const TrainPosition& position) {
  const size_t total = objective_->layout().total;
  if (params.size() != total || m.size() != total || v.size() != total)
    throw Error("saved state has " + std::to_string(params.size()) + " parameters, the model has " +
                std::to_string(total));
  const int items = objective_->items();
  const size_t expected = static_cast<size_t>(items) * static_cast<size_t>(objective_->copies());
  if (position.order.size() != expected) throw Error(objective_->order_mismatch(position.order.size(), expected));
  for (int32_t i : position.order)
    if (i < 0 || i >= items) throw Error("saved state's data order is corrupt");
  if (position.position < 0 || position.position > steps_per_epoch() || position.step < 0 || adam_step < 0)
    throw Error("saved state's position is out of range (same --batch?)");
  objective_->params() = params;
  adam_.m = m;
  adam_.v = v;
  adam_.step = adam_step;
  pos_ = position;
  std::copy(position.rng, position.rng + 4, rng_.s);
}

}  // namespace vitlens
