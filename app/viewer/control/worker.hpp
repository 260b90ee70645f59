#pragma once
// Work that must not block the UI: loading files, the forward pass, the head statistics and
// export. One background thread; the UI submits jobs and polls for results once per frame and
// swaps them in whole. A new compute job replaces a waiting one and cancels a running one (the
// latest request wins); exports run in order, and an export identical to one still waiting is
// not queued again.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/app_state.hpp"
#include "models/model_io.hpp"

namespace vitlens::viewer {

// [SECTION] The forward pass a choice asks for

// Resolves a UI choice into the key of the forward pass it needs (working size, mask, scale).
ForwardKey make_forward_key(const LoadedModel& model, const SourceImage& image, const ComputeChoice& choice);
// The working size a choice computes at: its own, or the model's img_size long side (the one
// number the Controls slider, its caption and the pass share).
int working_side(const VitConfig& config, const ComputeChoice& choice);
// The options core's forward() takes for a key.
ForwardOptions forward_options_for_key(const ForwardKey& key);

constexpr int kStatsQueries = 1024;  // queries the head statistics sample at most

// [SECTION] Jobs

struct ComputeJob {
  std::shared_ptr<const LoadedModel> model;
  std::string load_model;                    // non-empty: load this file and use it instead
  LoadOptions load_options;                  // how to read it (--heads)
  std::shared_ptr<const SourceImage> image;
  std::string load_image;                    // non-empty: load this file and use it instead
  ComputeChoice choice;
};

struct ComputeResult {
  uint64_t job = 0;
  std::shared_ptr<const LoadedModel> model;  // the model used (loaded or given); null if its load failed
  std::shared_ptr<const SourceImage> image;
  std::shared_ptr<const Computation> comp;   // null on failure
  bool loaded_model = false, loaded_image = false;
  std::string error;                         // one line; empty on success
  bool cancelled = false;
};

struct ExportJob {
  std::shared_ptr<const LoadedModel> model;
  ImageAnalysis analysis;                    // what the screen shows, with its forward state
  ExportSettings settings;
  ForwardOptions options;                    // for re-running the pass with every weight kept (raw)
  nlohmann::json view_notes;                 // null, or what only the viewer can set: <stem>_view.json
  // Rollout mode (rollout_query >= 0): <stem>_rollout.png and .json of this (N, N) matrix instead.
  int rollout_query = -1;
  MatRM rollout_matrix;
  RolloutOptions rollout_options;
  double rollout_ms = 0.0;
  // Equal for two jobs that write the same files (the pass on screen and the export's command and
  // view notes); "" matches nothing. A waiting job's twin is not queued again.
  std::string same_files;
};

struct ExportResult {
  uint64_t job = 0;
  std::string folder;
  std::vector<std::string> files;
  std::string error;
};

// [SECTION] Worker

class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  uint64_t submit(ComputeJob job);
  uint64_t submit(ExportJob job);  // the waiting job's id when an identical one waits

  std::vector<ComputeResult> take_compute_results();
  std::vector<ExportResult> take_export_results();

  bool busy() const;             // a job waiting or running, or a result not yet taken
  float progress() const { return progress_.load(); }
  std::string activity() const;  // what runs now ("loading model", "forward pass", ...)

 private:
  void run();
  ComputeResult run_compute(uint64_t id, const ComputeJob& job);
  void load_files(const ComputeJob& job, ComputeResult& result);
  // The forward pass, rollout and statistics of result's model and image; null when cancelled.
  std::shared_ptr<Computation> compute(const ComputeResult& result, const ComputeJob& job);
  // The attention rollout of comp's pass (rollout mode); false when cancelled.
  bool add_rollout(Computation& comp, std::chrono::steady_clock::time_point t0);
  // A progress callback mapping [0, 1] into [lo, hi] of the bar; false once the job is cancelled.
  std::function<bool(float)> progress_between(float lo, float hi);
  ExportResult run_export(uint64_t id, ExportJob& job);
  void set_activity(const std::string& text);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::pair<uint64_t, ComputeJob>> pending_compute_;
  std::deque<std::pair<uint64_t, ExportJob>> pending_exports_;
  std::vector<ComputeResult> compute_results_;
  std::vector<ExportResult> export_results_;
  bool running_ = false, stop_ = false;
  std::string activity_;
  uint64_t next_id_ = 1;
  std::atomic<bool> cancel_{false};
  std::atomic<float> progress_{0.0f};
  std::thread thread_;
};

}  // namespace vitlens::viewer
