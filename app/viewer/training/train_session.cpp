// TrainSession (see train_session.hpp): one worker thread per run. The worker owns the data and the
// trainer (a Trainer over a ClassifyObjective, or an MaeObjective for photos); between two steps it serves saves,
// honours pause/stop, evaluates and refreshes the probe.
// Index:
//   [SECTION] Data and probe (worker side)
//   [SECTION] Commands (UI side)
//   [SECTION] Worker
#include "training/train_session.hpp"
#include "training/train_settings.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <opencv2/core.hpp>

#include "control/attention_stats.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "core/io/paths.hpp"
#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"
#include "core/render/maps.hpp"
#include "models/model_io.hpp"
#include "core/train/train_ops.hpp"
#include "core/train/trainer.hpp"
#include "core/train/training_run.hpp"

namespace vitlens::viewer {

// [SECTION] Data and probe (worker side)

namespace {

// What a run reads: labelled images for a classifier, or photos for MAE; and the probe image.
struct RunData {
  ImageSet train, eval;            // classifier
  PhotoRunData photos;             // MAE: photos.train, photos.val
  FolderReport folder_report;      // classifier on an ImageFolder: what its walk left out
  std::string eval_name;           // "test", "val" or "" (no evaluation)
  int train_count = 0, eval_count = 0;  // images or photos
  // The probe: one image the per-head maps are drawn for, (3, probe_h, probe_w) in [0, 1].
  std::vector<float> probe;
  int probe_h = 0, probe_w = 0, probe_label = -1;
  std::string probe_what;
};

// What a data folder's load left out, for the run's first message: "" or "; ..." per kind.
std::string left_out(const FolderReport& report) {
  std::string text;
  if (report.skipped > 0) text += "; " + std::to_string(report.skipped) + " unreadable file(s) skipped";
  if (report.links_outside > 0) text += "; " + links_outside_warning(report);
  return text;
}

// As `vitlens train`: Fashion-MNIST evaluates on the test images unless val-split > 0; a folder
// holds out val-split of each class; photos are read and split by the CLI's own function. The
// probe is the first evaluation image (else the first training image); for photos the first
// held-out photo (else the first photo), its centre square resized to img-size.
RunData load_run_data(const TrainSettings& s) {
  RunData d;
  const double split = val_split_of(s);
  auto probe_from = [&d](const ImageSet& set, const std::string& what) {
    if (set.size() == 0) throw Error(set.source + ": no images left to train on");
    d.probe.assign(set.image(0), set.image(0) + 3 * static_cast<size_t>(set.height) * set.width);
    d.probe_h = set.height;
    d.probe_w = set.width;
    d.probe_label = set.labels[0];
    d.probe_what = what;
  };
  if (is_photo_data(s.data)) {
    d.photos = load_photo_run_data(s.data, s.img_size, s.limit, split, s.seed);
    d.train_count = d.photos.train.size();
    d.eval_count = d.photos.val.size();
    d.eval_name = d.eval_count > 0 ? "val" : "";
    const bool held_out = d.eval_count > 0;
    const PhotoCorpus& from = held_out ? d.photos.val : d.photos.train;
    d.probe.resize(3 * static_cast<size_t>(s.img_size) * s.img_size);
    centre_crop_photo(from, 0, s.img_size, d.probe.data());
    d.probe_h = d.probe_w = s.img_size;
    d.probe_what = (held_out ? "held-out photo " : "photo ") + from.names[0] + ", centre crop";
    return d;
  }
  LabelledData data = load_labelled_data(s.data, s.img_size, s.limit, split, s.seed, /*keep_test=*/false);
  d.train = std::move(data.train);
  d.eval = std::move(data.eval);
  d.eval_name = data.eval_name;
  d.folder_report = std::move(data.report);
  d.train_count = d.train.size();
  d.eval_count = d.eval.size();
  if (d.eval_count > 0) probe_from(d.eval, "image 0 of the " + d.eval_name + " set");
  else probe_from(d.train, "image 0 of the training set");
  return d;
}

// The current weights as an ordinary VitModel: the tensors the checkpoint's model file holds (for
// MAE the encoder alone), so the probe shows what opening that file would show.
VitModel current_model(const Trainer& trainer) {
  return model_from_tensors(trainer.config(), model_file_tensors(trainer.objective()), "the training weights");
}

struct ProbeResult {
  ProbeMaps maps;
  std::vector<float> entropy, distance;               // (H)
  std::vector<std::array<float, kHeadRoles>> roles;   // (H)
};

// The probe's maps and statistics for the trainer's current weights: the parameters are copied
// into an ordinary VitModel and go through the same forward, maps, statistics and role scores as
// an opened model file, so the window shows what `vitlens view` would show for a saved checkpoint.
ProbeResult compute_probe(const Trainer& trainer, const RunData& data) {
  const VitModel model = current_model(trainer);
  const int h = data.probe_h, w = data.probe_w;
  cv::Mat rgb(h, w, CV_32FC3);
  const float* planes = data.probe.data();  // (3, H, W)
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) rgb.at<cv::Vec3f>(y, x)[c] = planes[(c * h + y) * w + x];
  const PreparedImage prepared = prepare_image(rgb, model.config, 0, "the probe image");
  ForwardOptions options;
  options.threads = 1;  // the trainer's threads are idle now, but one is plenty for one small image
  const ForwardResult result = forward(model, prepared.grid, options);
  const int layer = model.config.depth - 1;

