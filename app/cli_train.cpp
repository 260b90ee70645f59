// `vitlens train`: a ViT from scratch -- a classifier on Fashion-MNIST or an ImageFolder tree, or a
// masked autoencoder on photos -- with a progress bar, per-epoch evaluation, atomic checkpoints, a
// JSON-lines log and bit-exact resume. The flags become an objective and a Trainer here; the run
// itself is core's TrainingRun (core/train/training_run.hpp).
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sys/stat.h>
#include <tuple>

#include "cli.hpp"
#include "models/training_checkpoint.hpp"
#include "core/base/utf8.hpp"
#include "core/data/dataset.hpp"
#include "core/io/files.hpp"
#include "core/io/paths.hpp"
#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"
#include "models/json_file.hpp"
#include "models/safetensors.hpp"
#include "core/train/train_ops.hpp"
#include "core/train/trainer.hpp"
#include "core/train/training_run.hpp"

namespace vitlens::cli {

namespace {

// A new run's model (class token unless --pool avg) and recipe (the classifier's; the MAE path
// adjusts smoothing and flips) from the flags.
VitConfig model_shape(const TrainArgs& a, int img) { return model_shape_of(a, img, a.pool == "cls"); }

Recipe recipe_from(const TrainArgs& a) {
  Recipe recipe = recipe_of_settings(a);
  recipe.shards = a.shards;
  return recipe;
}

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

// While training, Ctrl-C, SIGTERM and SIGHUP (a closed terminal or ssh session) ask the loop to
// save and stop after the current step; the handlers before (files.hpp's cleanup of temporaries)
// are back in place afterwards, for the saves that follow.
class StopOnSignals {
 public:
  StopOnSignals() {
    g_interrupted = false;
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &saved_[i]);
  }
  ~StopOnSignals() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
  }
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> saved_{};
};

// Restores a checkpoint's state into the trainer; a state that does not fit the data names the
// checkpoint.
void restore_from(Trainer& trainer, const SavedTraining& saved, const std::string& path) {
  try {
    trainer.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}


std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The data a run trains and evaluates on, and what to call it in messages and metadata.
struct ImageRunData {
  ImageSet train, eval, test;  // test empty when eval is the test set itself
  std::string name;            // "fashion-mnist" or the folder
  std::string eval_name;       // "test" or "val"
  int img_size = 0;
};

ImageRunData load_run_data(const TrainArgs& a, bool quiet) {
  LabelledData data = load_labelled_data(a.data, a.img_size, a.limit, a.val_split, a.seed, /*keep_test=*/true);
  const FolderReport& report = data.report;
  if (report.skipped > 0 && !quiet) {
    std::fprintf(stderr, "vitlens: skipped %d unreadable image(s) in %s", report.skipped, a.data.c_str());
    for (const std::string& e : report.examples) std::fprintf(stderr, "; %s", e.c_str());
    std::fprintf(stderr, "\n");
  }
  if (report.links_outside > 0 && !quiet) std::fprintf(stderr, "vitlens: %s\n", links_outside_warning(report).c_str());
  ImageRunData d;
  d.name = a.data;
  d.train = std::move(data.train);
  d.eval = std::move(data.eval);
  d.test = std::move(data.test);
  d.eval_name = data.eval_name;
  d.img_size = a.data == "fashion-mnist" ? 28 : a.img_size;
  return d;
}

// The progress line: redrawn in place on a terminal, a plain line every `every` steps otherwise.
class Progress {
 public:
  Progress(bool quiet, int64_t total_steps, int64_t steps_per_epoch)
      : quiet_(quiet), tty_(::isatty(STDERR_FILENO) != 0), total_(total_steps), per_epoch_(steps_per_epoch) {}

  void step(const StepReport& r, double loss_avg, double acc_avg, double images_per_s, double seconds_left, int epochs,
            bool show_accuracy = true) {
    if (quiet_) return;
    char acc[32] = "";
    if (show_accuracy) std::snprintf(acc, sizeof acc, "  acc %.1f%%", 100.0 * acc_avg);
    const int64_t in_epoch = (r.step - 1) % per_epoch_ + 1;
    char line[256];
    if (tty_) {
      const int width = 24, filled = static_cast<int>(width * in_epoch / per_epoch_);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.resize(static_cast<size_t>(width), '.');
      std::snprintf(line, sizeof line, "\repoch %d/%d [%s] step %lld/%lld  loss %.4f%s  %.0f img/s  left %s   ",
                    r.epoch + 1, epochs, bar.c_str(), static_cast<long long>(r.step), static_cast<long long>(total_),
                    loss_avg, acc, images_per_s, duration_text(seconds_left).c_str());
      std::fputs(line, stderr);
      std::fflush(stderr);
      dirty_ = true;
    } else if (r.step % std::max<int64_t>(1, per_epoch_ / 4) == 0 || r.step == total_) {
      std::fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f%s %.0f img/s left %s\n", r.epoch + 1, epochs,
                   static_cast<long long>(r.step), static_cast<long long>(total_), loss_avg, acc, images_per_s,
                   duration_text(seconds_left).c_str());
    }
  }

  void line(const std::string& text) {
    if (quiet_) return;
    if (dirty_) std::fputs("\n", stderr);
    dirty_ = false;
    std::fprintf(stderr, "%s\n", text.c_str());
  }

 private:
  bool quiet_, tty_;
  int64_t total_, per_epoch_;
  bool dirty_ = false;
};

