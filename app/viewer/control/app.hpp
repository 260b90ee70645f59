#pragma once
// The viewer's whole state in one struct: what is loaded and chosen (app_state.hpp), the worker
// and its bookkeeping, the script being run and the Train window. The functions that change it
// are in controller.hpp (the main view) and training/train_panel.hpp (the Train window); both
// include this header, and this header includes neither, so the arrows point one way:
// views -> controller / train_panel -> App -> state, worker, session.
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "control/app_state.hpp"
#include "control/script.hpp"
#include "control/settings.hpp"
#include "control/worker.hpp"
#include "training/train_panel.hpp"

namespace vitlens::viewer {

struct ScriptRunner {
  std::vector<ScriptCommand> commands;
  std::string path;
  size_t next = 0;
  int settle_frames = 0;    // frames to draw before the next command
  std::string error;        // first failure ("<path>:<line>: ..."); the run then stops
  bool active() const { return next < commands.size() && error.empty(); }
};

struct App {
  Document doc;
  UiState ui;
  Derived derived;
  Requests requests;
  Worker worker;

  // Bookkeeping of the worker's jobs.
  uint64_t compute_job = 0;                 // the compute in flight (0: none)
  ComputeJob compute_in_flight;             // its inputs: a newer load merges its file loads
  std::optional<ForwardKey> in_flight_key;  // known when the job loads nothing
  std::optional<ForwardKey> failed_key;     // a key whose pass failed: not retried until it changes
  std::vector<uint64_t> export_jobs;

  Settings settings;
  std::string settings_file;                // empty: nothing is read or written (scripted runs)
  bool settings_left_alone = false;         // it could not be read: never saved over this session
  std::string settings_warning;             // why, shown instead of the first "Opened ..." message
  ScriptRunner script;
  int export_failures = 0;                  // exports or screenshots that failed (script exit code)
  std::string last_export_failure;          // what the last of them said, for the exit message
  std::string last_load_error;              // the last file or pass that failed, for the exit message
  std::set<std::string> screenshots_written;  // each one's device, inode, size and time: these may be replaced
  LoadOptions load_options;                 // --heads, for every model this session opens
  std::deque<InputStep> input;              // synthetic input the window plays, one step per frame
  TrainPanel train;                         // the Train window (train_panel.hpp); last, so its worker stops first
};

}  // namespace vitlens::viewer