  ProbeResult out;
  MapRequest request;
  request.mode = MapMode::Received;
  request.layer = layer;
  HeadMaps maps = attention_maps(model, result, request);
  out.maps.layer = layer;
  out.maps.grid_h = maps.grid_h;
  out.maps.grid_w = maps.grid_w;
  out.maps.heads = std::move(maps.heads);
  out.maps.image_h = h;
  out.maps.image_w = w;
  out.maps.image_rgb.assign(reinterpret_cast<const float*>(rgb.data), reinterpret_cast<const float*>(rgb.data) + h * w * 3);
  out.maps.label = data.probe_label;
  out.maps.what = data.probe_what;

  const ImageStats stats = head_statistics(model, result, prepared.grid.patch_is_padding, 256, {});
  HeadRoleOptions role_options;
  role_options.layer = layer;
  const HeadRoleScores roles = head_role_scores(model, prepared.grid, result, role_options);
  const int heads = model.config.num_heads;
  for (int hd = 0; hd < heads; ++hd) {
    out.entropy.push_back(static_cast<float>(stats.layers[layer][hd].entropy));
    out.distance.push_back(static_cast<float>(stats.layers[layer][hd].mean_distance));
    std::array<float, kHeadRoles> lifts{};
    for (int r = 0; r < kHeadRoles; ++r) lifts[r] = static_cast<float>(roles.lift[layer][hd][r]);
    out.roles.push_back(lifts);
  }
  return out;
}

}  // namespace

struct TrainSession::Run {
  TrainSettings settings;
  bool pause = false, stop = false, quit = false;       // guarded by the session's mutex
  std::deque<std::pair<uint64_t, std::string>> saves;  // (id, path) in request order
};

// [SECTION] Commands (UI side)

TrainSession::TrainSession() = default;

// The temporary folder's checkpoints go with the viewer when a Save elsewhere holds the same
// weights or later ones of the same run: those it saved and nobody changed since are removed, then
// the folder if nothing else is in it. Otherwise they are the run's only copy and stay
// (unsaved_temporary names them).
TrainSession::~TrainSession() {
  join();
  if (saved_files_.empty() || !unsaved_temporary().empty()) return;
  const std::string folder = temporary_folder();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const auto stamp = file_stamp(it->path().string());
    std::error_code remove_error;
    if (stamp && saved_files_.count(*stamp)) std::filesystem::remove(it->path(), remove_error);
  }
  ::rmdir(folder.c_str());  // fails, harmlessly, unless empty
}

