// Training checkpoints that survive a full disk, a kill and a closed terminal, and a damaged
// optimizer state refused with one line naming the file and the field:
//   - a save made to fail (ENOSPC) at each of its file operations, and killed (SIGKILL) at each:
//     afterwards exactly the previous pair or exactly the new one loads, the message says which,
//     and no temporary of ours is left after the next load or save;
//   - `vitlens train --resume` of a pair whose save was killed halfway resumes from the new pair;
//   - SIGHUP saves and stops `vitlens train` as SIGINT and SIGTERM do;
//   - a second `vitlens train` into a folder where one is running is refused before it writes;
//   - each damaged field of a state file is refused, in the library and through the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"
#include "models/safetensors.hpp"
#include "core/train/trainer.hpp"

using namespace vitlens;
using test::entries;
using test::hidden_entries;
using test::slurp;

namespace {

// 8 x 8 images of noise in two classes: enough for steps, saves and resumes.
ImageSet noise_set(int n) {
  ImageSet s;
  s.height = s.width = 8;
  s.class_names = {"even", "odd"};
  s.source = "noise";
  Rng rng(11);
  s.pixels.resize(static_cast<size_t>(n) * 3 * 8 * 8);
  for (float& p : s.pixels) p = static_cast<float>(rng.uniform());
  for (int i = 0; i < n; ++i) s.labels.push_back(i % 2);
  return s;
}

VitConfig tiny_config() {
  VitConfig c = test::small_config(8, true, 1);
  c.embed_dim = 8;
  c.num_heads = 2;
  return c;
}

Recipe tiny_recipe() {
  Recipe r;
  r.epochs = 4;
  r.batch = 4;
  r.threads = 1;
  return r;
}

// The visible files of a folder: name -> bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& e : entries(dir))
    if (e[0] != '.') files[e] = slurp(dir + "/" + e);
  return files;
}

// The folder's files after each of two saves made without failures (steps 1 and 2).
struct TwoSaves {
  std::map<std::string, std::string> first, second;
};

TwoSaves reference_saves(const ImageSet& data) {
  const std::string dir = test::temp_dir("ckpt-ref");
  Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
  t.step();
  save_checkpoint(t, dir + "/last.safetensors", {{"data", "noise"}});
  TwoSaves ref;
  ref.first = snapshot(dir);
  t.step();
  save_checkpoint(t, dir + "/last.safetensors", {{"data", "noise"}});
  ref.second = snapshot(dir);
  REQUIRE(ref.first.size() == 2);  // last.safetensors and last.state.safetensors
  REQUIRE(ref.first != ref.second);
  return ref;
}

std::string one_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

TEST_CASE("checkpoint: a save failing (ENOSPC) at any file operation leaves the previous or the new pair",
          "[checkpoint][atomic]") {
  const ImageSet data = noise_set(16);
  const TwoSaves ref = reference_saves(data);
  int failures = 0, committed = 0;
  bool completed = false;
  for (long n = 1; n < 40 && !completed; ++n) {
    INFO("failing file operation " << n);
    const std::string dir = test::temp_dir("ckpt-enospc");
    const std::string path = dir + "/last.safetensors";
    Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
    t.step();
    save_checkpoint(t, path, {{"data", "noise"}});
    t.step();
    testing::fail_file_operation(n);
    std::string error;
    try {
      save_checkpoint(t, path, {{"data", "noise"}});
      completed = true;
    } catch (const Error& e) {
      error = e.what();
    }
    testing::fail_file_operation(0);
    if (!error.empty()) {
      ++failures;
      INFO(error);
      CHECK(error.find('\n') == std::string::npos);
      CHECK_THAT(error, Catch::Contains("No space left on device"));
      const bool saved = error.find("is saved whole") != std::string::npos;
      committed += saved;
      if (!saved) {
        // Nothing of the new pair reached the folder, as the message says.
        CHECK_THAT(error, Catch::Contains("was not saved, the last one saved is kept"));
        CHECK(snapshot(dir) == ref.first);
        CHECK(hidden_entries(dir) == 0);
      }
    }
    // Loading completes a save that passed its commit point: the newest whole pair.
    const SavedTraining loaded = load_checkpoint(path);
    const bool new_pair = completed || error.find("is saved whole") != std::string::npos;
    CHECK(loaded.position.step == (new_pair ? 2 : 1));
    CHECK(snapshot(dir) == (new_pair ? ref.second : ref.first));
    INFO([&] {
      std::string names;
      for (const std::string& e : entries(dir)) names += e + " ";
      return names;
    }());
    CHECK(hidden_entries(dir) == 0);
  }
  CHECK(completed);
  // Write the model, write the state, the commit rename, then the two renames into place (after
  // the commit point); removing the emptied commit folder is the 6th and is not an error.
  CHECK(failures == 5);
  CHECK(committed == 2);
}

