// The training loop end to end: a short run learns, resume is bit-exact, threads do not change the
// numbers, checkpoints open as ordinary models, and `vitlens train` reports bad input in one line.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"
#include "core/train/classify_objective.hpp"
#include "core/train/trainer.hpp"

using namespace vitlens;

namespace {

VitConfig fm_config(int depth = 1, int dim = 32, int heads = 4) {
  VitConfig c = test::vit_config("test-trained", 4, dim, heads, depth, 28);
  c.description = "trained in a test";
  return c;
}

// A small labelled set made here: class k is a bright square at one of 4 places plus noise, so
// tests that only need *some* data do not depend on the Fashion-MNIST package.
ImageSet synthetic_set(int n, uint64_t seed) {
  ImageSet s;
  s.height = s.width = 28;
  s.class_names = {"top-left", "top-right", "bottom-left", "bottom-right"};
  s.source = "synthetic";
  Rng rng(seed);
  s.pixels.assign(static_cast<size_t>(n) * 3 * 28 * 28, 0.0f);
  for (int i = 0; i < n; ++i) {
    const int label = rng.below(4);
    s.labels.push_back(label);
    float* img = s.pixels.data() + static_cast<size_t>(i) * 3 * 28 * 28;
    const int y0 = (label / 2) * 14 + rng.below(4), x0 = (label % 2) * 14 + rng.below(4);
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 28; ++y)
        for (int x = 0; x < 28; ++x) {
          const bool in = y >= y0 && y < y0 + 8 && x >= x0 && x < x0 + 8;
          img[(c * 28 + y) * 28 + x] = (in ? 0.8f : 0.1f) + 0.1f * static_cast<float>(rng.uniform());
        }
  }
  return s;
}

using Run = test::ShellRun;
using test::count_lines;
using test::slurp;

// Runs the real binary; `env` (NAME=VALUE ...) is added to its environment.
Run run_vitlens(const std::string& args, const std::string& env = "") {
  static const std::string dir = test::temp_dir("train-cli");
  return test::run_vitlens_shell(dir, args, env);
}

bool have_fashion_mnist() {
  struct stat st {};
  return ::stat((default_fashion_mnist_dir() + "/train-labels-idx1-ubyte.gz").c_str(), &st) == 0 ||
         ::stat((default_fashion_mnist_dir() + "/train-labels-idx1-ubyte").c_str(), &st) == 0;
}

// Two runs' gradients, entry by entry: the largest difference must be within 1e-5 of the
// largest entry of `ref` (which must not be all zero).
void check_same_gradient(const std::vector<float>& ref, const std::vector<float>& got) {
  REQUIRE(ref.size() == got.size());
  float largest = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < ref.size(); ++i) {
    largest = std::max(largest, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(ref[i] - got[i]));
  }
  REQUIRE(largest > 0.0f);
  CHECK(diff <= 1e-5f * largest);
}

}  // namespace

TEST_CASE("train: a short Fashion-MNIST run lowers the loss and beats chance by far", "[train][loop]") {
  REQUIRE(have_fashion_mnist());  // scripts/setup.sh installs dataset-fashion-mnist
  const ImageSet train_set = load_fashion_mnist(default_fashion_mnist_dir(), true, 4000);
  const ImageSet test_set = load_fashion_mnist(default_fashion_mnist_dir(), false, 1000);
  Recipe r;
  r.epochs = 5;
  r.batch = 64;
  r.lr = 2e-3;
  r.warmup_epochs = 0.5;
  r.label_smoothing = 0.0;
  r.augment = false;
  r.seed = 3;
  Trainer trainer(std::make_unique<ClassifyObjective>(fm_config(2, 32, 4), r, &train_set, &test_set));
  REQUIRE(trainer.total_steps() == 5 * (4000 / 64));
  const EvalReport before = trainer.objective_as<ClassifyObjective>().evaluate_set(test_set);
  double first = 0.0, last = 0.0;
  const int window = 20;
  while (!trainer.finished()) {
    const StepReport s = trainer.step();
    if (s.step <= window) first += s.loss / window;
    if (s.step > trainer.total_steps() - window) last += s.loss / window;
  }
  const EvalReport after = trainer.objective_as<ClassifyObjective>().evaluate_set(test_set);
  std::printf("short run: %lld steps, mean loss of the first %d steps %.3f, of the last %d %.3f; test accuracy "
              "%.1f%% before, %.1f%% after (1000 test images)\n",
              static_cast<long long>(trainer.total_steps()), window, first, window, last, 100 * before.accuracy,
              100 * after.accuracy);
  CHECK(last < 0.65 * first);
  CHECK(after.accuracy > 0.45);  // chance is 0.10; measured 0.595
  CHECK(after.loss < before.loss);
}

