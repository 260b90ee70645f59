// TrainSession (see train_session.hpp): one worker thread per run. The worker owns the data and the
// Trainer; between two steps it serves saves, honours pause/stop, evaluates and refreshes the probe.
// Index:
//   [SECTION] Settings
//   [SECTION] Data and probe (worker side)
//   [SECTION] Commands (UI side)
//   [SECTION] Worker
#include "train_session.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include <opencv2/core.hpp>

#include "attention_stats.hpp"
#include "vitlens/checkpoint.hpp"
#include "vitlens/dataset.hpp"
#include "vitlens/error.hpp"
#include "vitlens/image.hpp"
#include "vitlens/maps.hpp"
#include "vitlens/model_io.hpp"
#include "vitlens/trainer.hpp"

namespace vitlens::viewer {

// [SECTION] Settings

const char* train_state_name(TrainState state) {
  switch (state) {
    case TrainState::Idle: return "idle";
    case TrainState::Loading: return "loading";
    case TrainState::Running: return "running";
    case TrainState::Paused: return "paused";
    case TrainState::Stopped: return "stopped";
    case TrainState::Finished: return "finished";
    case TrainState::Failed: return "failed";
  }
  return "?";
}

namespace {

bool whole_int(const std::string& text, long long lo, long long hi, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool finite_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  out = v;
  return true;
}

int image_side(const TrainSettings& s) { return s.data == "fashion-mnist" ? 28 : s.img_size; }
double val_split_of(const TrainSettings& s) {
  return s.val_split >= 0.0 ? s.val_split : (s.data == "fashion-mnist" ? 0.0 : 0.1);
}

VitConfig config_of(const TrainSettings& s) {
  VitConfig c;
  c.name = "vitlens-trained";
  c.description = "ViT trained in the vitlens viewer on " + s.data;
  c.patch_size = s.patch;
  c.embed_dim = s.embed_dim;
  c.num_heads = s.heads;
  c.depth = s.depth;
  c.img_h = c.img_w = image_side(s);
  c.class_token = true;
  c.mlp_ratio = s.mlp_ratio;
  c.qkv_bias = true;
  return c;
}

Recipe recipe_of(const TrainSettings& s) {
  Recipe r;
  r.epochs = s.epochs;
  r.batch = s.batch;
  r.lr = s.lr;
  r.min_lr = std::min(1e-5, s.lr);
  r.weight_decay = s.weight_decay;
  r.warmup_epochs = s.warmup;
  r.label_smoothing = s.label_smoothing;
  r.augment = s.augment;
  r.seed = s.seed;
  r.threads = s.threads;
  return r;
}

}  // namespace

std::string set_train_option(TrainSettings& s, const std::string& key, const std::string& value) {
  long long i = 0;
  double f = 0.0;
  auto int_option = [&](int& target, long long lo, long long hi) -> std::string {
    if (!whole_int(value, lo, hi, i))
      return key + "=" + value + ": expected a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    target = static_cast<int>(i);
    return "";
  };
  auto real_option = [&](double& target) -> std::string {
    if (!finite_number(value, f)) return key + "=" + value + ": expected a number";
    target = f;
    return "";
  };
  if (key == "limit") return int_option(s.limit, 0, 100000000);
  if (key == "depth") return int_option(s.depth, 1, 64);
  if (key == "embed-dim") return int_option(s.embed_dim, 4, 1024);
  if (key == "heads") return int_option(s.heads, 1, 64);
  if (key == "patch") return int_option(s.patch, 1, 64);
  if (key == "batch") return int_option(s.batch, 1, 4096);
  if (key == "epochs") return int_option(s.epochs, 1, 10000);
  if (key == "threads") return int_option(s.threads, 0, 256);
  if (key == "img-size") return int_option(s.img_size, 4, 1024);
  if (key == "probe-every") return int_option(s.probe_every, 1, 1000000);
  if (key == "eval-every") return int_option(s.eval_every, 0, 100000000);
  if (key == "seed") {
    if (!whole_int(value, 0, (1LL << 62), i)) return key + "=" + value + ": expected a whole number >= 0";
    s.seed = static_cast<uint64_t>(i);
    return "";
  }
  if (key == "mlp-ratio") return real_option(s.mlp_ratio);
  if (key == "lr") return real_option(s.lr);
  if (key == "weight-decay") return real_option(s.weight_decay);
  if (key == "warmup") return real_option(s.warmup);
  if (key == "label-smoothing") return real_option(s.label_smoothing);
  if (key == "val-split") return real_option(s.val_split);
  if (key == "augment") {
    if (value != "on" && value != "off") return key + "=" + value + ": expected on or off";
    s.augment = value == "on";
    return "";
  }
  if (key == "out") {
    if (value.empty()) return "out= needs a folder";
    s.out = value;
    return "";
  }
  return "unknown training option '" + key +
         "' (known: limit, depth, embed-dim, heads, patch, mlp-ratio, batch, epochs, lr, weight-decay, warmup, "
         "label-smoothing, val-split, augment, seed, threads, img-size, probe-every, eval-every, out)";
}

std::string check_train_settings(const TrainSettings& s) {
  if (s.data.empty()) return "no data: give 'fashion-mnist' or a folder with one subfolder of images per class";
  if (s.embed_dim % s.heads != 0)
    return "embed-dim " + std::to_string(s.embed_dim) + " is not divisible by heads " + std::to_string(s.heads);
  if (image_side(s) % s.patch != 0)
    return "the image size " + std::to_string(image_side(s)) + " is not a multiple of patch " + std::to_string(s.patch);
  if (!(s.mlp_ratio > 0.0 && s.mlp_ratio <= 16.0)) return "mlp-ratio must be in (0, 16]";
  if (!(val_split_of(s) < 1.0)) return "val-split must be in [0, 1)";
  if (s.limit < 0) return "limit must be >= 0";
  const std::string shape = config_of(s).validate();
  if (!shape.empty()) return "model shape: " + shape;
  return recipe_of(s).validate();
}

// [SECTION] Data and probe (worker side)

namespace {

struct RunData {
  ImageSet train, eval;
  std::string eval_name;  // "test", "val" or "" (no evaluation)
};

// As `vitlens train`: Fashion-MNIST evaluates on the test images unless val-split > 0; a folder
// holds out val-split of each class.
RunData load_run_data(const TrainSettings& s) {
  RunData d;
  const double split = val_split_of(s);
  ImageSet all;
  if (s.data == "fashion-mnist") {
    all = load_fashion_mnist(default_fashion_mnist_dir(), true, s.limit);
    if (split <= 0.0) {
      d.train = std::move(all);
      d.eval = load_fashion_mnist(default_fashion_mnist_dir(), false, s.limit);
      d.eval_name = "test";
      return d;
    }
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(s.data, ec))
      throw Error(s.data + ": the training data is neither 'fashion-mnist' nor a folder");
    FolderReport report;
    all = load_image_folder(s.data, s.img_size, &report);
    if (s.limit > 0 && all.size() > s.limit) {
      all.pixels.resize(static_cast<size_t>(s.limit) * 3 * all.height * all.width);
      all.labels.resize(static_cast<size_t>(s.limit));
    }
  }
  if (split > 0.0) {
    split_holdout(all, split, s.seed, &d.train, &d.eval);
    d.eval_name = "val";
  } else {
    d.train = std::move(all);
  }
  return d;
}

struct ProbeResult {
  ProbeMaps maps;
  std::vector<float> entropy, distance;               // (H)
  std::vector<std::array<float, kHeadRoles>> roles;   // (H)
};

// The probe's maps and statistics for the trainer's current weights: the parameters are copied
// into an ordinary VitModel and go through the same forward, maps, statistics and role scores as
// an opened model file, so the window shows what `vitlens view` would show for a saved checkpoint.
ProbeResult compute_probe(const Trainer& trainer, const ImageSet& set, int index) {
  const VitModel model = model_from_tensors(trainer.config(), layout_tensors(trainer.net().layout(), trainer.net().params),
                                            "the training weights");
  const int h = set.height, w = set.width;
  cv::Mat rgb(h, w, CV_32FC3);
  const float* planes = set.image(index);  // (3, H, W)
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
  out.maps.label = set.labels[static_cast<size_t>(index)];

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

TrainSession::~TrainSession() { join(); }

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

std::string TrainSession::viewing_path(std::string& error) const {
  std::string folder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run_) folder = run_->settings.out;
  }
  std::error_code ec;
  if (folder.empty())
    folder = (std::filesystem::temp_directory_path(ec) / ("vitlens-train-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    error = folder + ": cannot create the folder (" + ec.message() + ")";
    return "";
  }
  error.clear();
  return folder + "/current.safetensors";
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

void TrainSession::worker_main(std::shared_ptr<Run> run) {
  const TrainSettings& s = run->settings;
  RunData data;
  std::unique_ptr<Trainer> trainer;
  nlohmann::json record;
  bool training = false;
  double seconds = 0.0;
  using Clock = std::chrono::steady_clock;

  auto fail = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.state = TrainState::Failed;
    snap_.error = why;
    snap_.message = why;
    ++snap_.version;
    training = false;
  };
  auto keep_going = [&](float) {
    std::lock_guard<std::mutex> lock(mutex_);
    return !(run->quit || run->stop);
  };
  auto refresh_probe = [&] {
    const ImageSet& set = data.eval.size() > 0 ? data.eval : data.train;
    ProbeResult p = compute_probe(*trainer, set, 0);
    std::lock_guard<std::mutex> lock(mutex_);
    p.maps.step = trainer->position().step;
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
  };
  auto evaluate = [&] {
    if (data.eval.size() == 0) return;
    const EvalReport e = trainer->evaluate(data.eval, keep_going);
    if (e.images < data.eval.size()) return;  // cancelled: a partial pass is not a point on the curve
    record[data.eval_name + "_accuracy"] = e.accuracy;
    record[data.eval_name + "_loss"] = e.loss;
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.eval_steps.push_back(trainer->position().step);
    snap_.eval_loss.push_back(static_cast<float>(e.loss));
    snap_.eval_accuracy.push_back(static_cast<float>(e.accuracy));
    ++snap_.version;
  };

  try {
    data = load_run_data(s);
    const VitConfig config = config_of(s);
    trainer = std::make_unique<Trainer>(config, recipe_of(s), &data.train, data.eval.size() > 0 ? &data.eval : nullptr);
    record["data"] = s.data;
    record["limit"] = s.limit;
    record["val_split"] = val_split_of(s);
    record["img_size"] = image_side(s);
    record["train_images"] = data.train.size();
    record["eval_set"] = data.eval_name;
    record["eval_images"] = data.eval.size();
    record["class_names"] = data.train.class_names;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      snap_.state = run->pause ? TrainState::Paused : TrainState::Running;
      snap_.train_images = data.train.size();
      snap_.eval_images = data.eval.size();
      snap_.eval_name = data.eval_name;
      snap_.parameters = trainer->net().layout().total;
      snap_.total_steps = trainer->total_steps();
      snap_.steps_per_epoch = trainer->steps_per_epoch();
      snap_.message = "training " + std::to_string(snap_.parameters) + " parameters on " +
                      std::to_string(data.train.size()) + " images";
      ++snap_.version;
    }
    training = true;
    refresh_probe();  // step 0: the initial weights' maps, the start of every curve
  } catch (const std::exception& e) {
    fail(e.what());
  }

