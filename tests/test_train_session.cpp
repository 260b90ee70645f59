// The viewer's TrainSession and Train commands without a display: start, pause, resume,
// stop, snapshot contents, saving, the probe maps against an independent recomputation from the
// saved file, a bad data path as one line, the script's checks and the Model menu's list; the same
// for masked patch prediction on photos (MAE).
#include <catch2/catch.hpp>

#include <opencv2/imgcodecs.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <unistd.h>

#include "control/controller.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "training/train_panel.hpp"
#include "training/train_session.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "core/render/maps.hpp"
#include "core/train/mae_objective.hpp"
#include "core/train/train_ops.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

using namespace vitlens;
using namespace vitlens::viewer;

namespace {

// A run of a few steps: 64 images, batch 16 = 4 steps per epoch, 2 epochs, a 1-block model.
TrainSettings tiny_settings() {
  TrainSettings s;
  s.data = "fashion-mnist";
  s.limit = 64;
  s.depth = 1;
  s.embed_dim = 8;
  s.heads = 2;
  s.patch = 7;
  s.batch = 16;
  s.epochs = 2;
  s.warmup = 0.5;
  s.threads = 1;
  s.probe_every = 2;
  return s;
}

// Polls the snapshot until `done` holds (or 120 s pass: then the test fails on the condition).
TrainSnapshot wait_for(const TrainSession& session, const std::function<bool(const TrainSnapshot&)>& done) {
  const auto start = std::chrono::steady_clock::now();
  TrainSnapshot s = session.snapshot();
  while (!done(s) && std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = session.snapshot();
  }
  return s;
}

// The probe's series of a run of 2 heads on 4 x 4 patches: `points` values per head (entropy,
// distance, each role), entropies in (0, ln 17] (16 patches + the class token), and the probe
// maps last refreshed at `last_step`.
void check_probe_series(const TrainSnapshot& s, size_t points, int64_t last_step) {
  for (int h = 0; h < 2; ++h) {
    CHECK(s.entropy[h].size() == points);
    CHECK(s.distance[h].size() == points);
    for (int r = 0; r < kHeadRoles; ++r) CHECK(s.roles[h][r].size() == points);
    for (float e : s.entropy[h]) {
      CHECK(e > 0.0f);
      CHECK(e <= std::log(17.0f) + 1e-4f);
    }
  }
  CHECK(s.probe.step == last_step);
  CHECK(s.probe.grid_h == 4);
  CHECK(s.probe.grid_w == 4);
}

}  // namespace

TEST_CASE("train session: start, pause, resume, finish, snapshot holds every curve", "[train_session]") {
  TrainSession session;
  REQUIRE(session.start(tiny_settings()) == "");
  session.pause();  // before the data is in: the run starts paused at step 0
  TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) {
    return (x.state == TrainState::Paused && x.parameters > 0) || x.state == TrainState::Failed;
  });
  REQUIRE(s.error == "");
  REQUIRE(s.state == TrainState::Paused);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  s = session.snapshot();
  CHECK(s.state == TrainState::Paused);
  CHECK(s.step == 0);
  CHECK(s.loss.empty());
  CHECK(s.stat_steps == std::vector<int64_t>{0});  // the initial weights' probe
  session.resume();
  s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Finished || x.state == TrainState::Failed; });
  REQUIRE(s.state == TrainState::Finished);
  CHECK(s.total_steps == 8);
  CHECK(s.steps_per_epoch == 4);
  CHECK(s.step == 8);
  CHECK(s.train_images == 64);
  CHECK(s.eval_name == "test");
  CHECK(s.eval_images == 64);
  REQUIRE(s.loss.size() == 8);
  REQUIRE(s.accuracy.size() == 8);
  for (size_t i = 0; i < s.loss.size(); ++i) {
    CHECK(std::isfinite(s.loss[i]));
    CHECK(s.loss[i] > 0.0f);
    CHECK(s.accuracy[i] >= 0.0f);
    CHECK(s.accuracy[i] <= 1.0f);
  }
  // The first batch of an untrained 10-class model: the loss is near ln 10 = 2.303.
  CHECK(std::abs(s.loss[0] - 2.3026f) < 0.25f);
  // One validation pass per epoch, at steps 4 and 8.
  REQUIRE(s.eval_steps == std::vector<int64_t>{4, 8});
  REQUIRE(s.eval_loss.size() == 2);
  // Probe refreshes at step 0 (initial weights) and every 2 steps: 0, 2, 4, 6, 8.
  REQUIRE(s.stat_steps == std::vector<int64_t>{0, 2, 4, 6, 8});
  REQUIRE(s.entropy.size() == 2);
  REQUIRE(s.distance.size() == 2);
  REQUIRE(s.roles.size() == 2);
  check_probe_series(s, 5, 8);
  CHECK(s.probe.heads.size() == 2);
  CHECK(s.probe.image_rgb.size() == 28u * 28u * 3u);
}