// Records which build of the training ops this run uses (train_ops.hpp: AVX-512, AVX2 + FMA or
// portable; they differ in the last bits) and its SGEMM's k block, and says so in one line when a
// resumed run was trained with another build, or with another k block (a record without one was
// written before the AVX2 build's became 384, when every build's was 256): the result is then not
// bit for bit the uninterrupted run.
void record_training_ops(nlohmann::json& record, bool resumed) {
  const std::string now = train::train_ops_isa();
  const int k_block = train::train_ops_k_block();
  if (resumed && record.contains("training_ops") && record["training_ops"].is_string()) {
    // From the file: printed capped and with control characters escaped, a size only if it is one.
    const std::string then = terminal_text(capped_text(record["training_ops"].get<std::string>(), 64));
    const nlohmann::json recorded_block = record.value("sgemm_k_block", nlohmann::json(256));
    if (then != now)
      std::fprintf(stderr,
                   "vitlens: warning: this run was trained with the %s training ops and continues with the %s ones "
                   "(another CPU, or VITLENS_ISA): it will not be bit for bit the uninterrupted run\n",
                   then.c_str(), now.c_str());
    else if (recorded_block != nlohmann::json(k_block))
      std::fprintf(stderr,
                   "vitlens: warning: this run was trained with matrix products in k blocks of %s and continues with "
                   "blocks of %d (another vitlens version): it will not be bit for bit the uninterrupted run\n",
                   recorded_block.is_number_integer() ? recorded_block.dump().c_str() : "an unreadable size",
                   k_block);
  }
  record["training_ops"] = now;
  record["sgemm_k_block"] = k_block;
}

// A new run (or a resumed one moved to another folder) never replaces a checkpoint or log it did
// not continue (prepare_run_folder).
void check_run_folder(const TrainArgs& a) {
  const std::string model_path = a.out + "/last.safetensors";
  // A resume of the folder's own last.safetensors continues its run: its checkpoint and log are
  // that run's. A checkpoint of another name (a copy, a viewer's save) starts those files anew,
  // so they must be free as for a new run.
  struct stat last_st {}, resume_st {};
  const bool continues_here = !a.resume.empty() && ::stat(model_path.c_str(), &last_st) == 0 &&
                              ::stat(a.resume.c_str(), &resume_st) == 0 && last_st.st_dev == resume_st.st_dev &&
                              last_st.st_ino == resume_st.st_ino;
  if (continues_here) {
    const std::string log_path = a.out + "/log.jsonl";
    struct stat log_st {};
    if (::lstat(log_path.c_str(), &log_st) == 0 && !S_ISREG(log_st.st_mode))
      throw Error(log_path + ": is not a file (a link, a folder, ...); the run appends its log only to a file of its "
                             "own: move it away, or give another --out");
    return;
  }
  struct stat model_st {};
  const bool checkpoint_there = ::lstat(model_path.c_str(), &model_st) == 0;
  for (const std::string& path : {model_path, checkpoint_state_path(model_path), a.out + "/log.jsonl"}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    // A resume of another checkpoint writes its run's files anew, as a new run does.
    const std::string what = a.resume.empty() ? "a new run" : "a resume of " + a.resume + " (not that run's own)";
    if (checkpoint_there)
      throw Error(path + ": already exists; continue that run with --resume " + model_path + ", or give another --out (" +
                  what + " never replaces it)");
    throw Error(path + ": already exists, and there is no " + model_path + " beside it to continue from; give "
                "another --out, or remove it (" + what + " never replaces it)");
  }
}

