// The Train window's actions and script commands, and the Model menu's list (see train_panel.hpp).
#include "training/train_panel.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "control/app.hpp"
#include "models/bundled_models.hpp"
#include "core/base/error.hpp"
#include "models/model_io.hpp"

namespace vitlens::viewer {

namespace {

bool whole_steps(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || v < 0 || v > 1000000000LL) return false;
  out = v;
  return true;
}

bool finished_state(TrainState s) {
  return s == TrainState::Stopped || s == TrainState::Finished || s == TrainState::Failed || s == TrainState::Idle;
}

}  // namespace

// [SECTION] Script commands

std::string start_training(App& app, const TrainSettings& settings) {
  TrainPanel& t = app.train;
  t.settings = settings;
  t.start_error = t.session.start(settings);
  t.wait_step = -1;
  app.ui.show_train = true;
  return t.start_error;
}

std::string open_training_model(App& app) {
  TrainPanel& t = app.train;
  std::string error;
  const std::string path = t.session.viewing_path(error);
  const uint64_t id = path.empty() ? 0 : t.session.request_save(path);
  if (id == 0) {
    if (error.empty()) error = "no training run has started";
    t.start_error = "Open failed: " + error;
    return error;
  }
  t.start_error.clear();
  t.open_save = id;
  t.open_path = path;
  return "";
}

namespace {

const char* const kTrainUsage =
    "train start fashion-mnist|DIR|photos[:DIR] [key=value ...] | train pause|resume|stop | train wait STEPS | "
    "train save FILE | train open";

// The key=value words after `train start DATA`, set on `settings`: "" or why one is refused.
std::string set_train_options(TrainSettings& settings, const ScriptArgs& a) {
  for (size_t i = 2; i < a.size(); ++i) {
    const auto eq = a[i].find('=');
    if (eq == std::string::npos || eq == 0) return "'" + a[i] + "' is not key=value";
    const std::string why = set_train_option(settings, a[i].substr(0, eq), a[i].substr(eq + 1));
    if (!why.empty()) return why;
  }
  return "";
}

bool check_train(const ScriptArgs& a, std::string& why) {
  const std::string sub = a.empty() ? "" : a[0];
  if (sub == "start") {
    if (a.size() < 2) return false;
    TrainSettings scratch;
    why = set_train_options(scratch, a);
    return why.empty();
  }
  if (one_of(sub, {"pause", "resume", "stop", "open"})) return a.size() == 1;
  if (sub == "wait") {
    why = "expects: train wait STEPS (a whole number)";
    long long steps = 0;
    return a.size() == 2 && whole_steps(a[1], steps);
  }
  if (sub == "save") {
    why = "expects: train save FILE (no spaces)";
    return a.size() == 2;
  }
  return false;
}

bool check_model_menu(const ScriptArgs& a, std::string&) { return a.size() == 1; }

std::string apply_train(App& app, const ScriptArgs& a) {
  TrainPanel& t = app.train;
  const std::string& sub = a[0];
  if (sub == "start") {
    TrainSettings settings;
    settings.data = a[1];
    if (auto why = set_train_options(settings, a); !why.empty()) return why;
    return start_training(app, settings);
  }
  if (sub == "pause") t.session.pause();
  else if (sub == "resume") t.session.resume();
  else if (sub == "stop") t.session.stop();
  else if (sub == "save") return t.session.save(a[1]);
  else if (sub == "open") return open_training_model(app);
  else if (sub == "wait") {
    long long steps = 0;
    whole_steps(a[1], steps);
    t.wait_step = steps;
  }
  return "";
}

std::string apply_model_menu(App& app, const ScriptArgs& a) {
  for (const BundledModel& m : bundled_models(bundled_models_folder())) {
    if (m.name == a[0] || std::filesystem::path(m.path).stem().string() == a[0] || bundled_model_name(m.path) == a[0]) {
      app.requests.open_model = m.path;
      return "";
    }
  }
  std::string known;
  for (const BundledModel& m : bundled_models(bundled_models_folder())) known += (known.empty() ? "" : ", ") + m.name;
  return "no bundled model named '" + a[0] + "' (the Model menu lists: " + known + ")";
}

}  // namespace

