// The background thread (see worker.hpp).
#include "control/worker.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/base/error.hpp"
#include "core/render/export_layers.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "models/model_io.hpp"
#include "models/model_transform.hpp"

namespace vitlens::viewer {

namespace {

std::atomic<uint64_t> g_next_serial{1};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The checkpoint's own transform, as `vitlens export --preprocess model` reads it; one it cannot
// reproduce (a border crop, ...) leaves the model usable in the whole-image mode, with the reason.
void read_transform(LoadedModel& loaded) {
  try {
    loaded.transform = read_model_transform(loaded.path, loaded.model.format);
    if (!loaded.transform.present()) loaded.no_transform = missing_transform_reason(loaded.model.format);
  } catch (const Error& e) {
    loaded.transform = ImageTransform{};
    loaded.no_transform = e.what();
  }
}

}  // namespace

// [SECTION] The forward pass a choice asks for

ForwardKey make_forward_key(const LoadedModel& model, const SourceImage& image, const ComputeChoice& choice) {
  ForwardKey key;
  key.model = model.serial;
  key.image = image.serial;
  // The model's transform sets the size itself (`--preprocess model` takes no --size); a model
  // without one is shown whole whatever the choice.
  if (choice.preprocess == Preprocess::Model && model.transform.present()) key.preprocess = Preprocess::Model;
  key.max_side = key.preprocess == Preprocess::Model ? 0 : working_side(model.model.config, choice);
  // Resolved here (core's rule), so auto that resolves to fp32 is the fp32 pass, not a new one.
  key.precision = resolve_precision(choice.precision, model.model);
  key.mask = choice.mask;
  if (choice.mask == MaskMode::Painted) {
    for (uint8_t v : choice.painted)
      if (v) {
        key.painted = choice.painted;
        break;
      }
  }
  if (choice.rollout.on) {
    // Off, the rollout's settings do not touch the pass; on, the layer range is resolved.
    key.rollout = choice.rollout;
    const int depth = model.model.config.depth;
    if (key.rollout.last_layer < 0 || key.rollout.last_layer >= depth) key.rollout.last_layer = depth - 1;
    key.rollout.first_layer = std::clamp(key.rollout.first_layer, 0, key.rollout.last_layer);
  }
  switch (choice.scale) {
    case ScaleMode::Model: key.score_scale = -1.0f; break;
    case ScaleMode::Unscaled: key.score_scale = 1.0f; break;
    case ScaleMode::Temperature: {
      // softmax(q.k / (sqrt(d) T)): T > 1 flattens every row, T < 1 sharpens it. The factor is
      // core's, as `vitlens export --temperature` makes it, so both passes agree bit for bit.
      ExportSettings settings;
      settings.temperature = choice.temperature;
      key.temperature = choice.temperature;
      key.score_scale = forward_options_for(model.model, settings).score_scale;
      break;
    }
  }
  return key;
}

int working_side(const VitConfig& config, const ComputeChoice& choice) {
  return choice.max_side > 0 ? choice.max_side : default_max_side(config);
}

ForwardOptions forward_options_for_key(const ForwardKey& key) {
  ForwardOptions options;
  options.causal = key.mask == MaskMode::Causal;
  options.mask_padding = key.mask != MaskMode::None;
  options.forbidden_patches = key.painted;
  options.score_scale = key.score_scale;
  options.precision = key.precision;
  return options;
}

// [SECTION] Worker

Worker::Worker() : thread_([this] { run(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    cancel_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

uint64_t Worker::submit(ComputeJob job) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  pending_compute_.emplace(id, std::move(job));
  if (running_) cancel_ = true;  // a running compute is stale now; an export ignores the flag
  wake_.notify_all();
  return id;
}

uint64_t Worker::submit(ExportJob job) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Export clicked again before the first one ran: that waiting job writes the same files, so it
  // is not queued twice (a newer compute waits for one export, not one per click).
  if (!job.same_files.empty())
    for (const auto& [id, waiting] : pending_exports_)
      if (waiting.same_files == job.same_files) return id;
  const uint64_t id = next_id_++;
  pending_exports_.emplace_back(id, std::move(job));
  wake_.notify_all();
  return id;
}

std::vector<ComputeResult> Worker::take_compute_results() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ComputeResult> out;
  out.swap(compute_results_);
  return out;
}

std::vector<ExportResult> Worker::take_export_results() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ExportResult> out;
  out.swap(export_results_);
  return out;
}

bool Worker::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_ || pending_compute_ || !pending_exports_.empty() || !compute_results_.empty() ||
         !export_results_.empty();
}