TEST_CASE("train: resume after N steps reproduces the uninterrupted run bit for bit", "[train][resume]") {
  const ImageSet train_set = synthetic_set(200, 5);
  Recipe r;
  r.epochs = 2;
  r.batch = 32;  // 6 steps per epoch, 12 in all
  r.seed = 9;
  r.augment = true;  // the Rng's state must travel with the checkpoint
  const VitConfig config = fm_config();

  Trainer straight(std::make_unique<ClassifyObjective>(config, r, &train_set, nullptr));
  while (!straight.finished()) straight.step();

  const std::string dir = test::temp_dir("resume");
  const std::string path = dir + "/last.safetensors";
  {
    Trainer first(std::make_unique<ClassifyObjective>(config, r, &train_set, nullptr));
    for (int i = 0; i < 4; ++i) first.step();  // stop in the middle of the first epoch
    save_checkpoint(first, path, {{"data", "synthetic"}});
  }
  const SavedTraining saved = load_checkpoint(path);
  CHECK(saved.position.step == 4);
  CHECK(saved.position.position == 4);
  Trainer resumed(std::make_unique<ClassifyObjective>(saved.config, saved.recipe, &train_set, nullptr));
  resumed.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  while (!resumed.finished()) resumed.step();

  CHECK(resumed.position().step == straight.position().step);
  CHECK(resumed.params() == straight.params());  // bitwise: std::vector<float> ==
  CHECK(resumed.optimizer().m == straight.optimizer().m);
  CHECK(resumed.optimizer().v == straight.optimizer().v);

  // The checkpoint is an ordinary model file: the viewer's loader takes it, head included.
  const VitModel model = load_model(path);
  CHECK(model.w.num_classes == 4);
  CHECK(model.config.depth == 1);
}

TEST_CASE("train: the same run for 1 and 2 threads", "[train][threads]") {
  const ImageSet train_set = synthetic_set(96, 6);
  // 2 parts: one after the other on 1 and 4 threads, side by side on 2 and 3.
  // 4 parts (the default): one after the other on 1 and 3 threads, side by side on 2 (each thread
  // taking the next part when done with one) and on 4.
  // 6 parts (of 5 or 6 images): side by side on 2 and 3 threads, one after the other on 1 and 4.
  // With drop path (each part draws its own images' masks) and 2 blocks, and the evaluation through
  // the parts after training (the test images in parts of the same kind).
  for (int shards : {2, 4, 6}) {
    CAPTURE(shards);
    std::vector<std::vector<float>> params;
    std::vector<double> losses;
    for (int threads : {1, 2, 3, 4}) {
      Recipe r;
      r.epochs = 1;
      r.batch = 32;
      r.threads = threads;
      r.shards = shards;
      r.drop_path = 0.3;
      Trainer t(std::make_unique<ClassifyObjective>(fm_config(2), r, &train_set, nullptr));
      while (!t.finished()) t.step();
      params.push_back(t.params());
      losses.push_back(t.objective_as<ClassifyObjective>().evaluate_set(train_set).loss);
    }
    CHECK(params[0] == params[1]);
    CHECK(params[0] == params[2]);
    CHECK(params[0] == params[3]);
    CHECK(losses[0] == losses[1]);
    CHECK(losses[0] == losses[2]);
    CHECK(losses[0] == losses[3]);
  }
}