  for (;;) {
    uint64_t save_id = 0;
    std::string save_path;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return run->quit || run->stop || !run->saves.empty() || (training && !run->pause); });
      if (!run->saves.empty()) {
        save_id = run->saves.front().first;
        save_path = run->saves.front().second;
        run->saves.pop_front();
      } else if (run->quit) {
        break;
      } else if (run->stop) {
        run->stop = false;
        if (training) {
          training = false;
          snap_.state = TrainState::Stopped;
          snap_.message = "stopped at step " + std::to_string(snap_.step);
          ++snap_.version;
        }
        continue;
      }
    }
    if (save_id != 0) {
      std::string error;
      if (!trainer) {
        error = "no model to save: the run did not start";
      } else {
        try {
          record["seconds"] = seconds;
          save_checkpoint(*trainer, save_path, record);
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_save_id_ = save_id;
        if (!error.empty()) save_errors_[save_id] = error;
        if (error.empty()) {
          snap_.checkpoint = save_path;
          snap_.message = "saved step " + std::to_string(trainer->position().step) + " to " + save_path;
        } else {
          snap_.message = "Save failed: " + error;
        }
        ++snap_.version;
      }
      saved_.notify_all();
      continue;
    }
    // One training step, then whatever falls due after it.
    try {
      const auto t0 = Clock::now();
      const StepReport r = trainer->step();
      seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      const bool finished = trainer->finished();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        snap_.step = r.step;
        snap_.epoch = r.epoch;
        snap_.seconds = seconds;
        snap_.loss.push_back(static_cast<float>(r.loss));
        snap_.accuracy.push_back(static_cast<float>(r.accuracy));
        ++snap_.version;
      }
      const bool epoch_end = trainer->position().position == 0 || finished;
      if (epoch_end || (s.eval_every > 0 && r.step % s.eval_every == 0)) evaluate();
      if (r.step % s.probe_every == 0 || finished) refresh_probe();
      if (finished) {
        std::lock_guard<std::mutex> lock(mutex_);
        training = false;
        snap_.state = TrainState::Finished;
        snap_.message = "finished " + std::to_string(r.step) + " steps";
        ++snap_.version;
      }
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
}

}  // namespace vitlens::viewer