// Claims the run folder for this process (FolderClaim) until the run ends, so that a second
// `vitlens train` into it (a new run, or a resume of the same checkpoint in another terminal) stops
// before it reads or writes anything there, instead of overwriting the other's checkpoints and
// mixing the two logs. Where no claim can be made, says so in one line and goes on.
FolderClaim claim_run_folder(const std::string& folder) {
  try {
    FolderClaim claim(folder);
    if (!claim.held())
      std::fprintf(stderr, "vitlens: warning: %s: this system gives no way to claim the run folder; a second vitlens "
                           "train into it would not be stopped\n", folder.c_str());
    return claim;
  } catch (const FolderBusy& e) {
    throw Error(std::string(e.what()) + "; wait for it to finish (a train stopped with Ctrl-C saves first), or give "
                                        "another --out");
  }
}

// The run folder, created with its parents when missing, claimed (unless `claim` holds it already: run_train claims
// a folder that exists before reading the checkpoint in it), then check_run_folder.
void prepare_run_folder(const TrainArgs& a, std::optional<FolderClaim>& claim) {
  make_missing_folder(a.out, "the run folder");
  require_writable_dir(a.out);
  if (!claim) claim.emplace(claim_run_folder(a.out));
  check_run_folder(a);
}

void check_args(const TrainArgs& a, CLI::App* cmd) {
  auto bad = [](const std::string& s) { throw UsageError(s); };
  if (a.data.empty())
    bad("--data is required: 'fashion-mnist', a folder with one subfolder per class, or photos[:DIR]");
  const bool mae = is_photo_data(a.data);
  for (const char* flag : {"--mask-ratio", "--decoder-dim", "--decoder-depth", "--decoder-heads", "--crops-per-photo"})
    if (!mae && cmd->count(flag)) bad(std::string(flag) + " applies to masked patch prediction (--data photos[:DIR])");
  if (mae) {
    if (!(a.mask_ratio > 0.0 && a.mask_ratio < 1.0))
      bad("--mask-ratio must be in (0, 1), got " + number_text(a.mask_ratio));
    if (a.decoder_dim % a.decoder_heads != 0)
      bad("--decoder-dim " + std::to_string(a.decoder_dim) + " is not divisible by --decoder-heads " +
          std::to_string(a.decoder_heads));
    if (cmd->count("--label-smoothing")) bad("--label-smoothing applies to classifiers, not to --data photos");
    if (cmd->count("--crop-pad")) bad("--crop-pad applies to classifiers; --data photos makes its own random crops");
    if (cmd->count("--pool")) bad("--pool applies to classifiers; the MAE encoder keeps its class token");
    if (cmd->count("--shards")) bad("--shards applies to classifiers; MAE runs each batch whole");
    if (cmd->count("--drop-path")) bad("--drop-path applies to classifiers, not to --data photos");
    if (!a.grad_dump.empty()) bad("--grad-dump is for classifiers; MAE gradients are checked by the test suite");
  }
  if (a.out.empty() && a.grad_dump.empty() && a.resume.empty()) bad("--out RUNDIR is required");
  for (const auto& [flag, text, limit] : {std::tuple<const char*, const std::string*, size_t>{"--name", &a.name, 64},
                                          {"--description", &a.description, 400}}) {
    if (text->size() > limit) bad(std::string(flag) + " is longer than " + std::to_string(limit) + " characters");
    for (const char ch : *text)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) bad(std::string(flag) + " contains a control character");
  }
  if (a.name.find_first_not_of(' ') == std::string::npos) bad("--name must not be empty");
  // Recorded in the checkpoint's JSON, which holds UTF-8 only: refused now, not at the first save.
  for (const auto& [flag, text] : {std::pair<const char*, const std::string*>{"--name", &a.name},
                                   {"--description", &a.description}, {"--data", &a.data}})
    if (!is_valid_utf8(*text)) bad(std::string(flag) + kNotUtf8);
  if (!(a.lr > 0.0 && a.lr <= 10.0)) bad("--lr must be in (0, 10], got " + number_text(a.lr));
  if (!(a.weight_decay >= 0.0 && a.weight_decay <= 10.0)) bad("--weight-decay must be in [0, 10]");
  if (!(a.warmup >= 0.0 && a.warmup <= a.epochs)) bad("--warmup must be in [0, --epochs] epochs");
  if (!(a.label_smoothing >= 0.0 && a.label_smoothing < 1.0)) bad("--label-smoothing must be in [0, 1)");
  if (!(a.drop_path >= 0.0 && a.drop_path < 1.0)) bad("--drop-path must be in [0, 1)");
  if (!(a.val_split >= 0.0 && a.val_split < 1.0)) bad("--val-split must be in [0, 1)");
  if (!(a.mlp_ratio > 0.0 && a.mlp_ratio <= 16.0)) bad("--mlp-ratio must be in (0, 16]");
  if (a.embed_dim % a.heads != 0)
    bad("--embed-dim " + std::to_string(a.embed_dim) + " is not divisible by --heads " + std::to_string(a.heads));
  if (a.data == "fashion-mnist" && cmd->count("--img-size") && a.img_size != 28)
    bad("--img-size applies to --data DIR; Fashion-MNIST images are 28x28");
  const int img = a.data == "fashion-mnist" ? 28 : a.img_size;
  if (img % a.patch != 0)
    bad("the image size " + std::to_string(img) + " is not a multiple of --patch " + std::to_string(a.patch));
  if (a.resume.empty() && !mae && cmd->count("--crop-pad") && !a.augment)
    bad("--crop-pad applies with --augment (the random crops)");
  if (!a.resume.empty()) {
    for (const char* flag : {"--depth", "--embed-dim", "--heads", "--patch", "--mlp-ratio", "--batch", "--lr",
                             "--weight-decay", "--warmup", "--seed", "--label-smoothing", "--drop-path", "--augment", "--no-augment", "--crop-pad", "--pool", "--val-split", "--shards",
                             "--img-size", "--limit", "--mask-ratio", "--decoder-dim", "--decoder-depth",
                             "--decoder-heads", "--crops-per-photo"})
      if (cmd->count(flag))
        bad(std::string(flag) + " cannot change on --resume: the checkpoint's recipe and data are used (with --resume and the "
            "same --data, only --epochs, --threads, --out, --stop-after, --name, --description and --quiet may be given)");
    if (!a.grad_dump.empty()) bad("--grad-dump and --resume cannot be combined");
  }
}