TEST_CASE("checkpoint: a save killed at any file operation leaves a pair the next load or save uses",
          "[checkpoint][atomic][signals]") {
  const ImageSet data = noise_set(16);
  const TwoSaves ref = reference_saves(data);
  int killed = 0;
  for (long n = 1; n <= 7; ++n) {
    for (const bool then_save : {false, true}) {
      INFO("killed at file operation " << n << (then_save ? ", then saved again" : ", then loaded"));
      const std::string dir = test::temp_dir("ckpt-kill");
      const std::string path = dir + "/last.safetensors";
      Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
      t.step();
      save_checkpoint(t, path, {{"data", "noise"}});
      t.step();
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        testing::fail_file_operation(n, SIGKILL);
        try {
          save_checkpoint(t, path, {{"data", "noise"}});
        } catch (...) {
          ::_exit(3);
        }
        ::_exit(0);
      }
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      const bool was_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      if (!was_killed) {
        // Past the last operation of a save (n = 7): it finished.
        CHECK(n == 7);
        CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
      }
      killed += was_killed && !then_save;
      // Killed before the commit rename (operations 1 to 3): the previous pair; after it: the new.
      const bool new_pair = n >= 4;
      if (!then_save) {
        const SavedTraining loaded = load_checkpoint(path);
        CHECK(loaded.position.step == (new_pair ? 2 : 1));
        CHECK(snapshot(dir) == (new_pair ? ref.second : ref.first));
      } else {
        // The next save (this process) replaces whatever the killed one left.
        Trainer again(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
        again.step();
        again.step();
        save_checkpoint(again, path, {{"data", "noise"}});
        CHECK(snapshot(dir) == ref.second);
      }
      INFO([&] {
        std::string names;
        for (const std::string& e : entries(dir)) names += e + " ";
        return names;
      }());
      CHECK(hidden_entries(dir) == 0);
    }
  }
  CHECK(killed == 6);  // every operation of a save: 2 writes, 3 renames, removing the commit folder
}

TEST_CASE("checkpoint: saving into a missing folder is one line and writes nothing", "[checkpoint][atomic]") {
  const ImageSet data = noise_set(16);
  Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
  t.step();
  try {
    save_checkpoint(t, "/nonexistent-vitlens-folder/last.safetensors", {{"data", "noise"}});
    FAIL("saved into a missing folder");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    CHECK_THAT(what, Catch::Contains("/nonexistent-vitlens-folder"));
    CHECK_THAT(what, Catch::Contains("was not saved"));
  }
}

// A save to names that were free when it checked them adds files only: another program's file
// made at one of them while the checkpoint is written is kept and the save refused.
TEST_CASE("checkpoint: a file made at a new checkpoint name during the save is kept, the save refused",
          "[checkpoint][atomic]") {
  const ImageSet data = noise_set(16);
  Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
  t.step();
  for (const char* taken : {"last.safetensors", "last.state.safetensors"}) {
    INFO(taken);
    const std::string dir = test::temp_dir("ckpt-taken");
    const std::string mine = dir + "/" + taken;
    testing::act_at_file_operation(1, [&] { test::spit(mine, "another program's file"); });
    std::string error;
    try {
      save_checkpoint(t, dir + "/last.safetensors", {{"data", "noise"}});
    } catch (const Error& e) {
      error = e.what();
    }
    testing::fail_file_operation(0);
    CHECK(error == mine + ": already exists; nothing was written; the checkpoint of step 1 was not saved, the last one saved is kept");
    CHECK(slurp(mine) == "another program's file");
    CHECK(entries(dir) == std::vector<std::string>{taken});
  }
  // The same made between the commit point and the moves into place (the 4th operation, the first
  // move): the save's files go, the other writer's stays, and nothing is said to be saved.
  {
    const std::string dir = test::temp_dir("ckpt-taken-late");
    const std::string mine = dir + "/last.safetensors";
    testing::act_at_file_operation(4, [&] { test::spit(mine, "another program's file"); });
    std::string error;
    try {
      save_checkpoint(t, mine, {{"data", "noise"}});
    } catch (const Error& e) {
      error = e.what();
    }
    testing::fail_file_operation(0);
    CHECK_THAT(error, Catch::Contains("last.safetensors: was made by something else while vitlens wrote it") &&
                          Catch::EndsWith("the checkpoint of step 1 was not saved, the last one saved is kept"));
    CHECK(slurp(mine) == "another program's file");
    CHECK(entries(dir) == std::vector<std::string>{"last.safetensors"});
  }
  // The same save with nothing in its way writes both files.
  const std::string dir = test::temp_dir("ckpt-free");
  save_checkpoint(t, dir + "/last.safetensors", {{"data", "noise"}});
  CHECK(entries(dir) == std::vector<std::string>{"last.safetensors", "last.state.safetensors"});
}