TEST_CASE("train session: the probe maps equal the saved model's maps recomputed independently", "[train_session]") {
  const std::string dir = test::temp_dir("train-session-probe");
  TrainSession session;
  TrainSettings settings = tiny_settings();
  settings.epochs = 1;
  REQUIRE(session.start(settings) == "");
  TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Finished || x.state == TrainState::Failed; });
  REQUIRE(s.state == TrainState::Finished);
  const std::string path = dir + "/final.safetensors";
  REQUIRE(session.save(path) == "");
  s = session.snapshot();
  CHECK(s.checkpoint == path);
  CHECK(std::filesystem::exists(dir + "/final.state.safetensors"));

  // The saved file through the ordinary loader, the first test image through the ordinary image
  // path: the same maps the Train window drew (probe of step 4 = the saved step).
  const VitModel model = load_model(path);
  CHECK(model.config.depth == 1);
  CHECK(model.config.num_heads == 2);
  const ImageSet test = load_fashion_mnist(default_fashion_mnist_dir(), false, 1);
  cv::Mat rgb(28, 28, CV_32FC3);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x)
      for (int c = 0; c < 3; ++c) rgb.at<cv::Vec3f>(y, x)[c] = test.image(0)[(c * 28 + y) * 28 + x];
  const PreparedImage prepared = prepare_image(rgb, model.config, 0);
  const ForwardResult result = forward(model, prepared.grid, ForwardOptions{});
  MapRequest request;
  request.layer = 0;
  const HeadMaps maps = attention_maps(model, result, request);
  REQUIRE(s.probe.step == 4);
  REQUIRE(s.probe.heads.size() == maps.heads.size());
  double worst = 0.0;
  for (size_t h = 0; h < maps.heads.size(); ++h)
    worst = std::max(worst, static_cast<double>((s.probe.heads[h] - maps.heads[h]).cwiseAbs().maxCoeff()));
  INFO("largest difference " << worst);
  CHECK(worst <= 1e-6);
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: stop keeps the weights, saving into a missing folder is one line", "[train_session]") {
  TrainSession session;
  TrainSettings settings = tiny_settings();
  settings.epochs = 1000;  // 4000 steps: far more than run before the stop arrives
  REQUIRE(session.start(settings) == "");
  TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) { return x.step >= 1 || x.state == TrainState::Failed; });
  REQUIRE(s.step >= 1);
  session.stop();
  s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Stopped; });
  REQUIRE(s.state == TrainState::Stopped);
  const int64_t stopped_at = s.step;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(session.snapshot().step == stopped_at);
  CHECK(stopped_at < s.total_steps);
  const std::string error = session.save("/nonexistent-vitlens-folder/x.safetensors");
  CHECK(error != "");
  CHECK(error.find('\n') == std::string::npos);
  {
    // A folder a `vitlens train` has claimed (its run folder while it runs): refused, nothing written.
    const std::string busy = test::temp_dir("session-busy");
    const FolderClaim training(busy);
    CHECK(session.save(busy + "/x.safetensors") == busy + ": another vitlens process is training or saving in this folder");
    CHECK(test::entries(busy).empty());
  }
  {
    // A Save over a file vitlens did not write (a photo, a model of the user's, a state file
    // beside a new name): refused in one line, every file as it was; its own checkpoint is
    // replaced.
    const std::string dir = test::temp_dir("session-save-over");
    test::spit(dir + "/photo.jpg", "the user's photo");
    test::spit(dir + "/notes.state.safetensors", "the user's notes");
    const auto refusal = [&](const std::string& name) {
      return dir + "/" + name + ": exists and is not a checkpoint this window saved; vitlens replaces no file it did "
                                "not write: choose another name (nothing was saved)";
    };
    CHECK(session.save(dir + "/photo.jpg") == refusal("photo.jpg"));
    CHECK(session.save(dir + "/notes.safetensors") == refusal("notes.state.safetensors"));
    CHECK(test::slurp(dir + "/photo.jpg") == "the user's photo");
    CHECK(test::slurp(dir + "/notes.state.safetensors") == "the user's notes");
    CHECK(test::entries(dir) == std::vector<std::string>{"notes.state.safetensors", "photo.jpg"});
    // A folder (or a name ending in '/') is said to be one.
    for (const std::string& folder : {dir, dir + "/"})
      CHECK(session.save(folder) == folder + ": is a folder; a checkpoint needs a file name, such as " + dir +
                                        "/model.safetensors (nothing was saved)");
    CHECK(session.save("") == "no file name given for the checkpoint (nothing was saved)");
    CHECK(test::entries(dir) == std::vector<std::string>{"notes.state.safetensors", "photo.jpg"});
    CHECK(session.save(dir + "/mine.safetensors") == "");
    CHECK(session.save(dir + "/mine.safetensors") == "");  // its own: replaced
    // A vitlens checkpoint this window did not save (another session's, a user's copy of one)
    // is refused too, model or state; so is its own once someone else has rewritten it.
    for (const char* file : {"/mine.safetensors", "/mine.state.safetensors"})
      std::filesystem::copy_file(dir + file, dir + "/kept" + std::string(file).substr(5));
    const std::string kept = test::slurp(dir + "/kept.safetensors");
    CHECK(session.save(dir + "/kept.safetensors") == refusal("kept.safetensors"));
    std::filesystem::remove(dir + "/kept.safetensors");
    CHECK(session.save(dir + "/kept.safetensors") == refusal("kept.state.safetensors"));
    CHECK(!std::filesystem::exists(dir + "/kept.safetensors"));
    std::filesystem::remove(dir + "/mine.state.safetensors");
    std::filesystem::copy_file(dir + "/kept.state.safetensors", dir + "/mine.state.safetensors");
    CHECK(session.save(dir + "/mine.safetensors") == refusal("mine.state.safetensors"));
    CHECK(test::entries(dir) == std::vector<std::string>{"kept.state.safetensors", "mine.safetensors",
                                                        "mine.state.safetensors", "notes.state.safetensors",
                                                        "photo.jpg"});
    std::filesystem::remove_all(dir);
  }
  std::string path_error;
  const std::string path = session.viewing_path(path_error);
  CHECK(path_error == "");
  REQUIRE(path != "");
  const uint64_t id = session.request_save(path);
  REQUIRE(id != 0);
  std::string save_error = "unset";
  while (!session.save_finished(id, save_error)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(save_error == "");
  CHECK(load_model(path).config.name == "vitlens-trained");
  // The record names the training ops and the SGEMM's k block, as `vitlens train` records them,
  // so that a CLI resume of this checkpoint warns only when they change.
  const nlohmann::json record = nlohmann::json::parse(read_safetensors(path).metadata.at("training"));
  CHECK(record.at("training_ops") == train::train_ops_isa());
  CHECK(record.at("sgemm_k_block") == train::train_ops_k_block());
  // Without an out folder, the viewer's model goes to <temp>/vitlens-train-<pid>: this process's.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  REQUIRE(folder == std::filesystem::temp_directory_path() / ("vitlens-train-" + std::to_string(::getpid())));
  REQUIRE(folder.string() == TrainSession::temporary_folder());
  // Its own file there is its to replace; a file it did not save takes the name away: numbered on.
  CHECK(session.viewing_path(path_error) == path);
  test::spit(path, "not the window's");
  CHECK(session.viewing_path(path_error) == (folder / "current_2.safetensors").string());
  std::filesystem::remove(path);
}