// What a run of either objective holds once its flags, checkpoint and data are read.
struct CliRun {
  SavedTraining saved;      // the checkpoint, when resuming
  ImageRunData images;      // a classifier's data
  PhotoRunData photos;      // MAE's photos
  VitConfig config;
  Recipe recipe;
  std::unique_ptr<Trainer> trainer;
  nlohmann::json data_record;  // what the record says about the data
  std::string eval_name;       // "test", "val" or "" (nothing held out)
  std::string start_line;      // "training N parameters on ...", without the steps and epochs
};

// Whether --data names the data a checkpoint was trained on: the same words, or the same folder
// spelled another way (./ds, ds/, its full path) as seen from the working folder.
bool same_data(const std::string& given, const std::string& recorded) {
  if (given == recorded) return true;
  if (given == "fashion-mnist" || recorded == "fashion-mnist" || is_photo_data(given) != is_photo_data(recorded))
    return false;
  const auto folder = [](const std::string& data) { return is_photo_data(data) ? photo_data_dir(data) : data; };
  std::error_code given_error, recorded_error;
  const std::filesystem::path a = std::filesystem::canonical(folder(given), given_error);
  const std::filesystem::path b = std::filesystem::canonical(folder(recorded), recorded_error);
  return !given_error && !recorded_error && a == b;
}