TEST_CASE("checkpoint: names that only look like ours are never moved or removed", "[checkpoint][atomic]") {
  const ImageSet data = noise_set(16);
  const std::string dir = test::temp_dir("ckpt-lookalike");
  const std::string path = dir + "/last.safetensors";
  // A folder and a file named like a commit folder but not in its exact form, with a file the
  // user keeps there; a stale temporary of a process that is gone is ours and goes.
  const std::vector<std::string> kept = {".vitlens-group-notours", ".vitlens-group-0123456789abcdef-12-abcde",
                                         ".vitlens-groupie"};
  REQUIRE(::mkdir((dir + "/" + kept[0]).c_str(), 0755) == 0);
  test::spit(dir + "/" + kept[0] + "/last.safetensors", "the user's own file");
  test::spit(dir + "/" + kept[1], "not ours");
  test::spit(dir + "/" + kept[2], "not ours");
  const pid_t gone = test::gone_pid();
  test::spit(dir + "/.vitlens-tmp-" + std::to_string(gone) + "-Ab12Cd", "a temporary of ours");
  Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
  t.step();
  save_checkpoint(t, path, {{"data", "noise"}});
  CHECK(load_checkpoint(path).position.step == 1);
  std::vector<std::string> hidden;
  for (const std::string& e : entries(dir))
    if (e[0] == '.') hidden.push_back(e);
  std::vector<std::string> expect = kept;
  std::sort(expect.begin(), expect.end());
  CHECK(hidden == expect);
  CHECK(slurp(dir + "/" + kept[0] + "/last.safetensors") == "the user's own file");
}

