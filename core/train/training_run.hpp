#pragma once
// One training run, whoever drives it: `vitlens train` in a terminal (app/cli_train.cpp) and the
// viewer's Train window on its worker thread (app/viewer/training/train_session.cpp). A run is a
// Trainer of any objective plus what happens between its steps: the window averages and the
// images/s the progress shows, the log (log.jsonl, JSON lines), evaluation at the end of each epoch
// (and every `eval_every` steps), a checkpoint at the end of each epoch, the run's JSON record (what
// a checkpoint's "training" metadata says) and cancellation between steps.
//
// Checkpoint files are models/'s business (arrows point down: app -> models -> core), so a run
// gets its saver as a callback, the way progress goes out through callbacks: core never knows
// whether a terminal or a window shows it, nor how a checkpoint is written.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/train/trainer.hpp"

namespace vitlens {

// Where a run writes and how often it evaluates.
struct RunSettings {
  std::string checkpoint_path;  // saved at the end of each epoch; "" = only when save() is called
  std::string log_path;         // JSON lines appended (a window every log_every steps); "" = no log
  std::string eval_name;        // what the evaluation set is called in the record and log ("test", "val")
  int64_t log_every = 10;
  int64_t eval_every = 0;       // steps between evaluations besides the epoch ends; 0 = epoch ends only
};

// The steps since the last log line: what a progress bar shows after each step.
struct RunWindow {
  double loss = 0.0, accuracy = 0.0;  // means over the window's steps
  double images_per_s = 0.0;          // over the last 5 or more steps; 0 until then
  double seconds_left = 0.0;          // NAN while images_per_s is 0
};

struct RunHooks {
  // Writes a checkpoint of the trainer with the record (models/training_checkpoint.hpp's
  // save_checkpoint). Needed when RunSettings::checkpoint_path is set or save() is called.
  std::function<void(const Trainer&, const std::string& path, const nlohmann::json& record)> save;
  std::function<void(const StepReport&, const RunWindow&)> on_step;    // after every step
  std::function<void(const StepReport&, const EvalReport&)> on_eval;   // after every whole evaluation
  // Asked during an evaluation with its progress in [0, 1]: false cancels the pass, which then
  // changes neither the record nor the log (the viewer's stop).
  std::function<bool(float)> keep_going;
};

// A new run's model shape and recipe from a front end's settings (`vitlens train`'s flags, the Train
// window's fields), which name them alike: patch, embed_dim, heads, depth, mlp_ratio; epochs, batch,
// lr, weight_decay, warmup, label_smoothing, drop_path, augment, crop_pad, seed, threads. The layout
// is the model card's: qkv bias, images img x img.
template <class Settings>
VitConfig model_shape_of(const Settings& s, int img, bool class_token) {
  VitConfig config;
  config.patch_size = s.patch;
  config.embed_dim = s.embed_dim;
  config.num_heads = s.heads;
  config.depth = s.depth;
  config.img_h = config.img_w = img;
  config.class_token = class_token;
  config.mlp_ratio = s.mlp_ratio;
  config.qkv_bias = true;
  return config;
}

template <class Settings>
Recipe recipe_of_settings(const Settings& s) {
  Recipe recipe;
  recipe.epochs = s.epochs;
  recipe.batch = s.batch;
  recipe.lr = s.lr;
  recipe.min_lr = s.lr < 1e-5 ? s.lr : 1e-5;  // the cosine ends at 1e-5, or at lr when that is lower
  recipe.weight_decay = s.weight_decay;
  recipe.warmup_epochs = s.warmup;
  recipe.label_smoothing = s.label_smoothing;
  recipe.drop_path = s.drop_path;
  recipe.augment = s.augment;
  recipe.crop_pad = s.crop_pad;
  recipe.seed = s.seed;
  recipe.threads = s.threads;
  return recipe;
}

class TrainingRun {
 public:
  // `trainer` (restored already when resuming) must outlive the run. `record` is the record so far
  // (a resumed checkpoint's, or empty); its "seconds" is where the clock starts.
  TrainingRun(Trainer& trainer, nlohmann::json record, RunSettings settings, RunHooks hooks);

  Trainer& trainer() { return trainer_; }
  const Trainer& trainer() const { return trainer_; }
  nlohmann::json& record() { return record_; }
  const nlohmann::json& record() const { return record_; }
  // Training time of the whole run, earlier invocations included: the time spent in step(),
  // evaluate() and save() (a paused window adds nothing).
  double seconds() const;
  bool reports_accuracy() const;     // the objective measures accuracy as well as loss

  // One step and what falls due after it: its window (on_step), the log line, the evaluation (at
  // the end of an epoch or every eval_every steps) and at the end of an epoch the checkpoint.
  StepReport step();
  bool epoch_done() const;           // the last step ended an epoch (or the run)
  // Steps until the run is finished or `stop(steps this invocation)` says so after a step; a stop
  // between epochs saves first (the checkpoint). Returns true when it stopped early.
  bool run(const std::function<bool(int64_t)>& stop);

  // Evaluates the held-out data: the record's <eval>_loss (and _accuracy), a log line, on_eval.
  // Returns false (and changes nothing) when there is nothing to evaluate or keep_going cancelled.
  bool evaluate();
  // Runs `work` on the run's clock (work of the run outside step(): the CLI's final test pass).
  void timed(const std::function<void()>& work);
  // Writes the checkpoint to `path` with the record (its "seconds" brought up to date).
  void save(const std::string& path);
  // Appends one JSON line to the log (when there is one); throws vitlens::Error when it cannot.
  void log(const nlohmann::json& line) const;

 private:
  void note_step(const StepReport& r);  // the window, images/s, on_step, the log line
  struct Clocked;                        // adds the time of the outermost public call to seconds_

  Trainer& trainer_;
  nlohmann::json record_;
  RunSettings settings_;
  RunHooks hooks_;
  double seconds_before_ = 0.0, seconds_ = 0.0;
  int clock_depth_ = 0;
  std::chrono::steady_clock::time_point clock_start_, window_start_;
  StepReport last_;                      // the last step (what an evaluation is logged under)
  double loss_sum_ = 0.0, accuracy_sum_ = 0.0, images_per_s_ = 0.0;
  int window_ = 0;
  int64_t window_steps_ = 0, steps_ = 0;
};

// A resume's log: the lines of steps after `step` (the checkpoint it resumes from) are removed, as
// the run trains those steps again (a run killed after logging them, before saving them, logged
// steps that were lost). Only a regular file of JSON lines is rewritten, atomically; a line that
// is not a JSON object with a "step" stays (a last line without its end is ended). Returns how
// many lines were removed. Throws
// vitlens::Error when the log cannot be read or written.
int trim_log_after(const std::string& log_path, int64_t step);

}  // namespace vitlens