// Reads the checkpoint to resume; its record gives the data flags.
void read_resume(TrainArgs& a, CliRun& run, const std::string& objective) {
  if (checkpoint_objective(a.resume) != objective)
    throw UsageError(objective == "mae"
                         ? a.resume + ": a classifier checkpoint; resume it with the --data it was trained on"
                         : a.resume + ": an MAE checkpoint; resume it with --data photos[:DIR] as it was trained");
  run.saved = load_checkpoint(a.resume, objective);
  const nlohmann::json& t = run.saved.training;
  try {
    a.limit = t.value("limit", 0);
    a.val_split = t.value("val_split", 0.0);
    if (objective != "mae") a.img_size = t.value("img_size", a.img_size);
    a.seed = run.saved.recipe.seed;
  } catch (const nlohmann::json::exception&) {
    throw Error(a.resume + ": the training record is malformed");
  }
  if (!same_data(a.data, t.value("data", std::string())))
    throw UsageError("--data '" + a.data + "' is not the data this checkpoint was trained on ('" +
                     t.value("data", std::string()) + "')");
  if (a.out.empty()) a.out = parent_dir(a.resume);
}

// The shape and recipe: the checkpoint's when resuming (only --epochs and --threads change), else
// the flags'. The name and description label the model and never change the training, so a
// resumed run may set them too (the checkpoint's own are kept unless given).
void shape_and_recipe(const TrainArgs& a, CliRun& run, int img, const std::string& name, const std::string& description) {
  if (!a.resume.empty()) {
    run.config = run.saved.config;
    run.recipe = run.saved.recipe;
    if (a.command->count("--epochs")) run.recipe.epochs = a.epochs;
    run.recipe.threads = a.threads;
  } else {
    run.config = model_shape(a, img);
    run.recipe = recipe_from(a);
    run.config.name = name;
  }
  if (a.command->count("--name")) run.config.name = a.name;
  if (!a.description.empty()) run.config.description = a.description;
  else if (a.resume.empty()) run.config.description = description;
}

void prepare_classifier(TrainArgs& a, CliRun& run) {
  if (!a.resume.empty()) read_resume(a, run, "classify");
  run.images = load_run_data(a, a.quiet);
  const ImageRunData& data = run.images;
  shape_and_recipe(a, run, data.img_size, a.name, "ViT trained by 'vitlens train' on " + data.name);
  const std::string why = run.config.validate();
  if (!why.empty()) throw UsageError("model shape: " + why);
  if (data.train.num_classes() != run.saved.num_classes && !a.resume.empty())
    throw Error(a.resume + ": the checkpoint has " + std::to_string(run.saved.num_classes) + " classes, --data has " +
                std::to_string(data.train.num_classes()));
  run.trainer = std::make_unique<Trainer>(std::make_unique<ClassifyObjective>(
      run.config, run.recipe, &data.train, data.eval.size() > 0 ? &data.eval : nullptr));
  run.eval_name = data.eval_name;
  run.data_record = {{"data", a.data},
                     {"limit", a.limit},
                     {"val_split", a.val_split},
                     {"img_size", data.img_size},
                     {"train_images", data.train.size()},
                     {"eval_set", data.eval_name},
                     {"eval_images", data.eval.size()},
                     {"class_names", data.train.class_names}};
  run.start_line = "training " + std::to_string(run.trainer->objective().layout().total) + " parameters on " +
                   std::to_string(data.train.size()) + " images of " + data.name;
}