// ---- damaged states ----
namespace {

struct Damage {
  std::string what;                                 // the case, for the report
  std::function<void(SafetensorsFile&)> apply;      // edits the state file
  std::string field;                                // the message names it
};

// The first entry of a tensor whose name starts with `prefix`.
float& first_of(SafetensorsFile& f, const std::string& prefix) {
  for (auto& [name, tensor] : f.tensors)
    if (name.rfind(prefix, 0) == 0 && !tensor.values.empty()) return tensor.values[0];
  throw std::runtime_error("no tensor " + prefix);
}

std::vector<Damage> damages() {
  return {
      {"NaN in adam_v", [](SafetensorsFile& f) { first_of(f, "adam_v.") = NAN; }, "adam_v."},
      {"infinity in adam_m", [](SafetensorsFile& f) { first_of(f, "adam_m.") = INFINITY; }, "adam_m."},
      {"negative adam_v", [](SafetensorsFile& f) { first_of(f, "adam_v.") = -1e-3f; }, "adam_v."},
      {"huge adam_m", [](SafetensorsFile& f) { first_of(f, "adam_m.") = 1e30f; }, "adam_m."},
      {"adam_m beyond Adam's reach beside adam_v",
       [](SafetensorsFile& f) {
         first_of(f, "adam_v.") = 1e-6f;
         first_of(f, "adam_m.") = 0.5f;
       },
       "adam_m."},
      {"adam_step 2^63-1", [](SafetensorsFile& f) { f.metadata["adam_step"] = "9223372036854775807"; }, "adam_step"},
      {"all-zero Rng",
       [](SafetensorsFile& f) {
         for (int i = 0; i < 4; ++i) f.metadata["rng" + std::to_string(i)] = "0";
       },
       "rng"},
      {"negative Rng word", [](SafetensorsFile& f) { f.metadata["rng2"] = "-5"; }, "rng2"},
      {"repeated data_order entry",
       [](SafetensorsFile& f) {
         std::vector<float>& order = f.tensors.at("data_order").values;
         order[1] = order[0];
       },
       "data_order"},
      {"data_order entry out of range",
       [](SafetensorsFile& f) {
         std::vector<float>& order = f.tensors.at("data_order").values;
         order[0] = static_cast<float>(order.size());
       },
       "data_order"},
      {"position beyond the epoch", [](SafetensorsFile& f) { f.metadata["position"] = "999"; }, "position"},
      {"negative epoch", [](SafetensorsFile& f) { f.metadata["epoch"] = "-1"; }, "epoch"},
  };
}

// Saves a checkpoint, damages its state, and returns the load error ("" when it loads).
std::string load_error_after(const std::string& dir, const Damage& d, const std::function<void(const std::string&)>& save,
                             const std::function<void(const std::string&)>& load) {
  const std::string path = dir + "/last.safetensors";
  save(path);
  SafetensorsFile state = read_safetensors(checkpoint_state_path(path));
  d.apply(state);
  write_safetensors(checkpoint_state_path(path), state);
  try {
    load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint: every damaged field of a classifier's state is refused, naming the file and field",
          "[checkpoint][damaged]") {
  const ImageSet data = noise_set(16);
  Trainer t(std::make_unique<ClassifyObjective>(tiny_config(), tiny_recipe(), &data, nullptr));
  for (int i = 0; i < 3; ++i) t.step();
  for (const Damage& d : damages()) {
    INFO(d.what);
    const std::string dir = test::temp_dir("ckpt-damaged");
    const std::string error = load_error_after(
        dir, d, [&](const std::string& p) { save_checkpoint(t, p, {{"data", "noise"}}); },
        [](const std::string& p) { (void)load_checkpoint(p); });
    INFO(error);
    CHECK(error.find('\n') == std::string::npos);
    CHECK_THAT(error, Catch::Contains(dir + "/last.state.safetensors"));
    CHECK_THAT(error, Catch::Contains(d.field));
  }
  // The undamaged state loads, and restores into the trainer it came from.
  const std::string dir = test::temp_dir("ckpt-good");
  save_checkpoint(t, dir + "/last.safetensors", {{"data", "noise"}});
  const SavedTraining saved = load_checkpoint(dir + "/last.safetensors");
  Trainer resumed(std::make_unique<ClassifyObjective>(saved.config, saved.recipe, &data, nullptr));
  resumed.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  CHECK(resumed.position().step == 3);
}

TEST_CASE("checkpoint: an MAE state's data order holds each photo crops_per_photo times, and damage is refused",
          "[checkpoint][damaged][mae]") {
  const std::string photos_dir = test::photo_folder("ckpt-mae");
  const PhotoCorpus photos = load_photo_corpus(photos_dir, 16, nullptr);
  VitConfig config = test::small_config(16, true, 1);
  config.embed_dim = 8;
  config.num_heads = 2;
  MaeOptions options;
  options.shape.decoder_dim = 8;
  options.shape.decoder_depth = 1;
  options.shape.decoder_heads = 2;
  options.crops_per_photo = 2;
  Recipe recipe = tiny_recipe();
  Trainer t(std::make_unique<MaeObjective>(config, recipe, options, &photos, nullptr));
  t.step();
  std::vector<Damage> cases = damages();
  cases.push_back({"a photo more often than its crops",
                   [](SafetensorsFile& f) {
                     std::vector<float>& order = f.tensors.at("data_order").values;
                     const float photo = order[0], other = photo == 0.0f ? 1.0f : 0.0f;
                     for (float& v : order)
                       if (v == photo) v = other;  // `other` four times, `photo` never
                   },
                   "data_order"});
  cases.push_back({"NaN in a decoder weight", [](SafetensorsFile& f) { first_of(f, "decoder_") = NAN; }, "decoder_"});
  for (const Damage& d : cases) {
    INFO(d.what);
    const std::string dir = test::temp_dir("ckpt-mae-damaged");
    const std::string error = load_error_after(
        dir, d, [&](const std::string& p) { save_checkpoint(t, p, {{"data", "photos"}}); },
        [](const std::string& p) { (void)load_checkpoint(p, "mae"); });
    INFO(error);
    CHECK(error.find('\n') == std::string::npos);
    CHECK_THAT(error, Catch::Contains("last.state.safetensors"));
    CHECK_THAT(error, Catch::Contains(d.field));
  }
  const std::string dir = test::temp_dir("ckpt-mae-good");
  save_checkpoint(t, dir + "/last.safetensors", {{"data", "photos"}});
  CHECK(load_checkpoint(dir + "/last.safetensors", "mae").position.step == 1);
}

// ---- the CLI ----
namespace {

bool have_fashion_mnist() {
  struct stat st {};
  return ::stat((default_fashion_mnist_dir() + "/train-labels-idx1-ubyte.gz").c_str(), &st) == 0 ||
         ::stat((default_fashion_mnist_dir() + "/train-labels-idx1-ubyte").c_str(), &st) == 0;
}

const std::vector<std::string> kTinyRun = {"--data", "fashion-mnist", "--limit", "64", "--depth", "1", "--embed-dim",
                                           "8", "--heads", "2", "--patch", "7", "--batch", "16", "--threads", "1"};

test::Child run_train(const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<std::string> all = {VITLENS_BINARY, "train"};
  all.insert(all.end(), args.begin(), args.end());
  return test::reap(test::spawn(all, err_path), err_path);
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

TEST_CASE("train CLI: SIGHUP saves and stops the run as SIGINT and SIGTERM do", "[checkpoint][cli][signals]") {
  REQUIRE(have_fashion_mnist());  // scripts/setup.sh installs dataset-fashion-mnist
  for (int sig : {SIGHUP, SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    const std::string dir = test::temp_dir("ckpt-signal");
    const std::string err = dir + "/err";
    // 4 steps per epoch, far more epochs than run before the signal; not a terminal, so each step
    // prints a progress line ("... step N/4000 ...").
    const pid_t pid = test::spawn(with({VITLENS_BINARY, "train"}, with(kTinyRun, {"--epochs", "1000", "--out", dir + "/run"})), err);
    int64_t seen = 0;
    while (seen < 6) {
      const std::string text = slurp(err);
      const size_t at = text.rfind(" step ");
      if (at != std::string::npos) seen = std::atoll(text.c_str() + at + 6);
      int status = 0;
      REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);  // still running
      if (seen < 6) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(pid, sig);
    const test::Child child = test::reap(pid, err);
    INFO(child.err);
    CHECK(child.signal == 0);
    CHECK(child.code == 1);
    const size_t stopped = child.err.find("stopped at step ");
    REQUIRE(stopped != std::string::npos);
    const int64_t step = std::atoll(child.err.c_str() + stopped + 16);
    CHECK(step >= seen);
    CHECK_THAT(child.err, Catch::Contains("continue with --resume " + dir + "/run/last.safetensors"));
    CHECK(load_checkpoint(dir + "/run/last.safetensors").position.step == step);
    CHECK(hidden_entries(dir + "/run") == 0);
  }
}

TEST_CASE("train CLI: --resume of a pair whose save was killed halfway resumes from the new pair",
          "[checkpoint][cli][atomic]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("ckpt-cli-resume");
  const std::string run = dir + "/run", path = run + "/last.safetensors";
  const test::Child first = run_train(with(kTinyRun, {"--epochs", "2", "--stop-after", "2", "-q", "--out", run}), dir + "/err");
  INFO(first.err);
  REQUIRE(first.code == 0);
  // Step 3 saved by a process killed after the model file was moved into place but before the
  // state was: the folder holds the new model beside the old state, and the new state waits in
  // the commit folder.
  const SavedTraining saved = load_checkpoint(path);
  const ImageSet data = load_fashion_mnist(default_fashion_mnist_dir(), true, 64);
  Trainer t(std::make_unique<ClassifyObjective>(saved.config, saved.recipe, &data, nullptr));
  t.restore(saved.params, saved.adam_m, saved.adam_v, saved.adam_step, saved.position);
  t.step();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    testing::fail_file_operation(5, SIGKILL);
    try {
      save_checkpoint(t, path, saved.training);
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(hidden_entries(run) == 1);  // the commit folder
  const SafetensorsFile half_state = read_safetensors(checkpoint_state_path(path));
  CHECK(half_state.metadata.at("step") == "2");
  CHECK(nlohmann::json::parse(read_safetensors(path).metadata.at("training")).at("step") == 3);

  const test::Child resumed = run_train({"--data", "fashion-mnist", "--resume", path, "--stop-after", "1"}, dir + "/err2");
  INFO(resumed.err);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.err, Catch::Contains("resuming at step 3"));
  CHECK(load_checkpoint(path).position.step == 4);
  CHECK(hidden_entries(run) == 0);
}

TEST_CASE("train CLI: a resume writes its log only into the run's own log file, without the steps it trains again",
          "[checkpoint][cli]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("resume-log");
  const std::string run = dir + "/run", path = run + "/last.safetensors";
  REQUIRE(run_train(with(kTinyRun, {"--epochs", "2", "--stop-after", "2", "-q", "--out", run}), dir + "/err").code == 0);
  const std::string log = slurp(run + "/log.jsonl");
  // A run killed after logging steps 3 and 4 and before saving them: a resume from step 2 trains
  // them again, and their old lines go (a line that is not a step's stays, ended if the kill cut
  // it short).
  test::spit(run + "/log.jsonl", log + "{\"step\": 3, \"loss\": 9}\n{\"step\": 4, \"eval\": \"test\", \"loss\": 9}\nnot json");
  const test::Child resumed = run_train({"--data", "fashion-mnist", "--resume", path, "--stop-after", "1", "-q"}, dir + "/err");
  INFO(resumed.err);
  REQUIRE(resumed.code == 0);
  CHECK(slurp(run + "/log.jsonl") == log + "not json\n");

  // A copy of the checkpoint under another name, resumed in its folder: the run's files there
  // (last.safetensors, its state, log.jsonl) are new, so a user's file at one of them is refused
  // before any training, and a link is never written through.
  const std::string copy = dir + "/copy";
  REQUIRE(::mkdir(copy.c_str(), 0755) == 0);
  std::filesystem::copy_file(path, copy + "/mine.safetensors");
  std::filesystem::copy_file(checkpoint_state_path(path), copy + "/mine.state.safetensors");
  test::spit(dir + "/victim.txt", "the user's text");
  REQUIRE(::symlink("../victim.txt", (copy + "/log.jsonl").c_str()) == 0);
  const test::Child linked = run_train({"--data", "fashion-mnist", "--resume", copy + "/mine.safetensors", "-q"}, dir + "/err");
  CHECK(linked.code == 1);
  CHECK_THAT(linked.err, Catch::Contains(copy + "/log.jsonl: already exists, and there is no " + copy +
                                         "/last.safetensors beside it to continue from"));
  CHECK(slurp(dir + "/victim.txt") == "the user's text");
  std::filesystem::remove(copy + "/log.jsonl");
  test::spit(copy + "/last.safetensors", "the user's model");
  const test::Child taken = run_train({"--data", "fashion-mnist", "--resume", copy + "/mine.safetensors", "-q"}, dir + "/err");
  CHECK(taken.code == 1);
  CHECK_THAT(taken.err, Catch::Contains(copy + "/last.safetensors: already exists"));
  CHECK(slurp(copy + "/last.safetensors") == "the user's model");
  CHECK(test::entries(copy) == std::vector<std::string>{"last.safetensors", "mine.safetensors", "mine.state.safetensors"});

  // The run's own folder with a link at its log's name: refused before any training too.
  std::filesystem::remove(run + "/log.jsonl");
  REQUIRE(::symlink("../victim.txt", (run + "/log.jsonl").c_str()) == 0);
  const std::string model_before = slurp(path);
  const test::Child own = run_train({"--data", "fashion-mnist", "--resume", path, "-q"}, dir + "/err");
  CHECK(own.code == 1);
  CHECK_THAT(own.err, Catch::Contains(run + "/log.jsonl: is not a file (a link, a folder, ...)"));
  CHECK(slurp(dir + "/victim.txt") == "the user's text");
  CHECK(slurp(path) == model_before);
}

TEST_CASE("train CLI: --resume takes the checkpoint's data folder however it is spelled", "[checkpoint][cli]") {
  const std::string dir = test::temp_dir("resume-spelling");
  const std::string data = dir + "/data";
  Rng rng(5);
  for (const char* label : {"cat", "dog"}) {
    REQUIRE(std::filesystem::create_directories(data + "/" + label));
    for (int i = 0; i < 4; ++i) {
      cv::Mat picture(8, 8, CV_8UC3);
      for (int p = 0; p < 8 * 8 * 3; ++p) picture.data[p] = static_cast<unsigned char>(rng.uniform() * 255.0);
      write_png_atomic(data + "/" + label + "/" + std::to_string(i) + ".png", picture);
    }
  }
  const std::string path = dir + "/run/last.safetensors";
  const test::Child first = run_train({"--data", data, "--img-size", "8", "--patch", "4", "--depth", "1", "--embed-dim", "8",
                                       "--heads", "2", "--batch", "4", "--epochs", "3", "--val-split", "0", "--threads", "1",
                                       "--stop-after", "1", "-q", "--out", dir + "/run"},
                                      dir + "/err");
  INFO(first.err);
  REQUIRE(first.code == 0);
  for (const std::string& spelling : {data + "/", dir + "/./data", dir + "/run/../data"}) {
    INFO(spelling);
    const test::Child resumed = run_train({"--data", spelling, "--resume", path, "--stop-after", "1", "-q"}, dir + "/err");
    INFO(resumed.err);
    CHECK(resumed.code == 0);
  }
  CHECK(load_checkpoint(path).position.step == 4);
  // Another folder is other data.
  const test::Child other = run_train({"--data", dir + "/run", "--resume", path, "-q"}, dir + "/err");
  CHECK(other.code != 0);
  CHECK_THAT(other.err, Catch::Contains("is not the data this checkpoint was trained on"));
}

TEST_CASE("train CLI: --resume of a damaged state is one line naming the file and the field, exit 1",
          "[checkpoint][cli][damaged]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("ckpt-cli-damaged");
  const std::string run = dir + "/run", path = run + "/last.safetensors";
  const test::Child first = run_train(with(kTinyRun, {"--epochs", "2", "--stop-after", "3", "-q", "--out", run}), dir + "/err");
  INFO(first.err);
  REQUIRE(first.code == 0);
  const std::string good = slurp(checkpoint_state_path(path));
  for (const Damage& d : damages()) {
    INFO(d.what);
    test::spit(checkpoint_state_path(path), good);
    SafetensorsFile state = read_safetensors(checkpoint_state_path(path));
    d.apply(state);
    write_safetensors(checkpoint_state_path(path), state);
    const std::string before = slurp(checkpoint_state_path(path));
    const test::Child c = run_train({"--data", "fashion-mnist", "--resume", path, "-q"}, dir + "/err2");
    INFO(c.err);
    CHECK(c.code == 1);
    CHECK(std::count(c.err.begin(), c.err.end(), '\n') == 1);
    CHECK_THAT(one_line(c.err), Catch::Contains(checkpoint_state_path(path)));
    CHECK_THAT(one_line(c.err), Catch::Contains(d.field));
    CHECK(slurp(checkpoint_state_path(path)) == before);  // refused, not rewritten
  }
}

// A group that cannot be completed never blocks the folder: the tidy warns and goes on, a newer
// group of the same files supersedes it (it is removed, never completed over the newer files), and
// a folder in a file's place is refused before anything moves.
TEST_CASE("checkpoint groups: one that cannot be completed is skipped then superseded, a folder in the way is refused",
          "[checkpoint][atomic]") {
  const std::string dir = test::temp_dir("group-skip");
  std::vector<std::string> warnings;
  set_file_warning_handler([&](const std::string& line) { warnings.push_back(line); });
  auto save = [&](const std::string& a, const std::string& b, long fail_at) {
    FileGroup group(dir);
    group.add_stream("a", [&](FileSink& sink) { sink.write(a.data(), a.size()); });
    group.add_stream("b", [&](FileSink& sink) { sink.write(b.data(), b.size()); });
    testing::fail_file_operation(fail_at);
    try {
      group.commit();
    } catch (const Error&) {
    }
    testing::fail_file_operation(0);
  };
  // The first group is committed, then its first move into place fails: it stays whole in its folder.
  save("old a", "old b", 2);
  REQUIRE(hidden_entries(dir) == 1);
  // The next save's tidy fails to complete it (its first operation), warns, and the new pair goes in.
  save("new a", "new b", 1);
  CHECK(slurp(dir + "/a") == "new a");
  CHECK(slurp(dir + "/b") == "new b");
  CHECK(hidden_entries(dir) == 0);  // the older group was superseded, not completed later
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("this interrupted save is skipped") != std::string::npos);
  CHECK(tidy_output_dir(dir) == 0);
  CHECK(slurp(dir + "/a") == "new a");

  // A folder where a file goes: refused before the commit point, the pair in place untouched.
  REQUIRE(std::remove((dir + "/b").c_str()) == 0);
  REQUIRE(::mkdir((dir + "/b").c_str(), 0755) == 0);
  FileGroup group(dir);
  group.add_stream("a", [](FileSink& sink) { sink.write("x", 1); });
  group.add_stream("b", [](FileSink& sink) { sink.write("y", 1); });
  try {
    group.commit();
    FAIL("a folder in a file's place was replaced");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("is a folder; nothing was saved") != std::string::npos);
  }
  CHECK_FALSE(group.committed());
  CHECK(slurp(dir + "/a") == "new a");
  set_file_warning_handler(nullptr);
}

TEST_CASE("a group of new names only refuses, at its commit, a name taken since it began", "[checkpoint][atomic]") {
  const std::string dir = test::temp_dir("group-new");
  {
    FileGroup group(dir, true);
    group.add_stream("a", [](FileSink& sink) { sink.write("ours", 4); });
    group.add_stream("b", [](FileSink& sink) { sink.write("ours", 4); });
    test::spit(dir + "/b", "the user's, made while the group was written");
    try {
      group.commit();
      FAIL("a file made after the group began was replaced");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) == dir + "/b: already exists; nothing was written");
    }
    CHECK_FALSE(group.committed());
  }
  CHECK(entries(dir) == std::vector<std::string>{"b"});  // the private folder went with the group
  CHECK(slurp(dir + "/b") == "the user's, made while the group was written");
  // With the names free it commits as any group.
  std::remove((dir + "/b").c_str());
  FileGroup group(dir, true);
  group.add_stream("a", [](FileSink& sink) { sink.write("ours", 4); });
  group.commit();
  CHECK(entries(dir) == std::vector<std::string>{"a"});
}

// A group of new names cut short after its commit point is completed without replacing: a name
// taken in between keeps its file, and the group's copy is dropped with a warning.
TEST_CASE("a group of new names only never replaces a file when an interrupted commit is completed",
          "[checkpoint][atomic]") {
  const std::string dir = test::temp_dir("group-new-finish");
  std::vector<std::string> warnings;
  set_file_warning_handler([&](const std::string& line) { warnings.push_back(line); });
  {
    FileGroup group(dir, true);
    group.add_stream("a", [](FileSink& sink) { sink.write("ours", 4); });
    group.add_stream("b", [](FileSink& sink) { sink.write("ours", 4); });
    testing::fail_file_operation(2);  // committed, then its first move into place fails
    CHECK_THROWS_AS(group.commit(), Error);
    testing::fail_file_operation(0);
    CHECK(group.committed());
  }
  const std::vector<std::string> left = entries(dir);
  REQUIRE(left.size() == 1);
  CHECK(left[0].rfind(".vitlens-group-new-", 0) == 0);  // marked: completed without replacing
  test::spit(dir + "/b", "the user's, made before the completion");
  CHECK(tidy_output_dir(dir) == 1);
  CHECK(slurp(dir + "/a") == "ours");
  CHECK(slurp(dir + "/b") == "the user's, made before the completion");
  CHECK(entries(dir) == std::vector<std::string>{"a", "b"});
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains(dir + "/b: was made by something else") && Catch::Contains("that file is kept"));
  set_file_warning_handler(nullptr);
}

