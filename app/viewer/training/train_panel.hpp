#pragma once
// The viewer's side of training and of the model menu, without a display:
//   TrainPanel          the Train window's plain state (the session, the fields, the snapshot shown)
//   script commands     train start fashion-mnist|DIR|photos[:DIR] [key=value ...] | train pause|resume|stop |
//                       train wait STEPS | train save FILE | train open | model-menu NAME
//   bundled_models      every *.safetensors in assets/models with its config's name and description
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/script.hpp"
#include "training/train_session.hpp"

namespace vitlens::viewer {

struct App;

struct TrainPanel {
  TrainSettings settings;   // what the window's fields hold; `train start` replaces it
  std::string start_error;  // a refused start or open, one line under the buttons
  std::string save_path = "vitlens-trained.safetensors";  // the Save button's file
  TrainSnapshot view;       // the snapshot on screen, copied when the session's version changes
  int64_t wait_step = -1;   // the script's `train wait`: until this step (or the run ends)
  uint64_t open_save = 0;   // "open in the main view": the save it waits for (0: none)
  std::string open_path;    // and the file it then opens
  TrainSession session;     // last: its worker stops before the rest goes
};

// The rows of the script's verb table (script.hpp) for `train` and `model-menu`.
const std::vector<ScriptVerb>& training_script_verbs();
// Runs a `train` or `model-menu` command: "" or why it failed.
std::string apply_train_command(App& app, const ScriptCommand& command);

// Actions shared by the window's buttons and the script.
std::string start_training(App& app, const TrainSettings& settings);
// Saves the current weights (on the worker, between steps) and then has the main view open them,
// as File > Open model would. "" or why it cannot start; a failed save shows in the window.
std::string open_training_model(App& app);

// Once per frame: a fresh snapshot in, a finished `train wait` released. Returns true while
// training runs (the main loop then redraws without waiting for input).
bool poll_training(App& app);
// A `train wait` or `train open` still waiting: the script does not go on.
bool training_wait_pending(const App& app);
// The window's numbers for `state FILE`.
nlohmann::json training_state_json(const App& app);

// [SECTION] Bundled models (the Model menu)

struct BundledModel {
  std::string path, name, description;
  std::string error;  // non-empty: the file is listed but its header could not be read
};
// Every *.safetensors in `folder`, sorted by file name; reads only each file's JSON header.
std::vector<BundledModel> bundled_models(const std::string& folder);
std::string bundled_models_folder();  // assets_dir()/models

}  // namespace vitlens::viewer
