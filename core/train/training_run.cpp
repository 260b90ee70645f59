// TrainingRun (training_run.hpp): what happens between a Trainer's steps, for every front end.
#include "core/train/training_run.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"

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

// Appended with one write to a regular file: never through a symbolic link (a link put at the log's
// name would have the run write into whatever file it points to).
void TrainingRun::log(const nlohmann::json& line) const {
  if (settings_.log_path.empty()) return;
  const std::string text = line.dump() + "\n";
  const int fd = ::open(settings_.log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat st {};
  const bool regular = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const bool written = regular && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!regular)
    throw Error(settings_.log_path + ": cannot append to the training log (" +
                (fd < 0 && error == ELOOP ? std::string("a symbolic link: the log is written only into a file of its own")
                 : fd < 0                 ? std::string(std::strerror(error))
                                          : std::string("not a regular file")) +
                ")");
  if (!written) throw Error(settings_.log_path + ": cannot append to the training log (" + std::strerror(error) + ")");
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

int trim_log_after(const std::string& log_path, int64_t step) {
  struct stat st {};
  if (::lstat(log_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;  // none, or not ours to rewrite
  const std::string text = read_whole_file(log_path, "the training log", uint64_t(1) << 32);
  std::string kept;
  int removed = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(at, end - at);
    at = end;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) {
      ++removed;
      continue;
    }
    kept += line;
  }
  // A last line a killed run left without its end: ended, so the next line starts on its own.
  const bool unended = !kept.empty() && kept.back() != '\n';
  if (unended) kept += '\n';
  if (removed > 0 || unended) write_file_atomic(log_path, kept);
  return removed;
}

}  // namespace vitlens