const std::vector<ScriptVerb>& training_script_verbs() {
  static const std::vector<ScriptVerb> rows = {
      {"train", kTrainUsage, ScriptSplit::Words, check_train, apply_train},
      {"model-menu", "model-menu NAME (a model's name or file stem)", ScriptSplit::Words, check_model_menu, apply_model_menu},
  };
  return rows;
}

std::string apply_train_command(App& app, const ScriptCommand& command) {
  const ScriptVerb* row = find_script_verb(training_script_verbs(), command.verb);
  return row ? row->apply(app, command.args) : "not a training command: '" + command.verb + "'";
}

namespace {

// Fails the running script at its current command (the one that waited).
void fail_script(App& app, const std::string& why) {
  if (!app.script.active() || app.script.next == 0) return;
  const ScriptCommand& c = app.script.commands[app.script.next - 1];
  app.script.error = app.script.path + ":" + std::to_string(c.line) + ": '" + c.text + "': " + why;
}

}  // namespace

bool poll_training(App& app) {
  TrainPanel& t = app.train;
  std::string save_error;
  if (t.open_save != 0 && t.session.save_finished(t.open_save, save_error)) {
    t.open_save = 0;
    if (save_error.empty()) {
      app.requests.open_model = t.open_path;
    } else {
      t.start_error = "Open failed: " + save_error;
      fail_script(app, t.start_error);
    }
  }
  if (t.session.version() != t.view.version) t.view = t.session.snapshot();
  if (t.wait_step >= 0) {
    if (t.view.step >= t.wait_step) {
      t.wait_step = -1;
    } else if (finished_state(t.view.state)) {
      // The run ended before the step the script waits for: the script fails with the reason.
      const std::string why = t.view.state == TrainState::Failed
                                  ? t.view.error
                                  : std::string("training is ") + train_state_name(t.view.state) + " at step " +
                                        std::to_string(t.view.step);
      t.wait_step = -1;
      fail_script(app, why);
    }
  }
  return t.session.active();
}

bool training_wait_pending(const App& app) { return app.train.wait_step >= 0 || app.train.open_save != 0; }

nlohmann::json training_state_json(const App& app) {
  const TrainSnapshot& v = app.train.view;
  nlohmann::json j;
  j["state"] = train_state_name(v.state);
  j["error"] = v.error;
  j["message"] = v.message;
  j["start_error"] = app.train.start_error;
  j["data"] = v.data;
  j["objective"] = v.mae ? "mae" : "classify";
  j["train_images"] = v.train_images;
  j["eval_images"] = v.eval_images;
  j["parameters"] = v.parameters;
  j["step"] = v.step;
  j["total_steps"] = v.total_steps;
  j["loss"] = v.loss;
  j["accuracy_points"] = v.accuracy.size();
  j["eval_steps"] = v.eval_steps;
  j["eval_loss"] = v.eval_loss;
  j["eval_accuracy"] = v.eval_accuracy;
  j["probe_step"] = v.probe.step;
  j["probe_heads"] = v.probe.heads.size();
  j["probe_grid"] = {v.probe.grid_h, v.probe.grid_w};
  j["probe_what"] = v.probe.what;
  j["stat_steps"] = v.stat_steps;
  j["entropy"] = v.entropy;
  j["checkpoint"] = v.checkpoint;
  return j;
}

// [SECTION] Bundled models

std::string bundled_models_folder() { return assets_dir() + "/models"; }

std::vector<BundledModel> bundled_models(const std::string& folder) {
  std::vector<BundledModel> list;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::filesystem::path& p = entry.path();
    if (p.extension() != ".safetensors" || p.stem().extension() == ".state") continue;  // skip checkpoints' state
    BundledModel m;
    m.path = p.string();
    m.name = p.stem().string();
    // Only the header is read, however large the weights.
    try {
      const VitConfig c = read_model_config(m.path);
      m.name = c.name;
      m.description = c.description;
    } catch (const std::exception& e) {
      m.error = e.what();
    }
    list.push_back(std::move(m));
  }
  std::sort(list.begin(), list.end(), [](const BundledModel& x, const BundledModel& y) { return x.path < y.path; });
  return list;
}

}  // namespace vitlens::viewer