TEST_CASE("train session: the temporary folder goes once a Save holds its weights, files it did not save stay",
          "[train_session]") {
  const std::string folder = TrainSession::temporary_folder();
  const std::string kept_dir = test::temp_dir("session-kept");
  std::filesystem::remove_all(folder);
  const auto finished = [](const TrainSnapshot& x) { return x.state == TrainState::Finished || x.state == TrainState::Failed; };
  std::string path;
  {
    // Opened in the main view, never saved elsewhere: the only copy of the run stays.
    TrainSession session;
    REQUIRE(session.start(tiny_settings()) == "");
    wait_for(session, finished);
    std::string error;
    path = session.viewing_path(error);
    REQUIRE(path == folder + "/current.safetensors");
    REQUIRE(session.save(path) == "");
    CHECK(session.unsaved_temporary() == path);
  }
  CHECK(test::entries(folder) == std::vector<std::string>{"current.safetensors", "current.state.safetensors"});
  std::filesystem::remove_all(folder);
  {
    // Saved elsewhere at the same step too: the temporary copy goes, and the folder with it.
    TrainSession session;
    REQUIRE(session.start(tiny_settings()) == "");
    wait_for(session, finished);
    std::string error;
    REQUIRE(session.save(session.viewing_path(error)) == "");
    REQUIRE(session.save(kept_dir + "/kept.safetensors") == "");
    CHECK(session.unsaved_temporary() == "");
  }
  CHECK(!std::filesystem::exists(folder));
  CHECK(std::filesystem::exists(kept_dir + "/kept.safetensors"));
  {
    // Files it did not save, or that someone changed since, stay.
    TrainSession session;
    REQUIRE(session.start(tiny_settings()) == "");
    wait_for(session, finished);
    std::string error;
    REQUIRE(session.save(session.viewing_path(error)) == "");
    REQUIRE(session.save(kept_dir + "/later.safetensors") == "");
    test::spit(folder + "/notes.txt", "a user's file");
    test::spit(folder + "/current.state.safetensors", "rewritten by someone else");
  }
  CHECK(test::entries(folder) == std::vector<std::string>{"current.state.safetensors", "notes.txt"});
  CHECK(test::slurp(folder + "/notes.txt") == "a user's file");
  std::filesystem::remove_all(folder);
}