std::string TrainSession::unsaved_temporary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return temporary_saved_.empty() || temporary_covered_ ? std::string() : temporary_saved_;
}

void TrainSession::join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run_) run_->quit = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string TrainSession::start(const TrainSettings& settings) {
  const std::string problem = check_train_settings(settings);
  if (!problem.empty()) return problem;
  join();  // the previous run ends (its pending saves are written first)
  auto run = std::make_shared<Run>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++run_serial_;
  }
  run->settings = settings;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t version = snap_.version + 1;
    snap_ = TrainSnapshot{};
    snap_.version = version;
    snap_.state = TrainState::Loading;
    snap_.data = settings.data;
    snap_.epochs = settings.epochs;
    snap_.message = "loading " + settings.data + " ...";
    run_ = run;
  }
  thread_ = std::thread([this, run] { worker_main(run); });
  return "";
}

void TrainSession::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (run_) run_->pause = true;
  if (snap_.state == TrainState::Running) {
    snap_.state = TrainState::Paused;
    ++snap_.version;
  }
}

void TrainSession::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run_) run_->pause = false;
    if (snap_.state == TrainState::Paused) {
      snap_.state = TrainState::Running;
      ++snap_.version;
    }
  }
  wake_.notify_all();
}

void TrainSession::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run_) run_->stop = true;
  }
  wake_.notify_all();
}

uint64_t TrainSession::request_save(const std::string& path) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!run_) {
      snap_.message = "Save failed: no training run has started";
      ++snap_.version;
      return 0;
    }
    id = next_save_id_++;
    run_->saves.emplace_back(id, path);
  }
  wake_.notify_all();
  return id;
}

bool TrainSession::save_finished(uint64_t id, std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_save_id_ < id) return false;
  const auto it = save_errors_.find(id);
  error = it == save_errors_.end() ? std::string() : it->second;
  if (it != save_errors_.end()) save_errors_.erase(it);
  return true;
}

std::string TrainSession::save(const std::string& path) {
  const uint64_t id = request_save(path);
  if (id == 0) return "no training run has started";
  std::string error;
  std::unique_lock<std::mutex> lock(mutex_);
  saved_.wait(lock, [&] { return done_save_id_ >= id; });
  const auto it = save_errors_.find(id);
  if (it != save_errors_.end()) {
    error = it->second;
    save_errors_.erase(it);
  }
  return error;
}

// In the system's temporary folder ($TMPDIR when it names a folder, else /tmp): never a name
// relative to wherever the viewer was started.
std::string TrainSession::temporary_folder() { return temporary_parent() + "/vitlens-train-" + std::to_string(::getpid()); }

std::string TrainSession::temporary_parent() {
  std::error_code ec;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(ec);
  return ec || !temp.is_absolute() ? std::string("/tmp") : temp.lexically_normal().string();
}

// Any viewer's temporary folder (this one's or another running or ended session's): a folder
// "vitlens-train-<pid>" in the temporary folder.
bool TrainSession::in_a_temporary_folder(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return false;
  const std::string folder = p.parent_path().filename().string();
  const std::string prefix = "vitlens-train-";
  return p.parent_path().parent_path() == std::filesystem::path(temporary_parent()) &&
         folder.size() > prefix.size() && folder.compare(0, prefix.size(), prefix) == 0 &&
         folder.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

std::string TrainSession::viewing_path(std::string& error) const {
  std::string folder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run_) folder = run_->settings.out;
  }
  if (folder.empty()) folder = temporary_folder();
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    error = folder + ": cannot create the folder (" + ec.message() + ")";
    return "";
  }
  error.clear();
  // A name whose model and state are both free or this window's own, numbered on past any other.
  std::lock_guard<std::mutex> lock(mutex_);
  const auto ours_or_free = [&](const std::string& file) {
    const auto stamp = file_stamp(file);
    return !stamp || saved_files_.count(*stamp) > 0;
  };
  for (int n = 1;; ++n) {
    const std::string path = folder + "/current" + (n == 1 ? std::string() : "_" + std::to_string(n)) + ".safetensors";
    if (ours_or_free(path) && ours_or_free(checkpoint_state_path(path))) return path;
  }
}