TEST_CASE("train: a batch split into parts has the whole batch's loss, gradient and evaluation", "[train][shards]") {
  const ImageSet train_set = synthetic_set(64, 8);
  // Odd batches split unevenly (5 = 2 + 3, 7 = 2 + 2 + 3); a batch of 1 cannot split.
  for (const std::pair<int, int>& parts : {std::pair{32, 2}, {5, 2}, {7, 3}, {1, 2}, {9, 64}}) {
    const int batch = parts.first, shards = parts.second;  // named copies: lambdas below capture them
    CAPTURE(batch, shards);
    auto recipe = [&](int s) {
      Recipe r;
      r.epochs = 1;
      r.batch = batch;
      r.threads = 2;
      r.shards = s;
      r.label_smoothing = 0.1;
      return r;
    };
    Trainer whole(std::make_unique<ClassifyObjective>(fm_config(), recipe(1), &train_set, nullptr));
    Trainer split(std::make_unique<ClassifyObjective>(fm_config(), recipe(shards), &train_set, nullptr));
    REQUIRE(whole.params() == split.params());
    // Evaluation through the parts: the same images counted once each, the same mean loss.
    const EvalReport ea = whole.objective_as<ClassifyObjective>().evaluate_set(train_set), eb = split.objective_as<ClassifyObjective>().evaluate_set(train_set);
    CHECK(ea.images == 64);
    CHECK(eb.images == 64);
    CHECK(eb.accuracy == Approx(ea.accuracy).margin(1.0 / 64 + 1e-12));
    CHECK(eb.loss == Approx(ea.loss).epsilon(1e-6));
    const StepReport a = whole.step(), b = split.step();
    CHECK(b.loss == Approx(a.loss).epsilon(1e-6));
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-5));
    CHECK(b.accuracy == a.accuracy);
    // The clipped gradient the update used, component by component, against its largest entry.
    check_same_gradient(whole.grads(), split.grads());
  }
}

TEST_CASE("train: the recipe's shards are checked, saved, and absent from old checkpoints means 1", "[train][shards]") {
  Recipe r;
  CHECK(r.shards == 4);
  r.shards = 0;
  CHECK_THAT(r.validate(), Catch::Contains("shards 0 is not in [1, 64]"));
  r.shards = 65;
  CHECK_THAT(r.validate(), Catch::Contains("shards 65"));
  r.shards = 3;
  CHECK(r.validate().empty());
  nlohmann::json j = r.to_json();
  CHECK(Recipe::from_json(j).shards == 3);
  j.erase("shards");
  CHECK(Recipe::from_json(j).shards == 1);
}

TEST_CASE("train: drop path is checked, saved, absent from old checkpoints means 0", "[train][droppath]") {
  Recipe r;
  CHECK(r.drop_path == 0.0);
  r.drop_path = 1.0;
  CHECK_THAT(r.validate(), Catch::Contains("drop_path 1 is not in [0, 1)"));
  r.drop_path = -0.5;
  CHECK_THAT(r.validate(), Catch::Contains("drop_path"));
  r.drop_path = std::nan("");
  CHECK_THAT(r.validate(), Catch::Contains("drop_path"));
  r.drop_path = 0.25;
  CHECK(r.validate().empty());
  nlohmann::json j = r.to_json();
  CHECK(Recipe::from_json(j).drop_path == 0.25);
  j.erase("drop_path");
  CHECK(Recipe::from_json(j).drop_path == 0.0);
}