std::string Worker::activity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return activity_;
}

void Worker::set_activity(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  activity_ = text;
}

void Worker::run() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return stop_ || pending_compute_ || !pending_exports_.empty(); });
    // Stopping (the window closed) drops a compute but finishes the exports already asked for:
    // the user clicked Export, and the files are written whole before the viewer exits.
    if (stop_ && pending_exports_.empty()) return;
    running_ = true;
    progress_ = 0.0f;
    if (!pending_exports_.empty()) {  // exports first: they were asked for before any newer compute
      auto [id, job] = std::move(pending_exports_.front());
      pending_exports_.pop_front();
      lock.unlock();
      ExportResult result = run_export(id, job);
      lock.lock();
      export_results_.push_back(std::move(result));
    } else {
      auto [id, job] = std::move(*pending_compute_);
      pending_compute_.reset();
      cancel_ = false;
      lock.unlock();
      ComputeResult result = run_compute(id, job);
      lock.lock();
      if (!result.cancelled) compute_results_.push_back(std::move(result));
    }
    running_ = false;
    activity_.clear();
  }
}

std::function<bool(float)> Worker::progress_between(float lo, float hi) {
  return [this, lo, hi](float f) {
    progress_ = lo + (hi - lo) * f;
    return !cancel_.load();
  };
}

void Worker::load_files(const ComputeJob& job, ComputeResult& result) {
  if (!job.load_model.empty()) {
    set_activity("loading model " + job.load_model);
    auto loaded = std::make_shared<LoadedModel>();
    loaded->model = load_model(job.load_model, job.load_options);
    loaded->path = job.load_model;
    loaded->serial = g_next_serial++;
    read_transform(*loaded);
    result.model = std::move(loaded);
    result.loaded_model = true;
  }
  if (!job.load_image.empty()) {
    set_activity("loading image " + job.load_image);
    auto loaded = std::make_shared<SourceImage>();
    loaded->pixels = load_image(job.load_image);
    loaded->path = job.load_image;
    loaded->serial = g_next_serial++;
    result.image = std::move(loaded);
    result.loaded_image = true;
  }
}

namespace {

// The same limit as `vitlens export --rollout` (its --raw check): every (N, N) weight is kept.
void check_rollout_fits(const VitModel& model, const PatchGrid& grid) {
  const int tokens = model.config.prefix_tokens() + grid.grid_h * grid.grid_w;
  const double bytes = 4.0 * model.config.depth * model.config.num_heads * static_cast<double>(tokens) * tokens;
  if (tokens > kMaxRawTokens || bytes > kMaxRawBytes)
    throw Error("rollout multiplies every layer's (N, N) weights and is limited to " + std::to_string(kMaxRawTokens) +
                " tokens; this image has " + std::to_string(tokens) + " at this working size; choose a smaller one");
}

}  // namespace

bool Worker::add_rollout(Computation& comp, std::chrono::steady_clock::time_point t0) {
  set_activity("attention rollout");
  comp.rollout_options.fusion = comp.key.rollout.fusion;
  comp.rollout_options.discard_ratio = comp.key.rollout.discard;
  comp.rollout_options.first_layer = comp.key.rollout.first_layer;
  comp.rollout_options.last_layer = comp.key.rollout.last_layer;
  comp.rollout = attention_rollout(comp.forward, comp.rollout_options);
  comp.rollout_ms = ms_since(t0);
  // Only the (N, N) rollout is kept: the maps and the statistics read q, K and the stored rows.
  for (LayerState& layer : comp.forward.layers) std::vector<MatRM>().swap(layer.probs);
  return !cancel_;
}