TEST_CASE("train session: the temporary folder is in $TMPDIR when it names a folder, else in /tmp", "[train_session]") {
  const char* before = std::getenv("TMPDIR");
  const std::string saved = before ? before : "";
  const std::string dir = test::temp_dir("session-tmpdir");
  const std::string pid = std::to_string(::getpid());
  ::setenv("TMPDIR", dir.c_str(), 1);
  CHECK(TrainSession::temporary_folder() == dir + "/vitlens-train-" + pid);
  // A TMPDIR that is missing, a file or relative: never a folder relative to the working folder.
  for (const std::string& bad : {dir + "/missing", dir + "/../" + std::filesystem::path(dir).filename().string() + "/missing",
                                 std::string("relative-vitlens-tmp"), std::string("")}) {
    INFO(bad);
    ::setenv("TMPDIR", bad.c_str(), 1);
    CHECK(TrainSession::temporary_folder() == "/tmp/vitlens-train-" + pid);
  }
  test::spit(dir + "/a-file", "x");
  ::setenv("TMPDIR", (dir + "/a-file").c_str(), 1);
  CHECK(TrainSession::temporary_folder() == "/tmp/vitlens-train-" + pid);
  // Models in any viewer's temporary folder are known by the folder's name, nothing else is.
  ::setenv("TMPDIR", dir.c_str(), 1);
  CHECK(TrainSession::in_a_temporary_folder(dir + "/vitlens-train-" + pid + "/current.safetensors"));
  CHECK(TrainSession::in_a_temporary_folder(dir + "/vitlens-train-123456789/current_2.safetensors"));
  CHECK(TrainSession::in_a_temporary_folder(dir + "/x/../vitlens-train-7/current.safetensors"));
  CHECK_FALSE(TrainSession::in_a_temporary_folder(dir + "/vitlens-train-/current.safetensors"));
  CHECK_FALSE(TrainSession::in_a_temporary_folder(dir + "/vitlens-train-12a/current.safetensors"));
  CHECK_FALSE(TrainSession::in_a_temporary_folder(dir + "/vitlens-train-12/sub/current.safetensors"));
  CHECK_FALSE(TrainSession::in_a_temporary_folder(dir + "/current.safetensors"));
  CHECK_FALSE(TrainSession::in_a_temporary_folder("/home/someone/vitlens-train-12/current.safetensors"));
  if (before)
    ::setenv("TMPDIR", saved.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: a Save that failed past its commit point leaves a checkpoint the next Save replaces",
          "[train_session]") {
  TrainSession session;
  REQUIRE(session.start(tiny_settings()) == "");
  wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Finished || x.state == TrainState::Failed; });
  const std::string dir = test::temp_dir("session-failed-save");
  // The 5th file operation of a save is the second move into place, after the commit point.
  testing::fail_file_operation(5);
  CHECK(session.save(dir + "/x.safetensors") != "");
  testing::fail_file_operation(0);
  CHECK(session.save(dir + "/x.safetensors") == "");
  CHECK(test::entries(dir) == std::vector<std::string>{"x.safetensors", "x.state.safetensors"});
  CHECK(load_model(dir + "/x.safetensors").config.name == "vitlens-trained");
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: a bad data path or setting is one line, never a crash", "[train_session]") {
  TrainSession session;
  CHECK(session.save("x.safetensors") == "no training run has started");
  TrainSettings bad = tiny_settings();
  bad.data = "/nonexistent/vitlens-data";
  bad.img_size = 28;  // a folder's images are resized to img-size, which patch 7 must divide
  REQUIRE(session.start(bad) == "");  // the data is read on the worker
  const TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Failed; });
  REQUIRE(s.state == TrainState::Failed);
  CHECK(s.error.find("/nonexistent/vitlens-data") != std::string::npos);
  CHECK(s.error.find('\n') == std::string::npos);
  CHECK(session.save("x.safetensors") == "no model to save: the run did not start");

  TrainSettings encoded = tiny_settings();
  encoded.data = "/data/caf\xe9";  // Latin-1: a run's record (JSON) could not hold it
  CHECK(session.start(encoded).rfind("data is not valid UTF-8", 0) == 0);

  TrainSettings shape = tiny_settings();
  shape.heads = 3;
  CHECK(session.start(shape) == "embed-dim 8 is not divisible by heads 3");
  shape = tiny_settings();
  shape.patch = 5;
  CHECK(session.start(shape) == "the image size 28 is not a multiple of patch 5");
  TrainSettings parsed;
  CHECK(set_train_option(parsed, "lr", "abc") == "lr=abc: expected a number");
  CHECK(set_train_option(parsed, "depth", "0").find("expected a whole number in [1, 64]") != std::string::npos);
  CHECK(set_train_option(parsed, "colour", "1").find("unknown training option 'colour'") == 0);
  CHECK(set_train_option(parsed, "limit", "100") == "");
  CHECK(parsed.limit == 100);
  CHECK(set_train_option(parsed, "drop-path", "0.1") == "");
  CHECK(parsed.drop_path == 0.1);
  TrainSettings dropped = tiny_settings();
  dropped.drop_path = 1.0;
  CHECK(session.start(dropped) == "drop_path 1 is not in [0, 1)");
}