TEST_CASE("train: drop path changes training steps only, resumes bit for bit, and splits into parts",
          "[train][droppath]") {
  const ImageSet train_set = synthetic_set(96, 12);
  auto recipe = [](double rate, int shards) {
    Recipe r;
    r.epochs = 2;
    r.batch = 32;  // 3 steps per epoch
    r.seed = 4;
    r.threads = 2;
    r.shards = shards;
    r.drop_path = rate;
    return r;
  };
  const VitConfig config = fm_config(3);  // block 0 keeps p = 0, blocks 1 and 2 draw
  Trainer plain(std::make_unique<ClassifyObjective>(config, recipe(0.0, 1), &train_set, nullptr));
  Trainer dropped(std::make_unique<ClassifyObjective>(config, recipe(0.5, 1), &train_set, nullptr));
  REQUIRE(plain.params() == dropped.params());
  // Evaluation never drops: the same weights give the same loss.
  CHECK(plain.objective_as<ClassifyObjective>().evaluate_set(train_set).loss == dropped.objective_as<ClassifyObjective>().evaluate_set(train_set).loss);
  const StepReport a = plain.step(), b = dropped.step();
  CHECK(a.loss != b.loss);  // some branch of some image was dropped in the first step
  CHECK(plain.params() != dropped.params());
  // After the step, net() is clean: a probe forward of a batch of the same size drops nothing.
  const EvalReport after = dropped.objective_as<ClassifyObjective>().evaluate_set(train_set), again = dropped.objective_as<ClassifyObjective>().evaluate_set(train_set);
  CHECK(after.loss == again.loss);

  // A rate whose draws keep everything is the plain run: p = 1e-12 keeps every branch (scaled by
  // 1 / (1 - p), which rounds to 1 in float), so the runs agree bit for bit.
  Trainer tiny(std::make_unique<ClassifyObjective>(config, recipe(1e-12, 1), &train_set, nullptr));
  Trainer plain2(std::make_unique<ClassifyObjective>(config, recipe(0.0, 1), &train_set, nullptr));
  tiny.step();
  plain2.step();
  CHECK(tiny.params() == plain2.params());

  // Resume in the middle of the first epoch continues the same masks.
  Trainer straight(std::make_unique<ClassifyObjective>(config, recipe(0.3, 2), &train_set, nullptr));
  while (!straight.finished()) straight.step();
  const std::string dir = test::temp_dir("droppath-resume");
  const std::string path = dir + "/last.safetensors";
  {
    Trainer first(std::make_unique<ClassifyObjective>(config, recipe(0.3, 2), &train_set, nullptr));
    for (int i = 0; i < 2; ++i) first.step();
    save_checkpoint(first, path, {{"data", "synthetic"}});
  }
  const SavedTraining saved = load_checkpoint(path);
  CHECK(saved.recipe.drop_path == 0.3);
  Trainer resumed(std::make_unique<ClassifyObjective>(saved.config, saved.recipe, &train_set, nullptr));
  resumed.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  while (!resumed.finished()) resumed.step();
  CHECK(resumed.params() == straight.params());

  // Parts see their own images' masks: 2 and 3 parts give the whole batch's step up to rounding.
  for (int shards : {2, 3}) {
    CAPTURE(shards);
    Trainer whole(std::make_unique<ClassifyObjective>(config, recipe(0.4, 1), &train_set, nullptr));
    Trainer split(std::make_unique<ClassifyObjective>(config, recipe(0.4, shards), &train_set, nullptr));
    const StepReport w = whole.step(), s = split.step();
    CHECK(s.loss == Approx(w.loss).epsilon(1e-6));
    CHECK(s.grad_norm == Approx(w.grad_norm).epsilon(1e-5));
    check_same_gradient(whole.grads(), split.grads());
  }
}

TEST_CASE("train: a damaged state file or a pair from different steps is refused", "[train][resume]") {
  const ImageSet train_set = synthetic_set(64, 7);
  Recipe r;
  r.epochs = 1;
  r.batch = 16;
  const std::string dir = test::temp_dir("resume-bad");
  const std::string path = dir + "/last.safetensors";
  Trainer t(std::make_unique<ClassifyObjective>(fm_config(), r, &train_set, nullptr));
  t.step();
  save_checkpoint(t, path, {{"data", "synthetic"}});
  const std::string state = slurp(checkpoint_state_path(path));
  t.step();
  save_checkpoint(t, dir + "/other.safetensors", {{"data", "synthetic"}});
  // The newer state beside the older model: refused, naming the step mismatch.
  std::rename((dir + "/other.state.safetensors").c_str(), checkpoint_state_path(path).c_str());
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("different steps"));
  {
    std::ofstream out(checkpoint_state_path(path), std::ios::binary | std::ios::trunc);
    out << state.substr(0, state.size() / 2);
  }
  CHECK_THROWS_AS(load_checkpoint(path), Error);
  std::remove(checkpoint_state_path(path).c_str());
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("no training state"));
}

