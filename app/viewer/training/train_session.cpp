// TrainSession (see train_session.hpp): one worker thread per run. The worker owns the data and the
// trainer (a classifier's Trainer, or MaeTrainer for photos); between two steps it serves saves,
// honours pause/stop, evaluates and refreshes the probe.
// Index:
//   [SECTION] Settings
//   [SECTION] Data and probe (worker side)
//   [SECTION] Commands (UI side)
//   [SECTION] Worker
#include "training/train_session.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>

#include <opencv2/core.hpp>

#include "control/attention_stats.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "core/train/mae_train.hpp"
#include "core/render/maps.hpp"
#include "models/model_io.hpp"
#include "core/train/train_ops.hpp"
#include "core/train/trainer.hpp"

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

// The whole-number settings with the ranges `vitlens train`'s flags accept; set_train_option parses
// them and check_train_settings re-checks them, since the window's fields write them directly.
struct IntSetting {
  const char* key;
  int TrainSettings::*member;
  long long lo, hi;
};
const IntSetting kIntSettings[] = {
    {"limit", &TrainSettings::limit, 0, 100000000},
    {"depth", &TrainSettings::depth, 1, 64},
    {"embed-dim", &TrainSettings::embed_dim, 4, 1024},
    {"heads", &TrainSettings::heads, 1, 64},
    {"patch", &TrainSettings::patch, 1, 64},
    {"batch", &TrainSettings::batch, 1, 4096},
    {"epochs", &TrainSettings::epochs, 1, 10000},
    {"crop-pad", &TrainSettings::crop_pad, 0, 16},
    {"threads", &TrainSettings::threads, 0, 256},
    {"img-size", &TrainSettings::img_size, 4, 1024},
    {"probe-every", &TrainSettings::probe_every, 1, 1000000},
    {"eval-every", &TrainSettings::eval_every, 0, 100000000},
    {"decoder-dim", &TrainSettings::decoder_dim, 4, 1024},
    {"decoder-depth", &TrainSettings::decoder_depth, 1, 16},
    {"decoder-heads", &TrainSettings::decoder_heads, 1, 64},
    {"crops-per-photo", &TrainSettings::crops_per_photo, 1, 100000},
};

std::string range_text(const IntSetting& f) {
  return "[" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]";
}

VitConfig config_of(const TrainSettings& s) {
  VitConfig c;
  if (is_photo_data(s.data)) {  // as `vitlens train --data photos[:DIR]` names its encoder
    c.name = "vitlens-mae";
    c.description = "ViT encoder trained in the vitlens viewer by masked patch prediction (MAE) on the photos in " +
                    photo_data_dir(s.data);
  } else {
    c.name = "vitlens-trained";
    c.description = "ViT trained in the vitlens viewer on " + s.data;
  }
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
  r.drop_path = s.drop_path;
  r.augment = s.augment;
  r.crop_pad = s.crop_pad;
  r.seed = s.seed;
  r.threads = s.threads;
  if (is_photo_data(s.data)) {
    // As the CLI's MAE recipe: no labels to smooth (the classifier's default smoothing is ignored);
    // the random crops are the augmentation, flipped unless turned off.
    r.label_smoothing = 0.0;
    r.augment = r.flip = s.flip_crops;
  }
  return r;
}

MaeOptions mae_options_of(const TrainSettings& s) {
  MaeOptions o;
  o.shape.mask_ratio = s.mask_ratio;
  o.shape.decoder_dim = s.decoder_dim;
  o.shape.decoder_depth = s.decoder_depth;
  o.shape.decoder_heads = s.decoder_heads;
  o.crops_per_photo = s.crops_per_photo;
  return o;
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
  for (const IntSetting& field : kIntSettings)
    if (key == field.key) return int_option(s.*field.member, field.lo, field.hi);
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
  if (key == "drop-path") return real_option(s.drop_path);
  if (key == "mask-ratio") return real_option(s.mask_ratio);
  if (key == "val-split") return real_option(s.val_split);
  if (key == "augment") {
    if (value != "on" && value != "off") return key + "=" + value + ": expected on or off";
    s.augment = s.flip_crops = value == "on";
    return "";
  }
  if (key == "out") {
    if (value.empty()) return "out= needs a folder";
    s.out = value;
    return "";
  }
  return "unknown training option '" + key +
         "' (known: limit, depth, embed-dim, heads, patch, mlp-ratio, batch, epochs, lr, weight-decay, warmup, "
         "label-smoothing, drop-path, val-split, augment, crop-pad, seed, threads, img-size, probe-every, eval-every, out, mask-ratio, "
         "decoder-dim, decoder-depth, decoder-heads, crops-per-photo)";
}

void put_train_losses(nlohmann::json& record, const std::vector<float>& losses) {
  const size_t skip = losses.size() > kMaxSavedLosses ? losses.size() - kMaxSavedLosses : 0;
  record["train_loss"] = std::vector<float>(losses.begin() + static_cast<std::ptrdiff_t>(skip), losses.end());
  if (skip > 0) record["train_loss_first_step"] = static_cast<int64_t>(skip) + 1;
  else record.erase("train_loss_first_step");
}

