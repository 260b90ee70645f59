// `vitlens train`: a ViT classifier from scratch on Fashion-MNIST or an ImageFolder tree, with a
// progress bar, per-epoch evaluation, atomic checkpoints, a JSON-lines log and bit-exact resume.
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sys/stat.h>
#include <tuple>

#include "cli.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/io/files.hpp"
#include "core/train/mae_train.hpp"
#include "models/safetensors.hpp"
#include "core/train/train_ops.hpp"
#include "core/train/trainer.hpp"

namespace vitlens::cli {

namespace {

// A new run's model: the card's layout (qkv bias; class token unless --pool avg) in the flags' shape,
// images img x img.
VitConfig model_shape(const TrainArgs& a, int img) {
  VitConfig config;
  config.patch_size = a.patch;
  config.embed_dim = a.embed_dim;
  config.num_heads = a.heads;
  config.depth = a.depth;
  config.img_h = config.img_w = img;
  config.class_token = a.pool == "cls";
  config.mlp_ratio = a.mlp_ratio;
  config.qkv_bias = true;
  return config;
}

// A new run's recipe from the flags (the classifier's; the MAE path adjusts smoothing and flips).
Recipe recipe_from(const TrainArgs& a) {
  Recipe recipe;
  recipe.epochs = a.epochs;
  recipe.batch = a.batch;
  recipe.lr = a.lr;
  recipe.min_lr = std::min(1e-5, a.lr);
  recipe.weight_decay = a.weight_decay;
  recipe.warmup_epochs = a.warmup;
  recipe.label_smoothing = a.label_smoothing;
  recipe.drop_path = a.drop_path;
  recipe.augment = a.augment;
  recipe.crop_pad = a.crop_pad;
  recipe.seed = a.seed;
  recipe.threads = a.threads;
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

// Restores a checkpoint's state into a trainer of either objective; a state that does not fit the
// data names the checkpoint.
template <class TrainerT, class Saved>
void restore_from(TrainerT& trainer, const Saved& saved, const std::string& path) {
  try {
    trainer.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

using Clock = std::chrono::steady_clock;

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

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The data a run trains and evaluates on, and what to call it in messages and metadata.
struct RunData {
  ImageSet train, eval, test;  // test empty when eval is the test set itself
  std::string name;            // "fashion-mnist" or the folder
  std::string eval_name;       // "test" or "val"
  int img_size = 0;
};

RunData load_run_data(const TrainArgs& a, bool quiet) {
  RunData d;
  if (a.data == "fashion-mnist") {
    const std::string dir = default_fashion_mnist_dir();
    d.name = "fashion-mnist";
    ImageSet all = load_fashion_mnist(dir, true, a.limit);
    d.test = load_fashion_mnist(dir, false, a.limit);
    if (a.val_split > 0.0) {
      split_holdout(all, a.val_split, a.seed, &d.train, &d.eval);
      d.eval_name = "val";
    } else {
      d.train = std::move(all);
      d.eval = std::move(d.test);
      d.test = ImageSet();
      d.eval_name = "test";
    }
    d.img_size = 28;
  } else {
    if (!is_dir(a.data)) throw Error(a.data + ": --data is neither 'fashion-mnist' nor a folder");
    d.name = a.data;
    FolderReport report;
    ImageSet all = load_image_folder(a.data, a.img_size, &report);
    if (report.skipped > 0 && !quiet) {
      std::fprintf(stderr, "vitlens: skipped %d unreadable image(s) in %s", report.skipped, a.data.c_str());
      for (const std::string& e : report.examples) std::fprintf(stderr, "; %s", e.c_str());
      std::fprintf(stderr, "\n");
    }
    if (report.links_outside > 0 && !quiet) std::fprintf(stderr, "vitlens: %s\n", links_outside_warning(report).c_str());
    if (a.limit > 0 && all.size() > a.limit) {
      all.pixels.resize(static_cast<size_t>(a.limit) * 3 * all.height * all.width);
      all.labels.resize(static_cast<size_t>(a.limit));
    }
    if (a.val_split > 0.0) {
      split_holdout(all, a.val_split, a.seed, &d.train, &d.eval);
      d.eval_name = "val";
    } else {
      d.train = std::move(all);
      d.eval_name = "";
    }
    d.img_size = a.img_size;
  }
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

void append_log(const std::string& path, const nlohmann::json& record) {
  std::ofstream out(path, std::ios::app);
  out << record.dump() << "\n";
  if (!out) throw Error(path + ": cannot append to the training log");
}

// Records which build of the training ops this run uses (train_ops.hpp: AVX-512, AVX2 + FMA or
// portable; they differ in the last bits), and says so in one line when a resumed run was trained
// with another: the result is then not bit for bit the uninterrupted run.
void record_training_ops(nlohmann::json& record, bool resumed) {
  const std::string now = train::train_ops_isa();
  if (resumed && record.contains("training_ops") && record["training_ops"].is_string() &&
      record["training_ops"].get<std::string>() != now)
    std::fprintf(stderr,
                 "vitlens: warning: this run was trained with the %s training ops and continues with the %s ones "
                 "(another CPU, or VITLENS_ISA): it will not be bit for bit the uninterrupted run\n",
                 record["training_ops"].get<std::string>().c_str(), now.c_str());
  record["training_ops"] = now;
}

// The run folder, created when missing. A new run (or a resumed one moved to another folder)
// never replaces a checkpoint or log it did not continue: saving there would destroy that run's
// resumable pair, or a user's own file of that name.
void prepare_run_folder(const TrainArgs& a) {
  if (!is_dir(a.out) && ::mkdir(a.out.c_str(), 0755) != 0) throw Error(a.out + ": cannot create the run folder");
  require_writable_dir(a.out);
  struct stat out_st {}, resume_st {};
  const bool continues_here = !a.resume.empty() && ::stat(a.out.c_str(), &out_st) == 0 &&
                              ::stat(parent_of(a.resume).c_str(), &resume_st) == 0 &&
                              out_st.st_dev == resume_st.st_dev && out_st.st_ino == resume_st.st_ino;
  if (continues_here) return;
  const std::string model_path = a.out + "/last.safetensors";
  for (const std::string& path : {model_path, checkpoint_state_path(model_path), a.out + "/log.jsonl"}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0)
      throw Error(path + ": already exists; continue that run with --resume " + model_path +
                  ", or give another --out (a new run never replaces it)");
  }
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
      bad("--mask-ratio must be in (0, 1), got " + std::to_string(a.mask_ratio));
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
  if (!(a.lr > 0.0 && a.lr <= 10.0)) bad("--lr must be in (0, 10], got " + std::to_string(a.lr));
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
        bad(std::string(flag) + " cannot change on --resume: the checkpoint's recipe and data are used (only --epochs, "
            "--threads and --out may be given)");
    if (!a.grad_dump.empty()) bad("--grad-dump and --resume cannot be combined");
  }
}

// `--data photos[:DIR]`: masked patch prediction (MAE) on a folder of photos, with the same progress
// bar, log, atomic checkpoints and bit-exact resume as the classifier; the validation loss (fixed
// crops and masks of held-out photos) after every epoch.
int run_train_mae(TrainArgs& a) {
  CLI::App* cmd = a.command;
  SavedMae saved;
  if (!a.resume.empty()) {
    if (checkpoint_objective(a.resume) != "mae")
      throw UsageError(a.resume + ": a classifier checkpoint; resume it with the --data it was trained on");
    saved = load_mae_checkpoint(a.resume);
    const nlohmann::json& t = saved.training;
    try {
      a.limit = t.value("limit", 0);
      a.val_split = t.value("val_split", 0.0);
      a.seed = saved.recipe.seed;
    } catch (const nlohmann::json::exception&) {
      throw Error(a.resume + ": the training record is malformed");
    }
    if (t.value("data", std::string()) != a.data)
      throw UsageError("--data '" + a.data + "' is not the data this checkpoint was trained on ('" +
                       t.value("data", std::string()) + "')");
    if (a.out.empty()) a.out = parent_of(a.resume);
  }

  VitConfig config;
  Recipe recipe;
  MaeOptions options;
  if (!a.resume.empty()) {
    config = saved.config;
    recipe = saved.recipe;
    options = saved.options;
    if (cmd->count("--epochs")) recipe.epochs = a.epochs;
    if (cmd->count("--name")) config.name = a.name;
    recipe.threads = a.threads;
  } else {
    config = model_shape(a, a.img_size);
    config.name = a.command->count("--name") ? a.name : "vitlens-mae";
    recipe = recipe_from(a);
    recipe.label_smoothing = 0.0;
    // The random crops are the augmentation; their flip is on unless --no-augment is given.
    recipe.augment = recipe.flip = a.command->count("--augment") == 0 || a.augment;
    options.shape.mask_ratio = a.mask_ratio;
    options.shape.decoder_dim = a.decoder_dim;
    options.shape.decoder_depth = a.decoder_depth;
    options.shape.decoder_heads = a.decoder_heads;
    options.crops_per_photo = a.crops_per_photo;
  }
  const std::string dir = photo_data_dir(a.data);
  if (!a.description.empty())
    config.description = a.description;
  else if (a.resume.empty())
    config.description = "ViT encoder trained by 'vitlens train' by masked patch prediction (MAE) on the photos in " + dir;
  std::string why = config.validate();
  if (why.empty()) why = options.validate(config);
  if (!why.empty()) throw UsageError("model shape: " + why);

  const PhotoRunData photos = load_photo_run_data(a.data, config.img_h, a.limit, a.val_split, a.seed);
  const FolderReport& report = photos.report;
  if (report.skipped > 0 && !a.quiet) {
    std::fprintf(stderr, "vitlens: skipped %d unreadable file(s) in %s", report.skipped, dir.c_str());
    for (size_t i = 0; i < report.examples.size() && i < 2; ++i) std::fprintf(stderr, "; %s", report.examples[i].c_str());
    std::fprintf(stderr, "\n");
  }
  if (report.links_outside > 0 && !a.quiet) std::fprintf(stderr, "vitlens: %s\n", links_outside_warning(report).c_str());
  const PhotoCorpus& train_photos = photos.train;
  const PhotoCorpus& val_photos = photos.val;

  MaeTrainer trainer(config, recipe, options, &train_photos, val_photos.size() > 0 ? &val_photos : nullptr);

  prepare_run_folder(a);
  const std::string model_path = a.out + "/last.safetensors";
  const std::string log_path = a.out + "/log.jsonl";
  if (!a.resume.empty()) restore_from(trainer, saved, a.resume);
  if (trainer.finished()) {
    if (cmd->count("--name") || !a.description.empty()) {  // relabel a finished run: same weights and state
      save_mae_checkpoint(trainer, model_path, saved.training);
      std::printf("finished run relabelled: '%s' in %s\n", terminal_text(config.name).c_str(), model_path.c_str());
      return kExitOk;
    }
    std::printf("nothing to do: the checkpoint has finished all %d epochs (give a larger --epochs to continue)\n",
                recipe.epochs);
    return kExitOk;
  }

  nlohmann::json record = a.resume.empty() ? nlohmann::json::object() : saved.training;
  record.erase("train_loss");  // the viewer's per-step losses of the run so far: not this run's
  record.erase("train_loss_first_step");
  record_training_ops(record, !a.resume.empty());
  record["objective"] = "mae";
  record["data"] = a.data;
  record["photo_dir"] = dir;
  record["limit"] = a.limit;
  record["val_split"] = a.val_split;
  record["img_size"] = config.img_h;
  record["train_photos"] = train_photos.size();
  record["val_photos"] = val_photos.size();
  record["skipped_files"] = report.skipped;
  const double seconds_before = record.value("seconds", 0.0);

  Progress progress(a.quiet, trainer.total_steps(), trainer.steps_per_epoch());
  if (!a.quiet)
    progress.line("MAE: training " + std::to_string(trainer.net().layout().total) + " parameters (encoder " +
                  std::to_string(trainer.net().offsets().encoder_total) + ") on " +
                  std::to_string(train_photos.size()) + " photos of " + dir + " (" +
                  std::to_string(val_photos.size()) + " held out), " + std::to_string(trainer.steps_per_epoch()) +
                  " steps per epoch, " + std::to_string(recipe.epochs) + " epochs" +
                  (a.resume.empty() ? "" : ", resuming at step " + std::to_string(trainer.position().step)));

  std::optional<StopOnSignals> stop_on_signals(std::in_place);
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  double loss_sum = 0.0;
  int window = 0;
  int64_t steps_this_run = 0, window_steps = 0;
  auto window_start = Clock::now();
  double images_per_s = 0.0;
  bool stopped = false;

  auto save = [&](const EvalReport* eval) {
    record["seconds"] = seconds_before + seconds();
    if (eval) record["val_loss"] = eval->loss;
    save_mae_checkpoint(trainer, model_path, record);
  };

  while (!trainer.finished()) {
    const StepReport r = trainer.step();
    ++steps_this_run;
    ++window_steps;
    loss_sum += r.loss;
    ++window;
    const double window_seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
    if (window_steps >= 5 && window_seconds > 0) {
      images_per_s = static_cast<double>(window_steps) * recipe.batch / window_seconds;
      window_steps = 0;
      window_start = Clock::now();
    }
    const double left =
        images_per_s > 0 ? static_cast<double>(trainer.total_steps() - r.step) * recipe.batch / images_per_s : NAN;
    progress.step(r, loss_sum / window, 0.0, images_per_s, left, recipe.epochs, false);
    if (r.step % 10 == 0 || trainer.position().position == 0 || trainer.finished()) {
      append_log(log_path, {{"step", r.step}, {"epoch", r.epoch}, {"loss", loss_sum / window}, {"lr", r.lr},
                            {"grad_norm", r.grad_norm}, {"images_per_s", images_per_s},
                            {"seconds", seconds_before + seconds()}});
      loss_sum = 0.0;
      window = 0;
    }
    const bool epoch_done = trainer.position().position == 0 || trainer.finished();
    if (epoch_done) {
      EvalReport eval;
      if (trainer.has_eval()) {
        eval = trainer.evaluate();
        append_log(log_path, {{"step", r.step}, {"epoch", r.epoch}, {"eval", "val"}, {"loss", eval.loss},
                              {"seconds", seconds_before + seconds()}});
        char text[160];
        std::snprintf(text, sizeof text, "epoch %d: val loss %.4f (%d crops of %d held-out photos)", r.epoch + 1,
                      eval.loss, eval.images, val_photos.size());
        progress.line(text);
      }
      save(trainer.has_eval() ? &eval : nullptr);
    }
    if (g_interrupted || (a.stop_after > 0 && steps_this_run >= a.stop_after)) {
      if (!epoch_done) save(nullptr);
      stopped = true;
      break;
    }
  }
  stop_on_signals.reset();
  if (stopped && !trainer.finished()) {
    progress.line("stopped at step " + std::to_string(trainer.position().step) + "; continue with --resume " + model_path);
    return g_interrupted ? kExitFailed : kExitOk;
  }
  if (record.contains("val_loss"))
    std::printf("finished: validation loss %.4f after %d epochs, %s; model in %s\n", record["val_loss"].get<double>(),
                recipe.epochs, duration_text(record["seconds"].get<double>()).c_str(), model_path.c_str());
  else
    std::printf("finished after %d epochs; model in %s\n", recipe.epochs, model_path.c_str());
  return kExitOk;
}

}  // namespace

void add_train_command(CLI::App& app, TrainArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a ViT from scratch: a classifier (Fashion-MNIST or your own ImageFolder tree) or, with --data "
      "photos[:DIR], a masked autoencoder (MAE) on unlabelled photos; checkpoints open in 'vitlens view'");
  cmd->add_option("--data", a.data,
                  "'fashion-mnist' (the IDX files under " + default_fashion_mnist_dir() +
                      "), a folder with one subfolder of images per class (ImageFolder layout), or 'photos:DIR' "
                      "(any folder of images, read recursively; 'photos' alone = " + default_photo_dir() +
                      ") to train by masked patch prediction (MAE, no labels)");
  cmd->add_option("--out,-o", a.out,
                  "Run folder (created if missing): last.safetensors (+ .state.safetensors for --resume), log.jsonl");
  cmd->add_option("--depth", a.depth, "Transformer blocks")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--embed-dim", a.embed_dim, "Token width D")->check(CLI::Range(4, 1024))->capture_default_str();
  cmd->add_option("--heads", a.heads, "Attention heads (D must divide by it)")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--patch", a.patch, "Patch side P in pixels")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--mlp-ratio", a.mlp_ratio, "MLP hidden size = int(D * ratio)")->capture_default_str();
  cmd->add_option("--batch", a.batch, "Images per step (a last partial batch of each epoch is dropped)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--epochs", a.epochs, "Passes over the training images")->check(CLI::Range(1, 10000))->capture_default_str();
  cmd->add_option("--lr", a.lr, "Peak learning rate (AdamW), reached after the warmup, then cosine decay to 1e-5")
      ->capture_default_str();
  cmd->add_option("--weight-decay", a.weight_decay,
                  "AdamW decoupled weight decay, on weight matrices only (not biases, norms, pos_embed, cls_token)")
      ->capture_default_str();
  cmd->add_option("--warmup", a.warmup, "Linear learning-rate warmup, in epochs (fractions allowed)")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Seed for initialisation, data order, augmentation and the held-out split")
      ->capture_default_str();
  cmd->add_option("--threads", a.threads, "Worker threads; 0 = one per core (results do not depend on it)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--shards", a.shards,
                  "Split each batch into N parts whose gradients are summed, weighted by size (gradient "
                  "accumulation). On N to 2N-1 threads, or when N is a multiple of the threads, the parts run side "
                  "by side, one thread each (each thread takes the next part when done with one); otherwise one "
                  "after another on every thread. The numbers depend on N (float rounding only), never on --threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--label-smoothing", a.label_smoothing, "As torch.nn.CrossEntropyLoss(label_smoothing=...)")
      ->capture_default_str();
  cmd->add_option("--drop-path", a.drop_path,
                  "Stochastic depth (timm's drop_path_rate): each training image skips block l's attention and MLP "
                  "branches with probability RATE * l / (depth - 1), the kept ones scaled by 1 / (1 - p); 0 = off")
      ->capture_default_str();
  cmd->add_flag("--augment,!--no-augment", a.augment,
                "Augment the training images (random crop with --crop-pad pixels of zero padding, horizontal flip); "
                "on by default, --no-augment turns it off. With --data photos the flip of the random crops is on unless --no-augment");
  cmd->add_option("--pool", a.pool,
                  "What the classifier head reads: 'cls' (the class token, timm's default) or 'avg' (the mean of "
                  "the patch tokens after the final norm: timm's class_token=False, global_pool='avg', "
                  "fc_norm=False)")
      ->check(CLI::IsMember({"cls", "avg"}))
      ->capture_default_str();
  cmd->add_option("--crop-pad", a.crop_pad, "With --augment: zero padding of the random crop in pixels; 0 = flips only")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--val-split", a.val_split,
                  "Share of each class (for photos: of the photos) held out for per-epoch validation (seeded). Default 0.1 "
                  "for a folder or photos; for Fashion-MNIST 0 = evaluate on the 10,000 test images every epoch");
  cmd->add_option("--img-size", a.img_size, "Side images of a --data folder are resized and centre-cropped to; with --data photos, the side of the random crops")
      ->check(CLI::Range(4, 1024))
      ->capture_default_str();
  cmd->add_option("--resume", a.resume,
                  "Continue a run bit for bit from a checkpoint (RUNDIR/last.safetensors and its .state file); give "
                  "the same --data; --epochs may extend the run");
  cmd->add_option("--limit", a.limit, "Use only the first N training (and test) images, for quick tests")
      ->check(CLI::Range(1, 100000000));
  cmd->add_option("--stop-after", a.stop_after, "Stop (and save) after N steps in this invocation; resume later")
      ->check(CLI::Range(1, 100000000));
  cmd->add_option("--grad-dump", a.grad_dump,
                  "Debug: write the gradients of the first batch (file order, no augmentation, no update) as "
                  "safetensors with timm names to FILE, and the initial weights to FILE's .weights.safetensors; then exit");
  cmd->add_option("--name", a.name,
                  "The model's name in its config (what 'vitlens info' and the viewer's Model menu show)")
      ->capture_default_str();
  cmd->add_option("--description", a.description,
                  "The model's description in its config (default: 'ViT trained by vitlens train on DATA')");
  cmd->add_option("--mask-ratio", a.mask_ratio, "photos: share of patches hidden from the encoder, in (0, 1)")
      ->capture_default_str();
  cmd->add_option("--decoder-dim", a.decoder_dim, "photos: width Dd of the MAE decoder")
      ->check(CLI::Range(4, 1024))
      ->capture_default_str();
  cmd->add_option("--decoder-depth", a.decoder_depth, "photos: blocks in the MAE decoder")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--decoder-heads", a.decoder_heads, "photos: attention heads in the MAE decoder (Dd must divide by it)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--crops-per-photo", a.crops_per_photo,
                  "photos: random crops of each training photo per epoch (random scale 0.4-1 of the short side, "
                  "position and flip, resized to --img-size)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--quiet,-q", a.quiet, "Print nothing but errors and the final result");
  a.command = cmd;
}