TEST_CASE("train: a checkpoint without an objective tag (older files) loads as a classifier's", "[train][resume]") {
  const ImageSet train_set = synthetic_set(64, 7);
  Recipe r;
  r.epochs = 2;
  r.batch = 16;
  const std::string dir = test::temp_dir("resume-untagged");
  const std::string path = dir + "/last.safetensors";
  Trainer straight(std::make_unique<ClassifyObjective>(fm_config(), r, &train_set, nullptr));
  Trainer first(std::make_unique<ClassifyObjective>(fm_config(), r, &train_set, nullptr));
  for (int i = 0; i < 3; ++i) first.step();
  save_checkpoint(first, path, {{"data", "synthetic"}});
  // Take the tag out of both files, as checkpoints written before objectives had one.
  SafetensorsFile model = read_safetensors(path), state = read_safetensors(checkpoint_state_path(path));
  nlohmann::json record = nlohmann::json::parse(model.metadata.at("training"));
  REQUIRE(record.at("objective") == "classify");
  REQUIRE(state.metadata.at("objective") == "classify");
  record.erase("objective");
  model.metadata["training"] = record.dump();
  state.metadata.erase("objective");
  write_safetensors(path, model);
  write_safetensors(checkpoint_state_path(path), state);
  const SavedTraining saved = load_checkpoint(path, "classify");
  CHECK(saved.objective == "classify");
  CHECK(saved.num_classes == train_set.num_classes());
  Trainer resumed(std::make_unique<ClassifyObjective>(saved.config, saved.recipe, &train_set, nullptr));
  resumed.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  while (!straight.finished()) straight.step();
  while (!resumed.finished()) resumed.step();
  CHECK(resumed.params() == straight.params());  // bitwise
  // A state whose tag is not the model's was not saved with it.
  state.metadata["objective"] = "mae";
  write_safetensors(checkpoint_state_path(path), state);
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("not saved together"));
}

