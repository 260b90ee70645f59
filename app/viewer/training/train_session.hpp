#pragma once
// The viewer's Train window without the window: a TrainSession owns a Trainer (over a classifier
// objective, or for data "photos[:DIR]" a masked-autoencoder one) on one worker thread and takes commands
// (start, pause, resume, stop, save) from the UI or a script; the UI reads a snapshot (curves, the
// probe image's per-head maps and statistics) under a mutex and never waits for a training step.
// No ImGui, GLFW or OpenGL here: the tests drive it directly.
//
// Legend: H = heads, gh, gw = the probe's patch grid, S = steps recorded so far.
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/eigen.hpp"
#include "core/render/head_roles.hpp"
#include "core/train/training_run.hpp"

namespace vitlens::viewer {

// What a run trains on and how: the model shape, the recipe and the data, as `vitlens train`
// takes them (same defaults), plus how often the probe and the validation curve refresh.
struct TrainSettings {
  std::string data = "fashion-mnist";  // "fashion-mnist", an ImageFolder tree, or "photos[:DIR]" (MAE)
  int limit = 0;                       // > 0: only the first N training (and test) images / photos
  int depth = 4, embed_dim = 48, heads = 4, patch = 4;
  double mlp_ratio = 2.0;
  int batch = 128, epochs = 24;
  double lr = 2e-3, weight_decay = 0.05, warmup = 0.5, label_smoothing = 0.1, drop_path = 0.0;
  double val_split = -1.0;             // < 0: as the CLI (0 for Fashion-MNIST = the test set, else 0.1)
  bool augment = true;                 // random crop and flip, as the CLI's default
  int crop_pad = 1;                    // zero padding of the random crop (0 = flips only)
  uint64_t seed = 0;
  int threads = 0;                     // 0 = one per core
  int img_size = 32;                   // folder images are resized to it, photo crops too (Fashion-MNIST: 28)
  // Masked patch prediction (photos only), `vitlens train`'s flags and defaults. `augment`,
  // `label-smoothing` and `drop-path` are the classifier's; for photos the key augment=on|off sets flip_crops, as
  // the CLI's --augment / --no-augment do there.
  bool flip_crops = true;              // photos: flip the random crops half of the time
  double mask_ratio = 0.75;            // share of patches hidden from the encoder, in (0, 1)
  int decoder_dim = 32, decoder_depth = 1, decoder_heads = 4;  // the MAE decoder (Dd divisible by its heads)
  int crops_per_photo = 16;            // an epoch = every training photo this many times
  int probe_every = 10;                // steps between probe refreshes (maps, entropy, distance, roles)
  int eval_every = 0;                  // steps between validation passes; 0 = at the end of each epoch
  std::string out;                     // where `open` saves; empty: a folder under the temp directory
};

// Sets one `key=value` (the script's and the window's names: limit, depth, embed-dim, heads, patch,
// mlp-ratio, batch, epochs, lr, weight-decay, warmup, label-smoothing, drop-path, val-split, augment, crop-pad, seed,
// threads, img-size, probe-every, eval-every, out, and for photos mask-ratio, decoder-dim,
// decoder-depth, decoder-heads, crops-per-photo). Returns "" or one line saying what is wrong.
std::string set_train_option(TrainSettings& settings, const std::string& key, const std::string& value);
// Every value in range and consistent (the same checks `vitlens train` makes); "" when usable.
std::string check_train_settings(const TrainSettings& settings);

// The window's per-step batch losses (step 1 first) as a Save writes them into the checkpoint's
// training record: "train_loss", and beyond kMaxSavedLosses steps only the latest kMaxSavedLosses
// with "train_loss_first_step" naming the step of the first one (otherwise absent: step 1). At
// about 10 bytes a loss this keeps the record near 1 MB, far below the 16 MiB header the Model
// menu reads, however long a run goes.
constexpr size_t kMaxSavedLosses = 100000;
void put_train_losses(nlohmann::json& record, const std::vector<float>& losses);

enum class TrainState { Idle, Loading, Running, Paused, Stopped, Finished, Failed };
const char* train_state_name(TrainState state);  // "idle", "loading", "running", ...

// The fixed probe image's latest maps: attention received by each patch, last layer.
struct ProbeMaps {
  int64_t step = -1;                 // the step they were computed after; -1: none yet
  int layer = 0;
  int grid_h = 0, grid_w = 0;        // gh, gw
  int image_h = 0, image_w = 0;
  std::vector<float> image_rgb;      // (image_h, image_w, 3) the probe in [0, 1]
  std::vector<MatRM> heads;          // H x (gh, gw)
  int label = -1;                    // its class (-1 for a photo)
  std::string what;                  // which image: "image 0 of the test set", "held-out photo a.jpg, centre crop"
};

// Everything the window shows, copied out under the session's mutex.
struct TrainSnapshot {
  uint64_t version = 0;              // changes whenever anything below changes
  TrainState state = TrainState::Idle;
  std::string error;                 // one line when state == Failed (or a failed save)
  std::string message;               // the last thing that happened ("saved to ...")
  std::string data;                  // as given
  bool mae = false;                  // masked autoencoder (photos): a loss, no accuracy (its vectors stay empty)
  int train_images = 0, eval_images = 0;
  std::string eval_name;             // "test" or "val"
  int64_t parameters = 0;
  int64_t step = 0, total_steps = 0, steps_per_epoch = 0;
  int epoch = 0, epochs = 0;
  double seconds = 0.0;              // training time, loading excluded
  std::vector<float> loss, accuracy;  // (S) per training step: the batch's loss and accuracy (MAE: loss only)
  std::vector<int64_t> eval_steps;    // validation passes: step, loss, accuracy
  std::vector<float> eval_loss, eval_accuracy;
  ProbeMaps probe;
  // Probe statistics over training, one entry per probe refresh, last layer, per head.
  std::vector<int64_t> stat_steps;                           // (R)
  std::vector<std::vector<float>> entropy, distance;         // H x (R)
  std::vector<std::array<std::vector<float>, kHeadRoles>> roles;  // H x roles x (R): head_role_scores lifts
  std::string checkpoint;             // the last file saved ("" = none)
};

class TrainSession {
 public:
  TrainSession();
  ~TrainSession();  // stops the run and joins the worker
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  // Starts a new run (a running one is stopped first). Settings are checked here: a bad value is
  // returned as one line and nothing starts. A bad data path is found on the worker (it reads the
  // data there) and shows as state Failed with the error.
  std::string start(const TrainSettings& settings);
  void pause();
  void resume();
  void stop();  // the trainer stays: its weights can still be saved or opened