std::string check_train_settings(const TrainSettings& s) {
  if (s.data.empty())
    return "no data: give 'fashion-mnist', a folder with one subfolder of images per class, or photos[:DIR]";
  for (const IntSetting& f : kIntSettings)
    if (s.*f.member < f.lo || s.*f.member > f.hi)
      return std::string(f.key) + " must be in " + range_text(f) + ", got " + std::to_string(s.*f.member);
  if (s.embed_dim % s.heads != 0)
    return "embed-dim " + std::to_string(s.embed_dim) + " is not divisible by heads " + std::to_string(s.heads);
  if (image_side(s) % s.patch != 0)
    return "the image size " + std::to_string(image_side(s)) + " is not a multiple of patch " + std::to_string(s.patch);
  if (!(s.mlp_ratio > 0.0 && s.mlp_ratio <= 16.0)) return "mlp-ratio must be in (0, 16]";
  if (!(val_split_of(s) < 1.0)) return "val-split must be in [0, 1)";
  const VitConfig config = config_of(s);
  const std::string shape = config.validate();
  if (!shape.empty()) return "model shape: " + shape;
  if (is_photo_data(s.data)) {  // the checks `vitlens train --data photos` makes, with its words
    if (!(s.mask_ratio > 0.0 && s.mask_ratio < 1.0))
      return "mask-ratio must be in (0, 1), got " + std::to_string(s.mask_ratio);
    if (s.decoder_dim % s.decoder_heads != 0)
      return "decoder-dim " + std::to_string(s.decoder_dim) + " is not divisible by decoder-heads " +
             std::to_string(s.decoder_heads);
    if (s.drop_path != 0.0) return "drop-path applies to classifiers, not to photos";
    const std::string mae = mae_options_of(s).validate(config);
    if (!mae.empty()) return "model shape: " + mae;
  }
  return recipe_of(s).validate();
}

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
  ImageSet all;
  if (s.data == "fashion-mnist") {
    all = load_fashion_mnist(default_fashion_mnist_dir(), true, s.limit);
    if (split <= 0.0) {
      d.train = std::move(all);
      d.eval = load_fashion_mnist(default_fashion_mnist_dir(), false, s.limit);
      d.eval_name = "test";
    }
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(s.data, ec))
      throw Error(s.data + ": the training data is neither 'fashion-mnist', a folder nor photos[:DIR]");
    all = load_image_folder(s.data, s.img_size, &d.folder_report);
    if (s.limit > 0 && all.size() > s.limit) {
      all.pixels.resize(static_cast<size_t>(s.limit) * 3 * all.height * all.width);
      all.labels.resize(static_cast<size_t>(s.limit));
    }
  }
  if (d.eval_name.empty()) {
    if (split > 0.0) {
      split_holdout(all, split, s.seed, &d.train, &d.eval);
      d.eval_name = "val";
    } else {
      d.train = std::move(all);
    }
  }
  d.train_count = d.train.size();
  d.eval_count = d.eval.size();
  if (d.eval_count > 0) probe_from(d.eval, "image 0 of the " + d.eval_name + " set");
  else probe_from(d.train, "image 0 of the training set");
  return d;
}

// The worker's trainer for either objective (the data decides which): what the loop asks of it.
struct RunTrainer {
  std::unique_ptr<Trainer> classifier;  // fashion-mnist or a folder
  std::unique_ptr<MaeTrainer> mae;      // photos[:DIR]
  const ImageSet* eval = nullptr;       // the classifier's evaluation set (null: none)

  StepReport step() { return mae ? mae->step() : classifier->step(); }
  bool finished() const { return mae ? mae->finished() : classifier->finished(); }
  const TrainPosition& position() const { return mae ? mae->position() : classifier->position(); }
  int64_t total_steps() const { return mae ? mae->total_steps() : classifier->total_steps(); }
  int64_t steps_per_epoch() const { return mae ? mae->steps_per_epoch() : classifier->steps_per_epoch(); }
  int64_t parameters() const {
    return static_cast<int64_t>(mae ? mae->net().layout().total : classifier->net().layout().total);
  }
  bool has_eval() const { return mae ? mae->has_eval() : eval != nullptr; }
  EvalReport evaluate(const std::function<bool(float)>& progress) {
    return mae ? mae->evaluate(progress) : classifier->evaluate(*eval, progress);
  }
  void save(const std::string& path, const nlohmann::json& record) const {
    if (mae) save_mae_checkpoint(*mae, path, record);
    else save_checkpoint(*classifier, path, record);
  }
  // The current weights as an ordinary VitModel: for MAE the encoder alone, the tensors its
  // checkpoint's model file holds, so the probe shows what opening that file would show.
  VitModel model() const {
    if (!classifier) {
      TensorMap encoder;
      for (auto& [name, tensor] : layout_tensors(mae->net().layout(), mae->net().params))
        if (!train::is_decoder_param(name)) encoder[name] = std::move(tensor);
      return model_from_tensors(mae->config(), encoder, "the training weights");
    }
    return model_from_tensors(classifier->config(), layout_tensors(classifier->net().layout(), classifier->net().params),
                              "the training weights");
  }
};