TEST_CASE("folder claim: one holder at a time per folder, by any path to it, gone with the claim",
          "[checkpoint][claim]") {
  const std::string dir = test::temp_dir("claim"), other = test::temp_dir("claim-other");
  REQUIRE(::symlink(dir.c_str(), (other + "/link").c_str()) == 0);
  const std::string busy = dir + ": another vitlens process is training or saving in this folder";
  {
    FolderClaim first(dir);
    REQUIRE(first.held());  // Unix sockets exist here; elsewhere a claim may hold nothing
    CHECK_THROWS_AS(FolderClaim(dir), FolderBusy);
    CHECK_THROWS_WITH(FolderClaim(dir), busy);
    CHECK_THROWS_AS(FolderClaim(other + "/link"), FolderBusy);  // the same folder by another path
    FolderClaim moved(std::move(first));
    CHECK(moved.held());
    CHECK_FALSE(first.held());  // NOLINT(bugprone-use-after-move): the moved-from claim holds nothing
    CHECK_THROWS_AS(FolderClaim(dir), FolderBusy);  // the moved claim still holds it
    const FolderClaim elsewhere(other);
    CHECK(elsewhere.held());
  }
  const FolderClaim again(dir);  // released with the claim
  CHECK(again.held());
  CHECK(entries(dir).empty());  // the claim is no file in the folder
  CHECK_THROWS_WITH(FolderClaim(dir + "/missing"), Catch::Contains(dir + "/missing: cannot claim the folder"));
}