int run_train(TrainArgs& a) {
  CLI::App* cmd = a.command;
  if (a.resume.empty() && !cmd->count("--val-split")) a.val_split = a.data == "fashion-mnist" ? 0.0 : 0.1;
  check_args(a, cmd);
  if (is_photo_data(a.data)) return run_train_mae(a);

  SavedTraining saved;
  if (!a.resume.empty()) {
    if (checkpoint_objective(a.resume) != "classify")
      throw UsageError(a.resume + ": an MAE checkpoint; resume it with --data photos[:DIR] as it was trained");
    saved = load_checkpoint(a.resume);
    // The data flags come from the checkpoint's record.
    const nlohmann::json& t = saved.training;
    try {
      a.limit = t.value("limit", 0);
      a.val_split = t.value("val_split", 0.0);
      a.img_size = t.value("img_size", a.img_size);
      a.seed = saved.recipe.seed;
    } catch (const nlohmann::json::exception&) {
      throw Error(a.resume + ": the training record is malformed");
    }
    if (t.value("data", std::string()) != a.data)
      throw UsageError("--data '" + a.data + "' is not the data this checkpoint was trained on ('" +
                       t.value("data", std::string()) + "')");
    if (a.out.empty()) a.out = parent_of(a.resume);
  }

  const RunData data = load_run_data(a, a.quiet);
  VitConfig config;
  Recipe recipe;
  if (!a.resume.empty()) {
    config = saved.config;
    recipe = saved.recipe;
    if (cmd->count("--epochs")) recipe.epochs = a.epochs;
    recipe.threads = a.threads;
  } else {
    config = model_shape(a, data.img_size);
    recipe = recipe_from(a);
  }
  // The name and description label the model and never change the training, so a resumed run may
  // set them too (the checkpoint's own name is kept unless --name is given).
  if (a.resume.empty() || cmd->count("--name")) config.name = a.name;
  if (!a.description.empty())
    config.description = a.description;
  else if (a.resume.empty())
    config.description = "ViT trained by 'vitlens train' on " + data.name;
  const std::string why = config.validate();
  if (!why.empty()) throw UsageError("model shape: " + why);
  if (data.train.num_classes() != saved.num_classes && !a.resume.empty())
    throw Error(a.resume + ": the checkpoint has " + std::to_string(saved.num_classes) + " classes, --data has " +
                std::to_string(data.train.num_classes()));

  Trainer trainer(config, recipe, &data.train, data.eval.size() > 0 ? &data.eval : nullptr);

  if (!a.grad_dump.empty()) {
    const double loss = trainer.gradients_of_first_batch();
    SafetensorsFile file;
    file.tensors = layout_tensors(trainer.net().layout(), trainer.net().grads);
    file.metadata["loss"] = std::to_string(loss);
    file.metadata["batch"] = std::to_string(recipe.batch);
    file.metadata["what"] = "d loss / d parameter for the first --batch training images in file order, no "
                            "augmentation, mean cross-entropy with label smoothing " + std::to_string(recipe.label_smoothing);
    write_safetensors(a.grad_dump, file);
    std::string weights = a.grad_dump;
    const std::string tail = ".safetensors";
    if (weights.size() > tail.size() && weights.compare(weights.size() - tail.size(), tail.size(), tail) == 0)
      weights.resize(weights.size() - tail.size());
    save_model(weights + ".weights.safetensors", config, layout_tensors(trainer.net().layout(), trainer.net().params));
    std::printf("first-batch loss %.6f; gradients written to %s\n", loss, a.grad_dump.c_str());
    return kExitOk;
  }

  prepare_run_folder(a);
  const std::string model_path = a.out + "/last.safetensors";
  const std::string log_path = a.out + "/log.jsonl";
  if (!a.resume.empty()) restore_from(trainer, saved, a.resume);
  if (trainer.finished()) {
    if (cmd->count("--name") || !a.description.empty()) {  // relabel a finished run: same weights and state
      save_checkpoint(trainer, model_path, saved.training);
      std::printf("finished run relabelled: '%s' in %s\n", terminal_text(config.name).c_str(), model_path.c_str());
      return kExitOk;
    }
    std::printf("nothing to do: the checkpoint has finished all %d epochs (give a larger --epochs to continue)\n",
                recipe.epochs);
    return kExitOk;
  }

  nlohmann::json record = a.resume.empty() ? nlohmann::json::object() : saved.training;
  record.erase("train_loss");  // the viewer's per-step losses of the run so far: not this run's
  record.erase("train_loss_first_step");
  record_training_ops(record, !a.resume.empty());
  record["data"] = a.data;
  record["limit"] = a.limit;
  record["val_split"] = a.val_split;
  record["img_size"] = data.img_size;
  record["train_images"] = data.train.size();
  record["eval_set"] = data.eval_name;
  record["eval_images"] = data.eval.size();
  record["class_names"] = data.train.class_names;
  double seconds_before = record.value("seconds", 0.0);

  Progress progress(a.quiet, trainer.total_steps(), trainer.steps_per_epoch());
  if (!a.quiet)
    progress.line("training " + std::to_string(trainer.net().layout().total) + " parameters on " +
                  std::to_string(data.train.size()) + " images of " + data.name + ", " +
                  std::to_string(trainer.steps_per_epoch()) + " steps per epoch, " + std::to_string(recipe.epochs) +
                  " epochs" + (a.resume.empty() ? "" : ", resuming at step " + std::to_string(trainer.position().step)));

  std::optional<StopOnSignals> stop_on_signals(std::in_place);
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  double loss_sum = 0.0, acc_sum = 0.0;
  int window = 0;
  int64_t steps_this_run = 0;
  const int64_t log_every = 10;
  auto window_start = Clock::now();
  int64_t window_steps = 0;
  double images_per_s = 0.0;
  bool stopped = false;

  auto save = [&](const EvalReport* eval) {
    record["seconds"] = seconds_before + seconds();
    if (eval) {
      record[data.eval_name + "_accuracy"] = eval->accuracy;
      record[data.eval_name + "_loss"] = eval->loss;
    }
    save_checkpoint(trainer, model_path, record);
  };

  while (!trainer.finished()) {
    const StepReport r = trainer.step();
    ++steps_this_run;
    ++window_steps;
    loss_sum += r.loss;
    acc_sum += r.accuracy;
    ++window;
    const double window_seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
    if (window_steps >= 5 && window_seconds > 0) {
      images_per_s = static_cast<double>(window_steps) * recipe.batch / window_seconds;
      window_steps = 0;
      window_start = Clock::now();
    }
    const double left = images_per_s > 0 ? static_cast<double>(trainer.total_steps() - r.step) * recipe.batch / images_per_s
                                         : NAN;
    progress.step(r, loss_sum / window, acc_sum / window, images_per_s, left, recipe.epochs);
    if (r.step % log_every == 0 || trainer.position().position == 0 || trainer.finished()) {
      append_log(log_path, {{"step", r.step}, {"epoch", r.epoch}, {"loss", loss_sum / window},
                            {"accuracy", acc_sum / window}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                            {"images_per_s", images_per_s}, {"seconds", seconds_before + seconds()}});
      loss_sum = acc_sum = 0.0;
      window = 0;
    }
    const bool epoch_done = trainer.position().position == 0 || trainer.finished();
    if (epoch_done) {
      EvalReport eval;
      if (data.eval.size() > 0) {
        eval = trainer.evaluate(data.eval);
        append_log(log_path, {{"step", r.step}, {"epoch", r.epoch}, {"eval", data.eval_name}, {"loss", eval.loss},
                              {"accuracy", eval.accuracy}, {"seconds", seconds_before + seconds()}});
        char text[160];
        std::snprintf(text, sizeof text, "epoch %d: %s loss %.4f, %s accuracy %.2f%% (%d images)", r.epoch + 1,
                      data.eval_name.c_str(), eval.loss, data.eval_name.c_str(), 100.0 * eval.accuracy, eval.images);
        progress.line(text);
      }
      save(data.eval.size() > 0 ? &eval : nullptr);
    }
    if (g_interrupted || (a.stop_after > 0 && steps_this_run >= a.stop_after)) {
      if (!epoch_done) save(nullptr);
      stopped = true;
      break;
    }
  }
  stop_on_signals.reset();

  if (stopped && !trainer.finished()) {
    progress.line("stopped at step " + std::to_string(trainer.position().step) + "; continue with --resume " + model_path);
    return g_interrupted ? kExitFailed : kExitOk;
  }
  // The final result: the test set when a validation split was used during training.
  if (data.test.size() > 0) {
    const EvalReport test = trainer.evaluate(data.test);
    record["test_accuracy"] = test.accuracy;
    record["test_loss"] = test.loss;
    save(nullptr);
  }
  if (record.contains("test_accuracy"))
    std::printf("finished: test accuracy %.2f%% after %d epochs, %s; model in %s\n",
                100.0 * record["test_accuracy"].get<double>(), recipe.epochs,
                duration_text(record["seconds"].get<double>()).c_str(), model_path.c_str());
  else if (record.contains("val_accuracy"))
    std::printf("finished: validation accuracy %.2f%% after %d epochs, %s; model in %s\n",
                100.0 * record["val_accuracy"].get<double>(), recipe.epochs,
                duration_text(record["seconds"].get<double>()).c_str(), model_path.c_str());
  else
    std::printf("finished after %d epochs; model in %s\n", recipe.epochs, model_path.c_str());
  return kExitOk;
}

}  // namespace vitlens::cli