TEST_CASE("train CLI: bad input gets one clear line", "[train][cli]") {
  const std::string dir = test::temp_dir("train-bad");
  struct Case {
    std::string args, expect;
    int code;
  };
  const std::string empty_class = dir + "/folder_empty";
  const std::string one_class = dir + "/folder_one";
  ::mkdir(empty_class.c_str(), 0755);
  ::mkdir((empty_class + "/a").c_str(), 0755);
  ::mkdir((empty_class + "/b").c_str(), 0755);
  ::mkdir(one_class.c_str(), 0755);
  ::mkdir((one_class + "/only").c_str(), 0755);
  const std::vector<Case> cases = {
      {"train --out " + dir + "/r", "--data is required", 2},
      {"train --data fashion-mnist", "--out", 2},
      {"train --data fashion-mnist --out " + dir + "/r --lr 0", "--lr", 2},
      {"train --data fashion-mnist --out " + dir + "/r --lr nan", "--lr", 2},
      {"train --data fashion-mnist --out " + dir + "/r --embed-dim 50 --heads 4", "divisible", 2},
      {"train --data fashion-mnist --out " + dir + "/r --patch 5", "multiple of --patch", 2},
      {"train --data fashion-mnist --out " + dir + "/r --depth 0", "--depth", 2},
      {"train --data fashion-mnist --out " + dir + "/r --val-split 1", "--val-split", 2},
      {"train --data fashion-mnist --out " + dir + "/r --img-size 32", "--img-size", 2},
      {"train --data " + dir + "/nowhere --out " + dir + "/r", "neither", 1},
      {"train --data " + empty_class + " --out " + dir + "/r", "", 1},
      {"train --data " + one_class + " --out " + dir + "/r", "", 1},
      {"train --data fashion-mnist --resume " + dir + "/missing.safetensors", "missing.safetensors", 1},
      {"train --data fashion-mnist --resume " + dir + "/x.safetensors --lr 0.1", "cannot change on --resume", 2},
      {"train --data fashion-mnist --out " + dir + "/r --name ''", "--name: an empty value", 2},
      {"train --data fashion-mnist --out " + dir + "/r --no-augment --crop-pad 0", "--crop-pad applies with --augment", 2},
      {"train --data fashion-mnist --out " + dir + "/r --augment --crop-pad 17", "--crop-pad", 2},
      {"train --data fashion-mnist --out " + dir + "/r --pool max", "--pool", 2},
      {"train --data photos --out " + dir + "/r --pool avg", "--pool applies to classifiers", 2},
      {"train --data photos --out " + dir + "/r --augment --crop-pad 1", "--crop-pad applies to classifiers", 2},
      {"train --data fashion-mnist --resume " + dir + "/x.safetensors --crop-pad 1", "cannot change on --resume", 2},
      {"train --data fashion-mnist --out " + dir + "/r --name " + std::string(65, 'n'), "longer than 64", 2},
      {"train --data fashion-mnist --out " + dir + "/r --shards 0", "--shards", 2},
      {"train --data fashion-mnist --out " + dir + "/r --shards 65", "--shards", 2},
      {"train --data photos --out " + dir + "/r --shards 2", "--shards applies to classifiers", 2},
      {"train --data fashion-mnist --resume " + dir + "/x.safetensors --shards 1", "cannot change on --resume", 2},
      {"train --data fashion-mnist --out " + dir + "/r --drop-path 1", "--drop-path must be in [0, 1)", 2},
      {"train --data fashion-mnist --out " + dir + "/r --drop-path -0.1", "--drop-path must be in [0, 1)", 2},
      {"train --data fashion-mnist --out " + dir + "/r --drop-path nan", "--drop-path must be in [0, 1)", 2},
      {"train --data photos --out " + dir + "/r --drop-path 0.1", "--drop-path applies to classifiers", 2},
      {"train --data fashion-mnist --resume " + dir + "/x.safetensors --drop-path 0.1", "cannot change on --resume", 2},
      {"train --data fashion-mnist --out " + dir + "/a_file/r", "a_file/r: cannot create the run folder (Not a directory)", 1},
  };
  std::ofstream(dir + "/a_file") << "a user's file";
  for (const Case& c : cases) {
    const Run r = run_vitlens(c.args);
    INFO("vitlens " << c.args << "\nstderr: " << r.err);
    test::check_one_line_error(r, c.code, c.expect);
  }
  // A run folder is made with its parents, as export's --out is.
  REQUIRE(have_fashion_mnist());
  const Run nested = run_vitlens("train --data fashion-mnist --limit 256 --depth 1 --embed-dim 16 --heads 2 --batch 128 "
                                 "--epochs 1 --quiet --out " + dir + "/p/q/r");
  INFO(nested.err);
  CHECK(nested.code == 0);
  CHECK(std::filesystem::is_regular_file(dir + "/p/q/r/last.safetensors"));
}