// `--data photos[:DIR]`: masked patch prediction (MAE) on a folder of photos; the validation loss
// (fixed crops and masks of held-out photos) after every epoch.
void prepare_mae(TrainArgs& a, CliRun& run) {
  if (!a.resume.empty()) read_resume(a, run, "mae");
  const std::string dir = photo_data_dir(a.data);
  shape_and_recipe(a, run, a.img_size, "vitlens-mae",
                   "ViT encoder trained by 'vitlens train' by masked patch prediction (MAE) on the photos in " + dir);
  MaeOptions options;
  if (!a.resume.empty()) {
    options = MaeOptions::from_json(run.saved.options);
  } else {
    run.recipe.label_smoothing = 0.0;
    // The random crops are the augmentation; their flip is on unless --no-augment is given.
    run.recipe.augment = run.recipe.flip = a.command->count("--augment") == 0 || a.augment;
    options.shape.mask_ratio = a.mask_ratio;
    options.shape.decoder_dim = a.decoder_dim;
    options.shape.decoder_depth = a.decoder_depth;
    options.shape.decoder_heads = a.decoder_heads;
    options.crops_per_photo = a.crops_per_photo;
  }
  std::string why = run.config.validate();
  if (why.empty()) why = options.validate(run.config);
  if (!why.empty()) throw UsageError("model shape: " + why);
  run.photos = load_photo_run_data(a.data, run.config.img_h, a.limit, a.val_split, a.seed);
  const PhotoRunData& photos = run.photos;
  const FolderReport& report = photos.report;
  if (report.skipped > 0 && !a.quiet) {
    std::fprintf(stderr, "vitlens: skipped %d unreadable file(s) in %s", report.skipped, dir.c_str());
    for (size_t i = 0; i < report.examples.size() && i < 2; ++i) std::fprintf(stderr, "; %s", report.examples[i].c_str());
    std::fprintf(stderr, "\n");
  }
  if (report.links_outside > 0 && !a.quiet) std::fprintf(stderr, "vitlens: %s\n", links_outside_warning(report).c_str());
  run.trainer = std::make_unique<Trainer>(std::make_unique<MaeObjective>(
      run.config, run.recipe, options, &photos.train, photos.val.size() > 0 ? &photos.val : nullptr));
  run.eval_name = "val";
  run.data_record = {{"objective", "mae"},           {"data", a.data},
                     {"photo_dir", dir},             {"limit", a.limit},
                     {"val_split", a.val_split},     {"img_size", run.config.img_h},
                     {"train_photos", photos.train.size()}, {"val_photos", photos.val.size()},
                     {"skipped_files", photos.report.skipped}};
  run.start_line = "MAE: training " + std::to_string(run.trainer->objective().layout().total) +
                   " parameters (encoder " +
                   std::to_string(run.trainer->objective_as<MaeObjective>().net().offsets().encoder_total) +
                   ") on " + std::to_string(photos.train.size()) + " photos of " + dir + " (" +
                   std::to_string(photos.val.size()) + " held out)";
}

// The two files `--grad-dump FILE` writes: FILE, and FILE without its .safetensors plus
// ".weights.safetensors".
std::pair<std::string, std::string> grad_dump_paths(const std::string& file) {
  std::string weights = file;
  const std::string tail = ".safetensors";
  if (weights.size() > tail.size() && weights.compare(weights.size() - tail.size(), tail.size(), tail) == 0)
    weights.resize(weights.size() - tail.size());
  return {file, weights + ".weights.safetensors"};
}

// A gradient dump is always two new files: a name taken by anything (a file, a link, a folder, a
// device) is refused, never replaced. Checked before any data is read, so that a taken name or a
// missing folder costs nothing; the group's commit checks the names again with the folder locked.
void check_grad_dump_names_free(const std::string& file) {
  const auto [grads, weights] = grad_dump_paths(file);
  require_writable_dir(parent_dir(grads));
  for (const std::string& path : {grads, weights}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0)
      throw Error(path + ": already exists; --grad-dump writes new files only (remove it or give another name)");
  }
}