TrainSnapshot TrainSession::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snap_;
}

uint64_t TrainSession::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snap_.version;
}

bool TrainSession::active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snap_.state == TrainState::Loading || snap_.state == TrainState::Running || snap_.state == TrainState::Paused;
}

// [SECTION] Worker

// The worker thread's own state: the data, the trainer and the run over it (null until started).
struct TrainSession::Worker {
  std::shared_ptr<Run> run;
  RunData data;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<TrainingRun> training_run;
  bool mae = false;       // the objective is MAE: a loss, no accuracy
  bool training = false;  // steps are due (not stopped, finished or failed)
};

void TrainSession::worker_fail(Worker& w, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  snap_.state = TrainState::Failed;
  snap_.error = why;
  snap_.message = why;
  ++snap_.version;
  w.training = false;
}

void TrainSession::publish_probe(Worker& w) {
  ProbeResult p = compute_probe(*w.trainer, w.data);
  std::lock_guard<std::mutex> lock(mutex_);
  p.maps.step = w.trainer->position().step;
  const size_t heads = p.entropy.size();
  snap_.entropy.resize(heads);
  snap_.distance.resize(heads);
  snap_.roles.resize(heads);
  snap_.stat_steps.push_back(p.maps.step);
  for (size_t h = 0; h < heads; ++h) {
    snap_.entropy[h].push_back(p.entropy[h]);
    snap_.distance[h].push_back(p.distance[h]);
    for (int r = 0; r < kHeadRoles; ++r) snap_.roles[h][r].push_back(p.roles[h][r]);
  }
  snap_.probe = std::move(p.maps);
  ++snap_.version;
}

// The trainer for the settings' objective, and the record's and the first message's words for it
// (the record `vitlens train` writes for the same data).
std::string TrainSession::make_trainer(Worker& w, nlohmann::json& record) {
  const TrainSettings& s = w.run->settings;
  const RunData& data = w.data;
  const VitConfig config = config_of(s);
  if (is_photo_data(s.data)) {
    w.mae = true;
    w.trainer = std::make_unique<Trainer>(std::make_unique<MaeObjective>(
        config, recipe_of(s), mae_options_of(s), &data.photos.train, data.eval_count > 0 ? &data.photos.val : nullptr));
    record["objective"] = "mae";
    record["photo_dir"] = data.photos.dir;
    record["train_photos"] = data.train_count;
    record["val_photos"] = data.eval_count;
    record["skipped_files"] = data.photos.report.skipped;
    record["crops_per_photo"] = s.crops_per_photo;  // the epoch's length (not in the MAE shape)
    return "MAE: training " + std::to_string(w.trainer->objective().layout().total) + " parameters (encoder " +
           std::to_string(w.trainer->objective_as<MaeObjective>().net().offsets().encoder_total) + ") on " +
           std::to_string(data.train_count) + " photos of " + data.photos.dir + " (" + std::to_string(data.eval_count) +
           " held out)" + left_out(data.photos.report);
  }
  w.trainer = std::make_unique<Trainer>(std::make_unique<ClassifyObjective>(
      config, recipe_of(s), &data.train, data.eval_count > 0 ? &data.eval : nullptr));
  record["train_images"] = data.train_count;
  record["eval_images"] = data.eval_count;
  record["class_names"] = data.train.class_names;
  return "training " + std::to_string(w.trainer->objective().layout().total) + " parameters on " +
         std::to_string(data.train_count) + " images" + left_out(data.folder_report);
}