TEST_CASE("train commands: the script's checks and the Model menu's list", "[train_session]") {
  auto check = [](const std::string& line) {
    try {
      parse_script(line + "\n", "t");
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  CHECK(check("train start fashion-mnist limit=64 depth=1") == "");
  CHECK(check("train wait 10") == "");
  CHECK(check("train save out.safetensors") == "");
  CHECK(check("train open") == "");
  CHECK(check("model-menu vitlens-random-4head") == "");
  CHECK(check("train start fashion-mnist depth=x").find("depth=x: expected a whole number") != std::string::npos);
  CHECK(check("train start fashion-mnist depth").find("'depth' is not key=value") != std::string::npos);
  CHECK(check("train wait").find("train wait STEPS") != std::string::npos);
  CHECK(check("train jump").find("expects: train start") != std::string::npos);

  const std::vector<BundledModel> models = bundled_models(bundled_models_folder());
  REQUIRE(models.size() >= 2);
  std::vector<std::string> names;
  for (const BundledModel& m : models) {
    CHECK(m.error == "");
    CHECK(m.description != "");
    // The name comes from the file's config, so it matches what load_model reads.
    CHECK(load_model(m.path).config.name == m.name);
    names.push_back(m.name);
  }
  CHECK(std::find(names.begin(), names.end(), "vitlens-designed-4head") != names.end());
  CHECK(std::find(names.begin(), names.end(), "vitlens-random-4head") != names.end());

  // model-menu opens the listed file by name; an unknown name lists the known ones.
  App app;
  ScriptCommand c;
  c.verb = "model-menu";
  c.args = {"vitlens-random-4head"};
  CHECK(apply_train_command(app, c) == "");
  CHECK(app.requests.open_model == random_model_path());
  c.args = {"nope"};
  CHECK(apply_train_command(app, c).find("no bundled model named 'nope'") == 0);
}

// ---------------------------------------------------------------------------------------------
// Masked patch prediction (data photos[:DIR]) in the same session.

namespace {

// 5 photos (test::photo_folder's, less the subfolder's messi5: limit 5 keeps the first five by
// path), val-split 0.1 holds out 1, crops 16 x 4 photos / batch 16 = 4 steps per epoch, 16 x 16
// crops in 4 x 4 patches, a 1-block encoder of 2 heads and a 1-block decoder.
TrainSettings tiny_mae_settings(const std::string& dir) {
  TrainSettings s;
  s.data = "photos:" + dir;
  s.limit = 5;
  s.img_size = 16;
  s.depth = 1;
  s.embed_dim = 16;
  s.heads = 2;
  s.patch = 4;
  s.batch = 16;
  s.epochs = 5;
  s.lr = 5e-3;
  s.warmup = 0.25;
  s.seed = 4;
  s.threads = 1;
  s.probe_every = 2;
  s.decoder_dim = 16;
  s.decoder_heads = 2;
  s.crops_per_photo = 16;
  return s;
}

}  // namespace

TEST_CASE("train session: MAE on photos records the loss, refreshes the probe, saves an encoder", "[train_session][mae]") {
  const std::string dir = test::photo_folder("train-session-mae");
  TrainSession session;
  REQUIRE(session.start(tiny_mae_settings(dir)) == "");
  session.pause();  // before the photos are in: the run starts paused at step 0
  TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) {
    return (x.state == TrainState::Paused && x.parameters > 0) || x.state == TrainState::Failed;
  });
  REQUIRE(s.error == "");
  REQUIRE(s.state == TrainState::Paused);
  CHECK(s.mae);
  CHECK(s.train_images == 4);
  CHECK(s.eval_images == 1);
  CHECK(s.eval_name == "val");
  CHECK(s.total_steps == 20);
  CHECK(s.steps_per_epoch == 4);
  CHECK(s.stat_steps == std::vector<int64_t>{0});
  CHECK(s.probe.what.find("held-out photo ") == 0);
  CHECK(s.probe.label == -1);
  session.resume();
  s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Finished || x.state == TrainState::Failed; });
  REQUIRE(s.error == "");
  REQUIRE(s.state == TrainState::Finished);
  REQUIRE(s.loss.size() == 20);
  for (float l : s.loss) CHECK(std::isfinite(l));
  // MAE has no accuracy: nothing is recorded rather than zeros.
  CHECK(s.accuracy.empty());
  CHECK(s.eval_accuracy.empty());
  // One validation pass (fixed crops and masks of the held-out photo) per epoch.
  REQUIRE(s.eval_steps == std::vector<int64_t>{4, 8, 12, 16, 20});
  REQUIRE(s.eval_loss.size() == 5);
  for (float l : s.eval_loss) CHECK(std::isfinite(l));
  // The initial weights predict nearly flat patches, which score about (K - 1) / K = 0.98 on
  // norm-pix targets (test_train_mae.cpp); 20 steps at lr 5e-3 must bring the last 4 below that.
  float last = 0.0f;
  for (size_t i = 16; i < 20; ++i) last += s.loss[i] / 4.0f;
  std::printf("MAE in the Train window: loss %.4f (step 1) -> %.4f (steps 17-20), val %.4f -> %.4f\n", s.loss[0], last,
              s.eval_loss.front(), s.eval_loss.back());
  CHECK(s.loss[0] > 0.9f);
  CHECK(last < 0.95f * s.loss[0]);
  // The probe: refreshed every 2 steps, 4 x 4 patch maps of 2 heads.
  REQUIRE(s.stat_steps == std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20});
  REQUIRE(s.entropy.size() == 2);
  check_probe_series(s, 11, 20);
  REQUIRE(s.probe.heads.size() == 2);
  REQUIRE(s.probe.image_rgb.size() == 16u * 16u * 3u);

  // Saved as the CLI saves MAE runs: the model file is the encoder (no head), the decoder lives in
  // the state file; it opens through the ordinary loader and the MAE checkpoint reader.
  const std::string path = dir + "/mae.safetensors";
  REQUIRE(session.save(path) == "");
  CHECK(session.snapshot().checkpoint == path);
  CHECK(checkpoint_objective(path) == "mae");
  const SavedTraining saved = load_checkpoint(path, "mae");
  const MaeOptions options = MaeOptions::from_json(saved.options);
  CHECK(options.shape.decoder_dim == 16);
  CHECK(options.shape.mask_ratio == 0.75);
  CHECK(options.crops_per_photo == 16);
  CHECK(saved.recipe.flip);  // the CLI's default for photos
  CHECK(saved.recipe.label_smoothing == 0.0);
  CHECK(saved.position.step == 20);
  CHECK(saved.training.at("objective") == "mae");
  CHECK(saved.training.at("val_photos") == 1);
  CHECK(saved.training.contains("val_loss"));
  const VitModel model = load_model(path);
  CHECK(model.w.num_classes == 0);
  CHECK(model.config.name == "vitlens-mae");

  // The encoder run on the image the window showed: its maps equal the window's, and each head's
  // attention received over the patches plus the class token's share sums to 1.
  cv::Mat rgb(16, 16, CV_32FC3);
  std::copy(s.probe.image_rgb.begin(), s.probe.image_rgb.end(), reinterpret_cast<float*>(rgb.data));
  const PreparedImage prepared = prepare_image(rgb, model.config, 0);
  const ForwardResult result = forward(model, prepared.grid, ForwardOptions{});
  MapRequest request;
  request.layer = 0;
  const HeadMaps maps = attention_maps(model, result, request);
  REQUIRE(maps.heads.size() == 2);
  double worst = 0.0;
  for (size_t h = 0; h < 2; ++h) {
    worst = std::max(worst, static_cast<double>((s.probe.heads[h] - maps.heads[h]).cwiseAbs().maxCoeff()));
    CHECK(s.probe.heads[h].minCoeff() >= 0.0f);
    CHECK(s.probe.heads[h].sum() + maps.cls_weight[h] == Approx(1.0).margin(1e-5));
  }
  INFO("largest difference " << worst);
  CHECK(worst <= 1e-6);
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: MAE pause, resume and stop, the stopped encoder saves", "[train_session][mae]") {
  const std::string dir = test::photo_folder("train-session-mae-stop");
  TrainSession session;
  TrainSettings settings = tiny_mae_settings(dir);
  settings.epochs = 1000;  // 4000 steps: far more than run before the stop arrives
  REQUIRE(session.start(settings) == "");
  TrainSnapshot s = wait_for(session, [](const TrainSnapshot& x) { return x.step >= 1 || x.state == TrainState::Failed; });
  REQUIRE(s.step >= 1);
  session.pause();
  s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Paused; });
  REQUIRE(s.state == TrainState::Paused);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the step in flight (if any) lands
  const int64_t paused_at = session.snapshot().step;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(session.snapshot().step == paused_at);
  session.resume();
  s = wait_for(session, [&](const TrainSnapshot& x) { return x.step >= paused_at + 2 || x.state == TrainState::Failed; });
  CHECK(s.state == TrainState::Running);
  CHECK(s.step >= paused_at + 2);
  session.stop();
  s = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Stopped; });
  REQUIRE(s.state == TrainState::Stopped);
  const int64_t stopped_at = s.step;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(session.snapshot().step == stopped_at);
  CHECK(stopped_at < s.total_steps);
  CHECK(s.loss.size() == static_cast<size_t>(stopped_at));
  const std::string path = dir + "/stopped.safetensors";
  REQUIRE(session.save(path) == "");
  CHECK(load_checkpoint(path, "mae").position.step == stopped_at);
  CHECK(load_model(path).config.name == "vitlens-mae");
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: bad MAE settings and photo folders are one line each", "[train_session][mae]") {
  const std::string dir = test::photo_folder("train-session-mae-bad");
  auto one_line = [](const std::string& text) { return !text.empty() && text.find('\n') == std::string::npos; };
  TrainSession session;
  TrainSettings s = tiny_mae_settings(dir);
  s.mask_ratio = 0.0;
  CHECK(session.start(s) == "mask-ratio must be in (0, 1), got 0.000000");
  s.mask_ratio = 1.0;
  CHECK(session.start(s) == "mask-ratio must be in (0, 1), got 1.000000");
  s = tiny_mae_settings(dir);
  s.decoder_dim = 30;
  s.decoder_heads = 4;
  CHECK(session.start(s) == "decoder-dim 30 is not divisible by decoder-heads 4");
  s.decoder_heads = 0;  // the window's field can hold anything: refused, never a division by zero
  CHECK(session.start(s) == "decoder-heads must be in [1, 64], got 0");
  s = tiny_mae_settings(dir);
  s.heads = 0;
  CHECK(session.start(s) == "heads must be in [1, 64], got 0");
  s = tiny_mae_settings(dir);
  s.mask_ratio = 0.99;  // int(16 x 0.01) = 0 patches visible
  const std::string visible = session.start(s);
  CHECK(one_line(visible));
  CHECK(visible.find("visible") != std::string::npos);
  s = tiny_mae_settings(dir);
  s.label_smoothing = 0.1;  // the classifier's default: ignored for photos, as the CLI ignores its default
  CHECK(check_train_settings(s) == "");
  s = tiny_mae_settings(dir);
  s.drop_path = 0.1;
  CHECK(session.start(s) == "drop-path applies to classifiers, not to photos");
  CHECK(session.snapshot().state == TrainState::Idle);  // nothing started

  TrainSettings parsed;
  CHECK(set_train_option(parsed, "mask-ratio", "x") == "mask-ratio=x: expected a number");
  CHECK(set_train_option(parsed, "decoder-depth", "0") == "decoder-depth=0: expected a whole number in [1, 16]");
  CHECK(set_train_option(parsed, "crops-per-photo", "0") == "crops-per-photo=0: expected a whole number in [1, 100000]");
  CHECK(set_train_option(parsed, "decoder-dim", "64") == "");
  CHECK(set_train_option(parsed, "mask-ratio", "0.5") == "");
  CHECK(parsed.decoder_dim == 64);
  CHECK(parsed.mask_ratio == 0.5);
  CHECK(parsed.flip_crops);
  CHECK(set_train_option(parsed, "augment", "off") == "");  // the CLI's --no-augment: no flipped crops
  CHECK_FALSE(parsed.flip_crops);
  // The defaults are the CLI's.
  const TrainSettings defaults;
  CHECK(defaults.depth == 4);  // the default recipe (README, "Training")
  CHECK(defaults.epochs == 24);
  CHECK(defaults.label_smoothing == 0.1);
  CHECK(defaults.augment);
  CHECK(defaults.crop_pad == 1);
  CHECK(defaults.drop_path == 0.0);
  CHECK(defaults.mask_ratio == 0.75);
  CHECK(defaults.decoder_dim == 32);
  CHECK(defaults.decoder_depth == 1);
  CHECK(defaults.decoder_heads == 4);
  CHECK(defaults.crops_per_photo == 16);

  // Folders are read on the worker: a missing one, one without photos, one with only a non-image.
  const std::string empty = dir + "/empty", junk = dir + "/junk";
  std::filesystem::create_directories(empty);
  std::filesystem::create_directories(junk);
  std::ofstream(junk + "/notes.txt") << "not an image\n";
  for (const auto& [data, expected] : {std::pair<std::string, std::string>{"photos:/no/such/dir", "/no/such/dir: no such folder"},
                                       {"photos:" + empty, empty + ": has no readable photo"},
                                       {"photos:" + junk, junk + ": has no readable photo"}}) {
    INFO(data);
    s = tiny_mae_settings(dir);
    s.data = data;
    REQUIRE(session.start(s) == "");
    const TrainSnapshot f = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Failed; });
    REQUIRE(f.state == TrainState::Failed);
    CHECK(f.error.find(expected) == 0);
    CHECK(one_line(f.error));
  }
  // Too few crops for one batch: the trainer refuses, one line.
  s = tiny_mae_settings(dir);
  s.crops_per_photo = 1;
  REQUIRE(session.start(s) == "");
  const TrainSnapshot few = wait_for(session, [](const TrainSnapshot& x) { return x.state == TrainState::Failed; });
  REQUIRE(few.state == TrainState::Failed);
  CHECK(one_line(few.error));

  // The script takes the same words.
  auto check = [](const std::string& line) {
    try {
      parse_script(line + "\n", "t");
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  CHECK(check("train start photos mask-ratio=0.6 decoder-dim=16 decoder-depth=2 decoder-heads=2 crops-per-photo=8") == "");
  CHECK(check("train start photos:/tmp/x crops-per-photo=0").find("crops-per-photo=0: expected a whole number") !=
        std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("train session: a Save keeps every step's loss up to the cap, then the latest", "[train_session]") {
  nlohmann::json record = {{"train_loss_first_step", 7}};  // left from an earlier, longer run
  std::vector<float> losses(1000);
  for (size_t i = 0; i < losses.size(); ++i) losses[i] = 2.0f + static_cast<float>(i);
  put_train_losses(record, losses);
  CHECK(record["train_loss"].get<std::vector<float>>() == losses);
  CHECK_FALSE(record.contains("train_loss_first_step"));

  losses.resize(kMaxSavedLosses + 5);
  for (size_t i = 0; i < losses.size(); ++i) losses[i] = static_cast<float>(i + 1);  // step s has loss s
  put_train_losses(record, losses);
  const std::vector<float> kept = record["train_loss"].get<std::vector<float>>();
  REQUIRE(kept.size() == kMaxSavedLosses);
  CHECK(record["train_loss_first_step"].get<int64_t>() == 6);
  CHECK(kept.front() == 6.0f);
  CHECK(kept.back() == static_cast<float>(kMaxSavedLosses + 5));
  CHECK(record.dump().size() < (size_t{1} << 24) / 8);  // far below the Model menu's 16 MiB header limit
}

TEST_CASE("train session: an ImageFolder's skipped files and links not followed are in the first message", "[train_session][links]") {
  const std::string dir = test::temp_dir("session-folder-links");
  for (const char* c : {"/a", "/b"}) {
    std::filesystem::create_directories(dir + c);
    for (int i = 0; i < 4; ++i)
      REQUIRE(cv::imwrite(dir + c + "/" + std::to_string(i) + ".png", cv::Mat(8, 8, CV_8UC3, cv::Scalar(30 * i, 60, 90))));
  }
  std::filesystem::create_directory_symlink("/", dir + "/a/root");
  std::filesystem::create_directory_symlink(".", dir + "/b/self");
  std::ofstream(dir + "/b/notes.png") << "not an image";
  TrainSettings s = tiny_settings();
  s.data = dir;
  s.img_size = 8;
  s.patch = 4;
  s.batch = 4;
  s.val_split = 0.0;
  s.epochs = 5000;  // 10,000 steps: the run cannot finish (and replace its first message) before pause() lands
  TrainSession session;
  REQUIRE(session.start(s) == "");
  session.pause();  // the run starts paused at step 0, its first message kept
  const TrainSnapshot snap = wait_for(session, [](const TrainSnapshot& x) {
    return (x.state == TrainState::Paused && x.parameters > 0) || x.state == TrainState::Failed;
  });
  REQUIRE(snap.error == "");
  CHECK(snap.train_images == 8);
  CHECK_THAT(snap.message, Catch::Contains("on 8 images; 1 unreadable file(s) skipped; not following 1 link to a folder outside "
                                           "the data folder (" + dir + "/a/root: a link to /, outside " + dir + "/a)"));
  session.stop();
  std::filesystem::remove_all(dir);
}