TEST_CASE("train CLI: a tiny run writes a checkpoint that loads, a log, and --stop-after/--resume continue it",
          "[train][cli]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("train-run");
  const std::string common = " --data fashion-mnist --limit 256 --depth 1 --embed-dim 16 --heads 2 --batch 32 "
                             "--epochs 2 --threads 2 --quiet";
  // Uninterrupted: 2 epochs of 8 steps.
  Run a = run_vitlens("train" + common + " --out " + dir + "/a --name 'fm tiny' --description 'a test model'");
  INFO(a.err);
  REQUIRE(a.code == 0);
  CHECK(a.out.find("test accuracy") != std::string::npos);
  // Interrupted after 5 steps, then resumed.
  Run b1 = run_vitlens("train" + common + " --out " + dir + "/b --stop-after 5");
  INFO(b1.err);
  REQUIRE(b1.code == 0);
  Run b2 = run_vitlens("train --data fashion-mnist --quiet --resume " + dir + "/b/last.safetensors");
  INFO(b2.err);
  REQUIRE(b2.code == 0);
  const SafetensorsFile fa = read_safetensors(dir + "/a/last.safetensors");
  const SafetensorsFile fb = read_safetensors(dir + "/b/last.safetensors");
  REQUIRE(fa.tensors.size() == fb.tensors.size());
  for (const auto& [name, tensor] : fa.tensors) {
    INFO(name);
    CHECK(tensor.values == fb.tensors.at(name).values);
  }
  const auto record = nlohmann::json::parse(fa.metadata.at("training"));
  CHECK(record.at("test_accuracy").get<double>() > 0.0);
  CHECK(record.at("recipe").at("epochs") == 2);
  // The default recipe's augmentation and smoothing (README, "Training"), recorded.
  CHECK(record.at("recipe").at("augment") == true);
  CHECK(record.at("recipe").at("crop_pad") == 1);
  CHECK(record.at("recipe").at("label_smoothing") == 0.1);
  CHECK(record.at("recipe").at("drop_path") == 0.0);
  // Flips only: --augment --crop-pad 0 is what the recipe records (and a different run from a's).
  Run c = run_vitlens("train" + common + " --out " + dir + "/c --augment --crop-pad 0");
  INFO(c.err);
  REQUIRE(c.code == 0);
  const SafetensorsFile fc = read_safetensors(dir + "/c/last.safetensors");
  const auto flip_recipe = nlohmann::json::parse(fc.metadata.at("training")).at("recipe");
  CHECK(flip_recipe.at("augment") == true);
  CHECK(flip_recipe.at("crop_pad") == 0);
  CHECK(flip_recipe.at("flip") == true);
  CHECK(fc.tensors.at("head.weight").values != fa.tensors.at("head.weight").values);
  // --pool avg: a model without class token (the head reads the mean of the patch tokens).
  Run d = run_vitlens("train" + common + " --out " + dir + "/d --pool avg");
  INFO(d.err);
  REQUIRE(d.code == 0);
  const VitModel pooled = load_model(dir + "/d/last.safetensors");
  CHECK_FALSE(pooled.config.class_token);
  CHECK(pooled.w.num_classes == 10);
  CHECK(read_safetensors(dir + "/d/last.safetensors").tensors.count("cls_token") == 0);
  // The log: JSON lines with the documented keys.
  std::ifstream log(dir + "/a/log.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j.contains("step"));
    CHECK(j.contains("loss"));
    ++lines;
  }
  CHECK(lines >= 3);
  // `vitlens info` opens the checkpoint unchanged.
  Run info = run_vitlens("info --model " + dir + "/a/last.safetensors");
  CHECK(info.code == 0);
  CHECK(info.out.find("10 classes") != std::string::npos);
  // --name / --description label the model; a resumed run keeps the checkpoint's own.
  CHECK(load_model(dir + "/a/last.safetensors").config.name == "fm tiny");
  CHECK(load_model(dir + "/a/last.safetensors").config.description == "a test model");
  CHECK(load_model(dir + "/b/last.safetensors").config.name == "vitlens-trained");
  CHECK(load_model(dir + "/b/last.safetensors").config.description == "ViT trained by 'vitlens train' on fashion-mnist");
  // A finished run relabelled: same weights, the new name and description, the record kept.
  Run relabel = run_vitlens("train --data fashion-mnist --resume " + dir + "/a/last.safetensors --name relabelled "
                            "--description 'new words'");
  INFO(relabel.err);
  REQUIRE(relabel.code == 0);
  CHECK(relabel.out.find("relabelled") != std::string::npos);
  const SafetensorsFile fr = read_safetensors(dir + "/a/last.safetensors");
  for (const auto& [name, tensor] : fa.tensors) {
    INFO(name);
    CHECK(tensor.values == fr.tensors.at(name).values);
  }
  CHECK(load_model(dir + "/a/last.safetensors").config.name == "relabelled");
  CHECK(load_model(dir + "/a/last.safetensors").config.description == "new words");
  CHECK(nlohmann::json::parse(fr.metadata.at("training")).at("test_accuracy") == record.at("test_accuracy"));
}