struct ProbeResult {
  ProbeMaps maps;
  std::vector<float> entropy, distance;               // (H)
  std::vector<std::array<float, kHeadRoles>> roles;   // (H)
};

// The probe's maps and statistics for the trainer's current weights: the parameters are copied
// into an ordinary VitModel and go through the same forward, maps, statistics and role scores as
// an opened model file, so the window shows what `vitlens view` would show for a saved checkpoint.
ProbeResult compute_probe(const RunTrainer& trainer, const RunData& data) {
  const VitModel model = trainer.model();
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
  RunTrainer trainer;
  bool started = false;  // the trainer exists
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
    ProbeResult p = compute_probe(trainer, data);
    std::lock_guard<std::mutex> lock(mutex_);
    p.maps.step = trainer.position().step;
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
    if (!trainer.has_eval()) return;
    bool cancelled = false;
    const EvalReport e = trainer.evaluate([&](float done) {
      cancelled = !keep_going(done);
      return !cancelled;
    });
    if (cancelled) return;  // a partial pass is not a point on the curve
    if (!trainer.mae) record[data.eval_name + "_accuracy"] = e.accuracy;
    record[data.eval_name + "_loss"] = e.loss;
    std::lock_guard<std::mutex> lock(mutex_);
    snap_.eval_steps.push_back(trainer.position().step);
    snap_.eval_loss.push_back(static_cast<float>(e.loss));
    if (!trainer.mae) snap_.eval_accuracy.push_back(static_cast<float>(e.accuracy));
    ++snap_.version;
  };

  std::string started_message;
  try {
    data = load_run_data(s);
    const VitConfig config = config_of(s);
    record["data"] = s.data;
    record["limit"] = s.limit;
    record["val_split"] = val_split_of(s);
    record["img_size"] = image_side(s);
    record["eval_set"] = data.eval_name;
    record["training_ops"] = train::train_ops_isa();  // as `vitlens train` records it
    if (is_photo_data(s.data)) {  // the record `vitlens train --data photos` writes
      trainer.mae = std::make_unique<MaeTrainer>(config, recipe_of(s), mae_options_of(s), &data.photos.train,
                                                 data.eval_count > 0 ? &data.photos.val : nullptr);
      record["objective"] = "mae";
      record["photo_dir"] = data.photos.dir;
      record["train_photos"] = data.train_count;
      record["val_photos"] = data.eval_count;
      record["skipped_files"] = data.photos.report.skipped;
      record["crops_per_photo"] = s.crops_per_photo;  // the epoch's length (not in the MAE shape)
      started_message = "MAE: training " + std::to_string(trainer.parameters()) + " parameters (encoder " +
                        std::to_string(trainer.mae->net().offsets().encoder_total) + ") on " +
                        std::to_string(data.train_count) + " photos of " + data.photos.dir + " (" +
                        std::to_string(data.eval_count) + " held out)";
      started_message += left_out(data.photos.report);
    } else {
      trainer.classifier =
          std::make_unique<Trainer>(config, recipe_of(s), &data.train, data.eval_count > 0 ? &data.eval : nullptr);
      trainer.eval = data.eval_count > 0 ? &data.eval : nullptr;
      record["train_images"] = data.train_count;
      record["eval_images"] = data.eval_count;
      record["class_names"] = data.train.class_names;
      started_message = "training " + std::to_string(trainer.parameters()) + " parameters on " +
                        std::to_string(data.train_count) + " images" + left_out(data.folder_report);
    }
    started = true;
    // Step 0's probe (the initial weights' maps, the start of every curve) goes in before the state
    // leaves Loading: a snapshot that shows the run started always has it.
    refresh_probe();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      snap_.state = run->pause ? TrainState::Paused : TrainState::Running;
      snap_.mae = trainer.mae != nullptr;
      snap_.train_images = data.train_count;
      snap_.eval_images = data.eval_count;
      snap_.eval_name = data.eval_name;
      snap_.parameters = trainer.parameters();
      snap_.total_steps = trainer.total_steps();
      snap_.steps_per_epoch = trainer.steps_per_epoch();
      snap_.message = started_message;
      ++snap_.version;
    }
    training = true;
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
      if (!started) {
        error = "no model to save: the run did not start";
      } else {
        try {
          record["seconds"] = seconds;
          {
            // The window's loss curve goes with the weights (a checkpoint alone then shows how the
            // run went; the viewer's tests read it).
            std::lock_guard<std::mutex> lock(mutex_);
            put_train_losses(record, snap_.loss);
          }
          trainer.save(save_path, record);
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
          snap_.message = "saved step " + std::to_string(trainer.position().step) + " to " + save_path;
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
      const StepReport r = trainer.step();
      seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      const bool finished = trainer.finished();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        snap_.step = r.step;
        snap_.epoch = r.epoch;
        snap_.seconds = seconds;
        snap_.loss.push_back(static_cast<float>(r.loss));
        if (!trainer.mae) snap_.accuracy.push_back(static_cast<float>(r.accuracy));
        ++snap_.version;
      }
      const bool epoch_end = trainer.position().position == 0 || finished;
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