namespace {

// A child process killed and reaped when the test leaves its scope early (a failed REQUIRE), so no
// long training run outlives the test.
struct KillOnExit {
  pid_t pid;
  ~KillOnExit() {
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
};

}  // namespace

TEST_CASE("train CLI: a second train into a folder where one is running is refused before it reads or writes",
          "[checkpoint][cli][claim]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("train-busy");
  const std::string run = dir + "/run", err = dir + "/err";
  // 4 steps per epoch and a checkpoint at each epoch's end: the first run is past its first save
  // when the others start.
  KillOnExit first_run{test::spawn(with({VITLENS_BINARY, "train"}, with(kTinyRun, {"--epochs", "1000", "--out", run})), err)};
  const pid_t pid = first_run.pid;
  int64_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (seen < 6) {
    const std::string text = slurp(err);
    const size_t at = text.rfind(" step ");
    if (at != std::string::npos) seen = std::atoll(text.c_str() + at + 6);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    if (seen < 6) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::string busy = run + ": another vitlens process is training or saving in this folder; wait for it to finish";
  // A new run into the same --out, and a resume of its checkpoint (another terminal): both refused
  // (without the claim the new run would be refused for another reason, the resume would run).
  const test::Child fresh = run_train(with(kTinyRun, {"--epochs", "1", "-q", "--out", run}), dir + "/err2");
  CHECK(fresh.code == 1);
  CHECK_THAT(fresh.err, Catch::Contains(busy));
  const test::Child resumed = run_train({"--data", "fashion-mnist", "--resume", run + "/last.safetensors", "--stop-after",
                                         "2", "-q"}, dir + "/err3");
  CHECK(resumed.code == 1);
  CHECK_THAT(resumed.err, Catch::Contains(busy));
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);  // the first run goes on
  ::kill(pid, SIGINT);
  const test::Child first = test::reap(pid, err);
  first_run.pid = -1;
  CHECK(first.signal == 0);
  const size_t stopped = first.err.find("stopped at step ");
  REQUIRE(stopped != std::string::npos);
  const int64_t step = std::atoll(first.err.c_str() + stopped + 16);
  // Its checkpoint is its own, the last step it took, and every log line is its own.
  CHECK(load_checkpoint(run + "/last.safetensors").position.step == step);
  int64_t previous = 0;
  std::istringstream log(slurp(run + "/log.jsonl"));
  for (std::string line; std::getline(log, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("step")) continue;
    CHECK(j["step"].get<int64_t>() >= previous);  // one run's steps: never back
    previous = j["step"].get<int64_t>();
  }
  CHECK(previous > 0);
  // The folder is free again: the resume goes on from the saved step.
  const test::Child after = run_train({"--data", "fashion-mnist", "--resume", run + "/last.safetensors", "--stop-after", "1",
                                       "-q"}, dir + "/err4");
  CHECK(after.code == 0);
  CHECK(load_checkpoint(run + "/last.safetensors").position.step == step + 1);
}

TEST_CASE("train CLI: a new run never replaces a checkpoint or a file of that name in its --out", "[checkpoint][cli]") {
  REQUIRE(have_fashion_mnist());
  const std::string dir = test::temp_dir("train-new-run");
  const std::string run = dir + "/run";
  // A finished run, then a second new run into the same folder: refused, the first run's pair kept.
  REQUIRE(run_train(with(kTinyRun, {"--epochs", "1", "--stop-after", "2", "-q", "--out", run}), dir + "/err").code == 0);
  const std::string model = slurp(run + "/last.safetensors"), state = slurp(run + "/last.state.safetensors");
  const test::Child again = run_train(with(kTinyRun, {"--epochs", "1", "-q", "--out", run}), dir + "/err");
  CHECK(again.code == 1);
  CHECK(again.err.find("last.safetensors: already exists; continue that run with --resume") != std::string::npos);
  CHECK(slurp(run + "/last.safetensors") == model);
  CHECK(slurp(run + "/last.state.safetensors") == state);
  // A user's own file of a checkpoint's name in a folder given as --out: refused, untouched.
  const std::string mine = dir + "/mine";
  REQUIRE(::mkdir(mine.c_str(), 0755) == 0);
  test::spit(mine + "/last.state.safetensors", "the user's notes");
  const test::Child user = run_train(with(kTinyRun, {"--epochs", "1", "-q", "--out", mine}), dir + "/err");
  CHECK(user.code == 1);
  CHECK(user.err.find("last.state.safetensors: already exists, and there is no " + mine +
                      "/last.safetensors beside it to continue from") != std::string::npos);
  CHECK(slurp(mine + "/last.state.safetensors") == "the user's notes");
  CHECK(entries(mine).size() == 1);
  // Continuing the run in its own folder still works.
  CHECK(run_train({"--data", "fashion-mnist", "--resume", run + "/last.safetensors", "--epochs", "2", "-q"}, dir + "/err").code == 0);
}