TEST_CASE("train CLI: the record names the training ops' build, and resuming with another build warns",
          "[train][cli]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("train-ops");
  const std::string common = " --data fashion-mnist --limit 128 --depth 1 --embed-dim 8 --heads 2 --batch 32 "
                             "--epochs 1 --threads 1 --quiet";
  auto record_of = [&](const std::string& path) {
    return nlohmann::json::parse(read_safetensors(path).metadata.at("training"));
  };
  auto ops_of = [&](const std::string& path) { return record_of(path).at("training_ops").get<std::string>(); };
  // Rewrites a checkpoint's training record as `edit` leaves it (as an older build or a hand wrote it).
  auto edit_record = [&](const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    SafetensorsFile model = read_safetensors(path);
    nlohmann::json record = nlohmann::json::parse(model.metadata.at("training"));
    edit(record);
    model.metadata["training"] = record.dump();
    write_safetensors(path, model);
  };
  // VITLENS_ISA=portable runs the portable build whatever the CPU.
  Run p = run_vitlens("train" + common + " --out " + dir + "/p --stop-after 2", "VITLENS_ISA=portable");
  INFO(p.err);
  REQUIRE(p.code == 0);
  CHECK(ops_of(dir + "/p/last.safetensors") == "portable");
  // Resumed with the build this CPU picks: recorded, and a warning when it is another.
  const std::string here = test::train_ops_name(test::isas_here().back());
  const std::string resume = "train --data fashion-mnist --quiet --stop-after 1 --resume " + dir + "/p/last.safetensors";
  Run r = run_vitlens(resume);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(ops_of(dir + "/p/last.safetensors") == here);
  if (here != "portable")
    CHECK(r.err == "vitlens: warning: this run was trained with the portable training ops and continues with the " +
                       here + " ones (another CPU, or VITLENS_ISA): it will not be bit for bit the uninterrupted run\n");
  else
    CHECK(r.err.empty());
  // Resumed again with the same build: nothing to warn about.
  Run again = run_vitlens(resume);
  INFO(again.err);
  REQUIRE(again.code == 0);
  CHECK(again.err.empty());
  CHECK(ops_of(dir + "/p/last.safetensors") == here);
  // The record names the SGEMM's k block too (384 in the AVX2 build, 256 in the others). A record
  // without one was written when every build's was 256: the AVX2 build resuming it warns.
  CHECK(record_of(dir + "/p/last.safetensors").at("sgemm_k_block") == (here == "avx2" ? 384 : 256));
  bool avx2_here = false;
  for (KernelIsa isa : test::isas_here()) avx2_here = avx2_here || test::train_ops_name(isa) == "avx2";
  if (!avx2_here) return;
  // A new run (p has finished), one step, its record then made as an older build wrote it.
  Run q = run_vitlens("train" + common + " --out " + dir + "/q --stop-after 1", "VITLENS_ISA=avx2");
  INFO(q.err);
  REQUIRE(q.code == 0);
  const std::string q_path = dir + "/q/last.safetensors";
  CHECK(record_of(q_path).at("sgemm_k_block") == 384);
  edit_record(q_path, [](nlohmann::json& record) { record.erase("sgemm_k_block"); });
  const std::string resume_q = "train --data fashion-mnist --quiet --stop-after 1 --resume " + q_path;
  Run older = run_vitlens(resume_q, "VITLENS_ISA=avx2");
  INFO(older.err);
  REQUIRE(older.code == 0);
  CHECK(older.err == "vitlens: warning: this run was trained with matrix products in k blocks of 256 and continues "
                     "with blocks of 384 (another vitlens version): it will not be bit for bit the uninterrupted "
                     "run\n");
  CHECK(record_of(q_path).at("sgemm_k_block") == 384);
  Run same = run_vitlens(resume_q, "VITLENS_ISA=avx2");
  INFO(same.err);
  REQUIRE(same.code == 0);
  CHECK(same.err.empty());
  // A record edited by hand: a k block that is not a number is one line, nothing from it printed.
  edit_record(q_path, [](nlohmann::json& record) { record["sgemm_k_block"] = "384\n\x1b[2Jvitlens: fine"; });
  Run edited = run_vitlens(resume_q, "VITLENS_ISA=avx2");
  INFO(edited.err);
  REQUIRE(edited.code == 0);
  CHECK(edited.err == "vitlens: warning: this run was trained with matrix products in k blocks of an unreadable size "
                      "and continues with blocks of 384 (another vitlens version): it will not be bit for bit the "
                      "uninterrupted run\n");
}