// The run's hooks: each step's loss (and accuracy) and each evaluation go into the snapshot;
// an evaluation is cancelled by stop or quit.
RunHooks TrainSession::worker_hooks(Worker& w) {
  RunHooks hooks;
  hooks.save = [](const Trainer& t, const std::string& path, const nlohmann::json& r) { save_checkpoint(t, path, r); };
  hooks.on_step = [this, &w](const StepReport& r, const RunWindow&) {
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.step = r.step;
    snap_.epoch = r.epoch;
    snap_.seconds = w.training_run->seconds();
    snap_.loss.push_back(static_cast<float>(r.loss));
    if (!w.mae) snap_.accuracy.push_back(static_cast<float>(r.accuracy));
    ++snap_.version;
  };
  hooks.on_eval = [this, &w](const StepReport& r, const EvalReport& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.eval_steps.push_back(r.step);
    snap_.eval_loss.push_back(static_cast<float>(e.loss));
    if (!w.mae) snap_.eval_accuracy.push_back(static_cast<float>(e.accuracy));
    ++snap_.version;
  };
  hooks.keep_going = [this, &w](float) {
    std::lock_guard<std::mutex> lock(mutex_);
    return !(w.run->quit || w.run->stop);
  };
  return hooks;
}

// Reads the data, makes the trainer and the run, and publishes step 0.
void TrainSession::worker_start(Worker& w) {
  const TrainSettings& s = w.run->settings;
  try {
    w.data = load_run_data(s);
    nlohmann::json record;
    record["data"] = s.data;
    record["limit"] = s.limit;
    record["val_split"] = val_split_of(s);
    record["img_size"] = image_side(s);
    record["eval_set"] = w.data.eval_name;
    record["training_ops"] = train::train_ops_isa();  // as `vitlens train` records it
    record["sgemm_k_block"] = train::train_ops_k_block();
    const std::string started_message = make_trainer(w, record);
    RunSettings settings;  // no log, no checkpoint of its own: the window saves on request
    settings.eval_name = w.data.eval_name;
    settings.eval_every = s.eval_every;
    w.training_run = std::make_unique<TrainingRun>(*w.trainer, std::move(record), settings, worker_hooks(w));
    // Step 0's probe (the initial weights' maps, the start of every curve) goes in before the state
    // leaves Loading: a snapshot that shows the run started always has it.
    publish_probe(w);
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.state = w.run->pause ? TrainState::Paused : TrainState::Running;
    snap_.mae = w.mae;
    snap_.train_images = w.data.train_count;
    snap_.eval_images = w.data.eval_count;
    snap_.eval_name = w.data.eval_name;
    snap_.parameters = static_cast<int64_t>(w.trainer->objective().layout().total);
    snap_.total_steps = w.trainer->total_steps();
    snap_.steps_per_epoch = w.trainer->steps_per_epoch();
    snap_.message = started_message;
    ++snap_.version;
    w.training = true;
  } catch (const std::exception& e) {
    worker_fail(w, e.what());
  }
}