// `--grad-dump`: the first batch's gradients and the initial weights, then exit. Both files appear
// together or neither (one FileGroup), and only under names nothing had when it committed.
int dump_gradients(const TrainArgs& a, CliRun& run) {
  const double loss = run.trainer->objective_as<ClassifyObjective>().gradients_of_first_batch();
  const Objective& objective = run.trainer->objective();
  SafetensorsFile file;
  file.tensors = layout_tensors(objective.layout(), objective.grads());
  file.metadata["loss"] = std::to_string(loss);
  file.metadata["batch"] = std::to_string(run.recipe.batch);
  file.metadata["what"] = "d loss / d parameter for the first --batch training images in file order, no "
                          "augmentation, mean cross-entropy with label smoothing " +
                          std::to_string(run.recipe.label_smoothing);
  const auto [grads_path, weights_path] = grad_dump_paths(a.grad_dump);
  const std::string grads = safetensors_bytes(file);
  const std::string weights =
      model_file_bytes(weights_path, run.config, layout_tensors(objective.layout(), objective.params()));
  FileGroup group(parent_dir(grads_path), true);
  for (const auto& file_bytes : {std::pair<std::string, const std::string*>{grads_path, &grads},
                                 {weights_path, &weights}}) {
    const std::string& bytes = *file_bytes.second;
    group.add_stream(base_name(file_bytes.first), [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
  }
  group.commit();
  std::printf("first-batch loss %.6f; gradients written to %s\n", loss, terminal_text(a.grad_dump).c_str());
  return kExitOk;
}

// A run with nothing left to train: relabelled when --name or --description is given, else left.
int finished_already(const TrainArgs& a, CliRun& run, const std::string& model_path) {
  if (a.command->count("--name") || !a.description.empty()) {  // same weights and state, new label
    save_checkpoint(*run.trainer, model_path, run.saved.training);
    std::printf("finished run relabelled: '%s' in %s\n", terminal_text(run.config.name).c_str(), model_path.c_str());
    return kExitOk;
  }
  std::printf("nothing to do: the checkpoint has finished all %d epochs (give a larger --epochs to continue)\n",
              run.recipe.epochs);
  return kExitOk;
}

void print_finished(const nlohmann::json& record, int epochs, const std::string& model_path) {
  const std::string took = duration_text(record["seconds"].get<double>());
  if (record.contains("test_accuracy"))
    std::printf("finished: test accuracy %.2f%% after %d epochs, %s; model in %s\n",
                100.0 * record["test_accuracy"].get<double>(), epochs, took.c_str(), model_path.c_str());
  else if (record.contains("val_accuracy"))
    std::printf("finished: validation accuracy %.2f%% after %d epochs, %s; model in %s\n",
                100.0 * record["val_accuracy"].get<double>(), epochs, took.c_str(), model_path.c_str());
  else if (record.contains("val_loss"))
    std::printf("finished: validation loss %.4f after %d epochs, %s; model in %s\n", record["val_loss"].get<double>(),
                epochs, took.c_str(), model_path.c_str());
  else
    std::printf("finished after %d epochs; model in %s\n", epochs, model_path.c_str());
}

// The evaluation's line under the progress bar.
std::string eval_line(const CliRun& cli, bool accuracy, const StepReport& r, const EvalReport& e) {
  char text[160];
  const char* name = cli.eval_name.c_str();
  if (accuracy)
    std::snprintf(text, sizeof text, "epoch %d: %s loss %.4f, %s accuracy %.2f%% (%d images)", r.epoch + 1, name,
                  e.loss, name, 100.0 * e.accuracy, e.images);
  else
    std::snprintf(text, sizeof text, "epoch %d: %s loss %.4f (%d crops of %d held-out photos)", r.epoch + 1, name,
                  e.loss, e.images, cli.photos.val.size());
  return text;
}

// The run itself, the same for every objective: progress, log, evaluation and a checkpoint each
// epoch, a stop on a signal or --stop-after that saves first, the final test pass.
int train_prepared(const TrainArgs& a, CliRun& cli, std::optional<FolderClaim>& claim) {
  prepare_run_folder(a, claim);
  const std::string model_path = a.out + "/last.safetensors";
  Trainer& trainer = *cli.trainer;
  if (!a.resume.empty()) restore_from(trainer, cli.saved, a.resume);
  if (trainer.finished()) return finished_already(a, cli, model_path);
  // The steps a killed run logged after its last save are trained again: their lines go.
  if (!a.resume.empty()) trim_log_after(a.out + "/log.jsonl", trainer.position().step);

  nlohmann::json record = a.resume.empty() ? nlohmann::json::object() : cli.saved.training;
  record.erase("train_loss");  // the viewer's per-step losses of the run so far: not this run's
  record.erase("train_loss_first_step");
  record_training_ops(record, !a.resume.empty());
  record.update(cli.data_record);
  const int epochs = trainer.recipe().epochs;
  Progress progress(a.quiet, trainer.total_steps(), trainer.steps_per_epoch());
  progress.line(cli.start_line + ", " + std::to_string(trainer.steps_per_epoch()) + " steps per epoch, " +
                std::to_string(epochs) + " epochs" +
                (a.resume.empty() ? "" : ", resuming at step " + std::to_string(trainer.position().step)));

  RunSettings settings;
  settings.checkpoint_path = model_path;
  settings.log_path = a.out + "/log.jsonl";
  settings.eval_name = cli.eval_name;
  const bool accuracy = trainer.objective().kind().reports_accuracy;
  RunHooks hooks;
  hooks.save = [](const Trainer& t, const std::string& path, const nlohmann::json& r) { save_checkpoint(t, path, r); };
  hooks.on_step = [&](const StepReport& r, const RunWindow& w) {
    progress.step(r, w.loss, w.accuracy, w.images_per_s, w.seconds_left, epochs, accuracy);
  };
  hooks.on_eval = [&](const StepReport& r, const EvalReport& e) { progress.line(eval_line(cli, accuracy, r, e)); };
  TrainingRun run(trainer, std::move(record), settings, hooks);
  std::optional<StopOnSignals> stop_on_signals(std::in_place);
  const bool stopped = run.run([&](int64_t steps) { return g_interrupted || (a.stop_after > 0 && steps >= a.stop_after); });
  stop_on_signals.reset();
  if (stopped) {
    progress.line("stopped at step " + std::to_string(trainer.position().step) + "; continue with --resume " + model_path);
    return g_interrupted ? kExitFailed : kExitOk;
  }
  // The final result: the test set when a validation split was used during training.
  if (cli.images.test.size() > 0) {
    run.timed([&] {
      const EvalReport test = trainer.objective_as<ClassifyObjective>().evaluate_set(cli.images.test);
      run.record()["test_accuracy"] = test.accuracy;
      run.record()["test_loss"] = test.loss;
    });
    run.save(model_path);
  }
  print_finished(run.record(), epochs, model_path);
  return kExitOk;
}

}  // namespace

int run_train(TrainArgs& a) {
  if (a.resume.empty() && !a.command->count("--val-split")) a.val_split = a.data == "fashion-mnist" ? 0.0 : 0.1;
  check_args(a, a.command);
  if (!a.grad_dump.empty()) check_grad_dump_names_free(a.grad_dump);
  // A run folder that exists is claimed before anything in it is read (a resume's checkpoint) or
  // any data is loaded; one still to be made is claimed when it is made (prepare_run_folder).
  std::optional<FolderClaim> claim;
  const std::string folder = a.out.empty() ? parent_dir(a.resume) : a.out;
  if (a.grad_dump.empty() && is_dir(folder)) claim.emplace(claim_run_folder(folder));
  CliRun run;
  if (is_photo_data(a.data)) {
    prepare_mae(a, run);
  } else {
    prepare_classifier(a, run);
    if (!a.grad_dump.empty()) return dump_gradients(a, run);
  }
  return train_prepared(a, run, claim);
}

}  // namespace vitlens::cli