  // Writes a checkpoint (the model plus its .state file, as `vitlens train`; for MAE the model file is
  // the encoder, as the CLI's MAE checkpoints) between two steps. A file at either name is
  // replaced only when this window saved it and it is unchanged since; any other (a user's photo,
  // a checkpoint from another run or session) is refused and nothing is saved.
  // request_save returns at once with an id for save_finished (0 when no run has started: the
  // snapshot's message says so); save waits and returns "" or the error.
  uint64_t request_save(const std::string& path);
  bool save_finished(uint64_t id, std::string& error);  // true once done; `error` "" or why it failed
  std::string save(const std::string& path);
  // Where "open in the main view" saves: settings.out (or <temp>/vitlens-train-<pid>) +
  // "/current.safetensors" (current_2, _3, ... while a file this window did not save has the
  // name), the folder created; "" and `error` set when it cannot be.
  std::string viewing_path(std::string& error) const;
  // The temporary folder viewing_path uses when the run has no out folder. On destruction its
  // checkpoints this session saved are removed, unless no Save elsewhere holds those weights:
  // unsaved_temporary() then names the file that stays ("" when nothing stays).
  static std::string temporary_folder();
  static std::string temporary_parent();                       // $TMPDIR when usable, else /tmp
  static bool in_a_temporary_folder(const std::string& path);  // any viewer's, by its name
  std::string unsaved_temporary() const;

  TrainSnapshot snapshot() const;
  uint64_t version() const;  // cheap: whether a new snapshot is worth copying
  bool active() const;       // loading, running or paused: the UI should redraw now and then

 private:
  struct Run;
  struct Worker;  // the worker thread's data, trainer and run (train_session.cpp)
  void worker_main(std::shared_ptr<Run> run);
  void worker_start(Worker& w);
  std::string make_trainer(Worker& w, nlohmann::json& record);
  RunHooks worker_hooks(Worker& w);
  void worker_save(Worker& w, uint64_t id, const std::string& path);
  void worker_step(Worker& w);
  void worker_fail(Worker& w, const std::string& why);
  void publish_probe(Worker& w);
  void join();

  mutable std::mutex mutex_;
  std::condition_variable wake_;      // worker: commands arrived / unpaused
  std::condition_variable saved_;     // save(): a save finished
  TrainSnapshot snap_;
  std::shared_ptr<Run> run_;
  std::thread thread_;
  uint64_t next_save_id_ = 1, done_save_id_ = 0;
  std::map<uint64_t, std::string> save_errors_;  // finished saves not yet asked about: id -> error
  std::set<std::string> saved_files_;  // file_stamp of each file a save wrote: these may be replaced
  uint64_t run_serial_ = 0;            // runs started
  std::string temporary_saved_;        // the last checkpoint saved into temporary_folder() ("" = none)
  int64_t temporary_step_ = 0;
  uint64_t temporary_run_ = 0;
  bool temporary_covered_ = true;      // a Save elsewhere of that run holds its step or a later one
};

}  // namespace vitlens::viewer
