// TrainingRun (training_run.hpp): what happens between a Trainer's steps, for every front end.
#include "core/train/training_run.hpp"

#include <cmath>
#include <fstream>

#include "core/base/error.hpp"

namespace vitlens {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

struct TrainingRun::Clocked {
  explicit Clocked(TrainingRun& run) : run_(run) {
    if (run_.clock_depth_++ == 0) run_.clock_start_ = Clock::now();
  }
  ~Clocked() {
    if (--run_.clock_depth_ == 0) run_.seconds_ += since(run_.clock_start_);
  }
  Clocked(const Clocked&) = delete;
  Clocked& operator=(const Clocked&) = delete;
  TrainingRun& run_;
};

TrainingRun::TrainingRun(Trainer& trainer, nlohmann::json record, RunSettings settings, RunHooks hooks)
    : trainer_(trainer), record_(std::move(record)), settings_(std::move(settings)), hooks_(std::move(hooks)) {
  if (!record_.is_object()) record_ = nlohmann::json::object();
  seconds_before_ = record_.value("seconds", 0.0);
  window_start_ = Clock::now();
  last_.step = trainer_.position().step;
  last_.epoch = trainer_.position().epoch;
}

double TrainingRun::seconds() const {
  return seconds_before_ + seconds_ + (clock_depth_ > 0 ? since(clock_start_) : 0.0);
}

void TrainingRun::timed(const std::function<void()>& work) {
  Clocked clock(*this);
  work();
}

bool TrainingRun::reports_accuracy() const { return trainer_.objective().kind().reports_accuracy; }

bool TrainingRun::epoch_done() const { return trainer_.position().position == 0 || trainer_.finished(); }

void TrainingRun::log(const nlohmann::json& line) const {
  if (settings_.log_path.empty()) return;
  std::ofstream out(settings_.log_path, std::ios::app);
  out << line.dump() << "\n";
  if (!out) throw Error(settings_.log_path + ": cannot append to the training log");
}

void TrainingRun::note_step(const StepReport& r) {
  ++steps_;
  ++window_steps_;
  loss_sum_ += r.loss;
  accuracy_sum_ += r.accuracy;
  ++window_;
  const int batch = trainer_.recipe().batch;
  const double window_seconds = since(window_start_);
  if (window_steps_ >= 5 && window_seconds > 0) {
    images_per_s_ = static_cast<double>(window_steps_) * batch / window_seconds;
    window_steps_ = 0;
    window_start_ = Clock::now();
  }
  RunWindow w;
  w.loss = loss_sum_ / window_;
  w.accuracy = accuracy_sum_ / window_;
  w.images_per_s = images_per_s_;
  w.seconds_left =
      images_per_s_ > 0 ? static_cast<double>(trainer_.total_steps() - r.step) * batch / images_per_s_ : NAN;
  if (hooks_.on_step) hooks_.on_step(r, w);
  if (r.step % settings_.log_every == 0 || epoch_done()) {
    nlohmann::json line = {{"step", r.step}, {"epoch", r.epoch}, {"loss", w.loss}, {"lr", r.lr},
                           {"grad_norm", r.grad_norm}, {"images_per_s", images_per_s_}, {"seconds", seconds()}};
    if (reports_accuracy()) line["accuracy"] = w.accuracy;
    log(line);
    loss_sum_ = accuracy_sum_ = 0.0;
    window_ = 0;
  }
}

StepReport TrainingRun::step() {
  Clocked clock(*this);
  const StepReport r = trainer_.step();
  last_ = r;
  note_step(r);
  const bool epoch_end = epoch_done();
  if (epoch_end || (settings_.eval_every > 0 && r.step % settings_.eval_every == 0)) evaluate();
  if (epoch_end && !settings_.checkpoint_path.empty()) save(settings_.checkpoint_path);
  return r;
}

bool TrainingRun::run(const std::function<bool(int64_t)>& stop) {
  while (!trainer_.finished()) {
    step();
    if (stop && stop(steps_)) {
      if (!epoch_done() && !settings_.checkpoint_path.empty()) save(settings_.checkpoint_path);
      return !trainer_.finished();
    }
  }
  return false;
}

bool TrainingRun::evaluate() {
  if (!trainer_.has_eval()) return false;
  Clocked clock(*this);
  bool cancelled = false;
  const EvalReport e = trainer_.evaluate([&](float done) {
    cancelled = hooks_.keep_going && !hooks_.keep_going(done);
    return !cancelled;
  });
  if (cancelled) return false;  // a partial pass is not a result
  nlohmann::json line = {{"step", last_.step}, {"epoch", last_.epoch}, {"eval", settings_.eval_name}, {"loss", e.loss}};
  if (reports_accuracy()) {
    record_[settings_.eval_name + "_accuracy"] = e.accuracy;
    line["accuracy"] = e.accuracy;
  }
  record_[settings_.eval_name + "_loss"] = e.loss;
  line["seconds"] = seconds();
  log(line);
  if (hooks_.on_eval) hooks_.on_eval(last_, e);
  return true;
}

void TrainingRun::save(const std::string& path) {
  Clocked clock(*this);
  record_["seconds"] = seconds();
  if (!hooks_.save) throw Error("this training run has no way to save a checkpoint");
  hooks_.save(trainer_, path, record_);
}

}  // namespace vitlens