std::shared_ptr<Computation> Worker::compute(const ComputeResult& result, const ComputeJob& job) {
  const VitModel& model = result.model->model;
  auto comp = std::make_shared<Computation>();
  comp->serial = g_next_serial++;
  comp->key = make_forward_key(*result.model, *result.image, job.choice);
  set_activity("preparing the image");
  // What `vitlens export` prepares for the same settings (analyse_image), from the same pixels.
  if (comp->key.preprocess == Preprocess::Model)
    comp->image = prepare_image_transformed(result.image->pixels, model.config, result.model->transform, result.image->path);
  else
    comp->image = prepare_image(result.image->pixels, model.config, comp->key.max_side, result.image->path);
  const size_t patches = static_cast<size_t>(comp->image.grid.grid_h * comp->image.grid.grid_w);
  if (!comp->key.painted.empty() && comp->key.painted.size() != patches) comp->key.painted.clear();

  set_activity("forward pass");
  ForwardOptions options = forward_options_for_key(comp->key);
  options.progress = progress_between(0.0f, 0.7f);
  if (comp->key.rollout.on) {
    check_rollout_fits(model, comp->image.grid);
    options.keep_probs = true;
  }
  auto t0 = std::chrono::steady_clock::now();
  comp->forward = forward(model, comp->image.grid, options);
  comp->forward_ms = ms_since(t0);
  comp->predictions = predict(model, comp->forward);
  if (comp->key.rollout.on && !add_rollout(*comp, t0)) return nullptr;

  set_activity("head statistics");
  t0 = std::chrono::steady_clock::now();
  comp->stats = head_statistics(model, comp->forward,
                                options.mask_padding ? comp->image.grid.patch_is_padding : std::vector<uint8_t>{},
                                kStatsQueries, progress_between(0.7f, 0.85f));
  // Default options (256 queries), as the export's JSON: the window shows the exported numbers.
  comp->roles = head_role_scores(model, comp->image.grid, comp->forward, HeadRoleOptions{}, progress_between(0.85f, 1.0f));
  comp->stats_ms = ms_since(t0);
  return comp;
}

ComputeResult Worker::run_compute(uint64_t id, const ComputeJob& job) {
  ComputeResult result;
  result.job = id;
  result.model = job.model;
  result.image = job.image;
  try {
    load_files(job, result);
    if (!result.model || !result.image) return result;  // nothing to compute yet
    result.comp = cancel_ ? nullptr : compute(result, job);
    result.cancelled = !result.comp;
  } catch (const Error& e) {
    if (cancel_ && std::string(e.what()) == "cancelled") {
      // Superseded: the newer job carries this one's file loads too (controller.cpp merges them).
      result.cancelled = true;
      return result;
    }
    result.error = e.what();
  } catch (const std::bad_alloc&) {
    result.error = "out of memory: use a smaller working size";
  } catch (const std::exception& e) {
    result.error = std::string("unexpected error: ") + e.what();
  }
  return result;
}

ExportResult Worker::run_export(uint64_t id, ExportJob& job) {
  ExportResult result;
  result.job = id;
  result.folder = job.settings.out_dir;
  try {
    const VitModel& model = job.model->model;
    if (job.settings.raw && job.rollout_query < 0) {
      // The raw weights are (L, H, N, N): recompute the same pass keeping them (the on-screen pass
      // keeps only what the maps need). Same inputs, same numbers.
      const int tokens = job.analysis.forward.tokens;
      if (tokens > kMaxRawTokens)
        throw Error(job.analysis.image_path + ": the raw weights are limited to " + std::to_string(kMaxRawTokens) +
                    " tokens; this image has " + std::to_string(tokens) + "; use a smaller working size");
      set_activity("forward pass for the raw weights");
      ForwardOptions options = job.options;
      options.keep_probs = true;
      options.progress = [this](float f) {
        progress_ = 0.8f * f;
        return true;
      };
      job.analysis.forward = forward(model, job.analysis.image.grid, options);
    }
    set_activity("writing the export");
    job.settings.view_notes = job.view_notes;  // <stem>_view.json, in the same set as the rest
    // As `vitlens export` names them: "<stem>_2" when an output's name is the image itself.
    ExportPlan plan;
    plan.kind = job.rollout_query >= 0 ? ExportPlan::Kind::Rollout : ExportPlan::Kind::Maps;
    plan.heads = model.config.num_heads;
    plan.raw = job.settings.raw && job.rollout_query < 0;
    plan.pool = model.config.attention_pool;
    plan.view_notes = !job.view_notes.is_null();
    job.settings.stem = StemChooser(job.settings.out_dir, plan, {job.analysis.image_path}).choose(job.analysis.image_path);
    if (job.rollout_query >= 0)  // rollout mode: what `vitlens export --rollout` writes
      result.files = write_rollout(model, job.analysis.image_path, job.analysis.image, job.analysis.forward,
                                   job.rollout_matrix, job.rollout_query, job.rollout_options, job.settings, job.rollout_ms);
    else
      result.files = write_export(model, job.analysis, job.settings);
  } catch (const OutputConflict& e) {
    // The viewer never replaces a file vitlens did not write (the CLI's --force does, when asked).
    result.error = std::string(e.what()) + (e.forcible ? "; move it away or export to another folder" : "; export to another folder");
  } catch (const Error& e) {
    result.error = e.what();
  } catch (const std::exception& e) {
    result.error = std::string("export failed: ") + e.what();
  }
  progress_ = 1.0f;
  return result;
}

}  // namespace vitlens::viewer