void TrainSession::worker_save(Worker& w, uint64_t id, const std::string& path) {
  std::string error;
  if (!w.training_run) {
    error = "no model to save: the run did not start";
  } else {
    try {
      {
        // The window's loss curve goes with the weights (a checkpoint alone then shows how the run
        // went; the viewer's tests read it).
        std::lock_guard<std::mutex> lock(mutex_);
        put_train_losses(w.training_run->record(), snap_.loss);
      }
      // Not into a folder another vitlens process is training or saving in (a `vitlens train` run
      // folder: one writer a folder, whatever the file's name); the claim is held for the save. A
      // missing folder is the save's to report.
      std::error_code ec;
      if (path.empty()) throw Error("no file name given for the checkpoint (nothing was saved)");
      if (path.back() == '/' || std::filesystem::is_directory(path, ec))
        throw Error(path + ": is a folder; a checkpoint needs a file name, such as " +
                    (std::filesystem::path(path) / "model.safetensors").lexically_normal().string() + " (nothing was saved)");
      const std::string folder = parent_dir(path);
      std::optional<FolderClaim> claim;
      if (std::filesystem::is_directory(folder, ec)) {
        claim.emplace(folder);
        // A save interrupted here before (another run's, or this window's) is put in place first,
        // so the check below sees every checkpoint the folder holds.
        tidy_output_dir(folder);
      }
      const std::array<std::string, 2> files{path, checkpoint_state_path(path)};
      std::array<std::optional<std::string>, 2> before;
      for (size_t i = 0; i < files.size(); ++i) {
        before[i] = file_stamp(files[i]);
        std::lock_guard<std::mutex> lock(mutex_);
        if (before[i] && saved_files_.count(*before[i]) == 0)
          throw Error(files[i] + ": exists and is not a checkpoint this window saved; vitlens replaces no file it did "
                                 "not write: choose another name (nothing was saved)");
      }
      // The files at the names that changed during the save are this window's (the folder is
      // claimed), also those a save that failed past its commit point put in place.
      const auto note_written = [&] {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i = 0; i < files.size(); ++i)
          if (const auto now = file_stamp(files[i]); now && now != before[i]) saved_files_.insert(*now);
      };
      try {
        w.training_run->save(path);
      } catch (const Error&) {
        if (claim) {
          try {
            tidy_output_dir(folder);  // a committed group's remaining file, put in place now
          } catch (const Error&) {
            // the next save's tidy tries again
          }
        }
        note_written();
        throw;
      }
      note_written();
      std::lock_guard<std::mutex> lock(mutex_);
      const int64_t step = w.trainer->position().step;
      if (folder == temporary_folder()) {
        temporary_saved_ = path;
        temporary_step_ = step;
        temporary_run_ = run_serial_;
        temporary_covered_ = false;
      } else if (temporary_run_ == run_serial_ && step >= temporary_step_) {
        temporary_covered_ = true;  // a Save elsewhere holds these weights or later ones
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_save_id_ = id;
    if (!error.empty()) save_errors_[id] = error;
    if (error.empty()) {
      snap_.checkpoint = path;
      snap_.message = "saved step " + std::to_string(w.trainer->position().step) + " to " + path;
    } else {
      snap_.message = "Save failed: " + error;
    }
    ++snap_.version;
  }
  saved_.notify_all();
}

// One training step and whatever falls due after it (the run's evaluation, the probe).
void TrainSession::worker_step(Worker& w) {
  try {
    const StepReport r = w.training_run->step();
    const bool finished = w.trainer->finished();
    if (r.step % w.run->settings.probe_every == 0 || finished) publish_probe(w);
    if (finished) {
      std::lock_guard<std::mutex> lock(mutex_);
      w.training = false;
      snap_.state = TrainState::Finished;
      snap_.message = "finished " + std::to_string(r.step) + " steps";
      ++snap_.version;
    }
  } catch (const std::exception& e) {
    worker_fail(w, e.what());
  }
}

void TrainSession::worker_main(std::shared_ptr<Run> run) {
  Worker w;
  w.run = run;
  worker_start(w);
  for (;;) {
    uint64_t save_id = 0;
    std::string save_path;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return run->quit || run->stop || !run->saves.empty() || (w.training && !run->pause); });
      if (!run->saves.empty()) {
        save_id = run->saves.front().first;
        save_path = run->saves.front().second;
        run->saves.pop_front();
      } else if (run->quit) {
        break;
      } else if (run->stop) {
        run->stop = false;
        if (w.training) {
          w.training = false;
          snap_.state = TrainState::Stopped;
          snap_.message = "stopped at step " + std::to_string(snap_.step);
          ++snap_.version;
        }
        continue;
      }
    }
    if (save_id != 0) worker_save(w, save_id, save_path);
    else worker_step(w);
  }
}

}  // namespace vitlens::viewer
