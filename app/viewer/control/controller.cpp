// The viewer's state changes (see controller.hpp): the helpers the controller's files share, the
// start, the worker's results, the requests and the actions. Elsewhere: derived.cpp (the caches),
// export_view.cpp (export and output folders), state_json.cpp, widget_list.cpp, script_verbs.cpp.
// Index:
//   [SECTION] Helpers
//   [SECTION] Start and stop
//   [SECTION] Worker results and requests
//   [SECTION] Actions
#include "control/controller.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include <sys/stat.h>

#include "control/controller_detail.hpp"
#include "control/file_list.hpp"
#include "core/model/attention.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/render/export_layers.hpp"
#include "core/render/heatmap.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

// [SECTION] Helpers (controller_detail.hpp)

namespace detail {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void set_message(App& app, const std::string& text, bool error) {
  app.ui.message.text = text;
  app.ui.message.error = error;
}

void persist(App& app) {
  if (app.settings_file.empty() || app.settings_left_alone) return;
  try {
    save_settings(app.settings_file, app.settings);
  } catch (const Error& e) {
    set_message(app, e.what(), true);
  }
}

std::string format_float(float v) {
  char buf[32];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}

int query_token(const App& app) {
  const Computation& c = *app.doc.comp;
  if (app.ui.view.query_prefix >= 0 && app.ui.view.query_prefix < c.forward.prefix) return app.ui.view.query_prefix;
  return c.forward.prefix + app.ui.view.query_row * c.forward.grid_w + app.ui.view.query_col;
}

MapRequest shown_request(const App& app) {
  MapRequest request;
  request.layer = current_layer(app);
  request.mode = app.ui.view.mode;
  if (app.ui.compute.rollout.on)
    request.mode = app.ui.view.rollout_from_query || !app.doc.comp->forward.has_class_token ? MapMode::Query : MapMode::ClassToken;
  if (request.mode == MapMode::Query) request.query_token = query_token(app);
  return request;
}

bool in_grid(const App& app, int row, int col) {
  return row >= 0 && col >= 0 && row < grid_rows(app) && col < grid_cols(app);
}

}  // namespace detail

using namespace detail;

namespace {

// The forward pass the UI asks for, when one must be started.
std::optional<ForwardKey> wanted_key(const App& app) {
  if (app.compute_job != 0 && !app.in_flight_key) return std::nullopt;  // a file is loading
  if (!app.doc.model || !app.doc.image) return std::nullopt;
  ForwardKey desired = make_forward_key(*app.doc.model, *app.doc.image, app.ui.compute);
  if (app.doc.comp && app.doc.comp->key == desired) return std::nullopt;
  if (app.in_flight_key && *app.in_flight_key == desired) return std::nullopt;
  if (app.failed_key && *app.failed_key == desired) return std::nullopt;
  return desired;
}

void submit_compute(App& app, ComputeJob job) {
  // A newer job replaces the one in flight, so it carries that one's file loads along.
  if (app.compute_job != 0) {
    if (job.load_image.empty()) job.load_image = app.compute_in_flight.load_image;
    if (job.load_model.empty()) job.load_model = app.compute_in_flight.load_model;
  }
  const bool loads = !job.load_image.empty() || !job.load_model.empty();
  app.in_flight_key.reset();
  if (!loads && job.model && job.image) app.in_flight_key = make_forward_key(*job.model, *job.image, job.choice);
  app.compute_in_flight = job;
  app.compute_job = app.worker.submit(std::move(job));
}

// A new computation arrived: keep the query, layer, mode and painted mask meaningful for it.
void fit_choices_to(App& app, int old_rows, int old_cols) {
  const Computation& c = *app.doc.comp;
  const int rows = c.forward.grid_h, cols = c.forward.grid_w;
  ViewChoice& v = app.ui.view;
  if (v.query_row < 0 || v.query_col < 0 || old_rows <= 0) {
    v.query_row = rows / 2;
    v.query_col = cols / 2;
  } else if (old_rows != rows || old_cols != cols) {
    // Same place in the picture on the new grid.
    v.query_row = static_cast<int>((v.query_row + 0.5) * rows / old_rows);
    v.query_col = static_cast<int>((v.query_col + 0.5) * cols / old_cols);
  }
  v.query_row = std::clamp(v.query_row, 0, rows - 1);
  v.query_col = std::clamp(v.query_col, 0, cols - 1);
  if (v.key_row >= rows || v.key_col >= cols) v.key_row = v.key_col = -1;
  if (v.layer >= static_cast<int>(c.forward.layers.size())) v.layer = -1;
  if (v.mode == MapMode::ClassToken && !c.forward.has_class_token) v.mode = MapMode::Query;
  if (v.mode == MapMode::Pool && c.forward.pool_probs.size() == 0) v.mode = MapMode::Query;  // a model without a pool
  if (v.query_prefix >= c.forward.prefix) v.query_prefix = -1;  // a model without that token
  if (v.focus_head >= app.doc.model->model.config.num_heads) v.focus_head = -1;
  RolloutChoice& r = app.ui.compute.rollout;
  const int depth = static_cast<int>(c.forward.layers.size());
  if (r.last_layer >= depth) r.last_layer = -1;
  if (r.first_layer >= depth) r.first_layer = 0;
  if (old_rows != rows || old_cols != cols || app.ui.compute.painted.size() != static_cast<size_t>(rows * cols))
    app.ui.compute.painted.clear();
}

}  // namespace

int grid_rows(const App& app) { return app.doc.comp ? app.doc.comp->forward.grid_h : 0; }
int grid_cols(const App& app) { return app.doc.comp ? app.doc.comp->forward.grid_w : 0; }
int model_layers(const App& app) { return app.doc.comp ? static_cast<int>(app.doc.comp->forward.layers.size()) : 0; }
int current_layer(const App& app) {
  const int layers = model_layers(app);
  if (layers == 0) return 0;
  return app.ui.view.layer < 0 ? layers - 1 : std::min(app.ui.view.layer, layers - 1);
}

// [SECTION] Start and stop

std::string load_app_settings(App& app) {
  std::string warning;
  if (!app.settings_file.empty()) {
    app.settings = load_settings(app.settings_file, &warning);
    if (!warning.empty()) set_message(app, warning, true);
    app.settings_left_alone = !warning.empty();
    app.settings_warning = warning;
    const Settings& s = app.settings;
    if (is_colormap(s.colormap)) app.ui.display.style.colormap = s.colormap;
    app.ui.display.style.alpha = s.alpha;
    parse_normalize_name(s.normalize, app.ui.display.normalize);
    parse_upsample(s.upsample, app.ui.display.style.upsample);
    app.ui.display.show_grid = s.show_grid;
    parse_precision(s.precision, app.ui.compute.precision);  // an unknown name keeps the default
    app.ui.recent_images = s.recent_images;
    app.ui.recent_models = s.recent_models;
    if (!s.last_folder.empty()) app.ui.browser.folder = s.last_folder;
    if (!s.export_folder.empty()) app.ui.export_folder = s.export_folder;
  }
  return warning;
}

void start_app(App& app, const std::string& image_path, const std::string& model_path) {
  if (app.ui.export_folder.empty()) app.ui.export_folder = default_export_folder();
  if (app.ui.screenshot_path.empty()) app.ui.screenshot_path = join_path(default_export_folder(), "vitlens-screenshot.png");
  ComputeJob job;
  job.load_image = image_path;
  job.load_model = model_path;
  job.load_options = app.load_options;
  job.choice = app.ui.compute;
  submit_compute(app, std::move(job));
}

void save_app_settings(App& app, int window_w, int window_h) {
  Settings& s = app.settings;
  s.colormap = app.ui.display.style.colormap;
  s.alpha = app.ui.display.style.alpha;
  s.normalize = normalize_name(app.ui.display.normalize);
  s.upsample = upsample_name(app.ui.display.style.upsample);
  s.show_grid = app.ui.display.show_grid;
  s.precision = precision_name(app.ui.compute.precision);
  s.recent_images = app.ui.recent_images;
  s.recent_models = app.ui.recent_models;
  s.last_folder = app.ui.browser.folder;
  if (window_w > 0 && window_h > 0) {
    s.window_w = window_w;
    s.window_h = window_h;
  }
  persist(app);
}

// [SECTION] Worker results and requests

namespace {

// A pass or a file load failed: the current image and model stay.
void take_failure(App& app, const ComputeResult& r, const ComputeJob& job) {
  Document& doc = app.doc;
  set_message(app, r.error, true);
  app.last_load_error = r.error;
  // At start, when nothing is loaded yet, keep what did load.
  if (!doc.model && r.model && !doc.comp) doc.model = r.model;
  if (!doc.image && r.image && !doc.comp) doc.image = r.image;
  // A pass that failed on what is loaded now (not a file that failed to load) is not retried
  // until a setting changes.
  if (r.model && r.image && doc.model == r.model && doc.image == r.image)
    app.failed_key = make_forward_key(*r.model, *r.image, job.choice);
}

// Recent files are remembered with absolute paths, so they open from any folder later.
void remember_loaded_files(App& app, const ComputeResult& r) {
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::absolute(path, ec);
    return ec ? path : p.lexically_normal().string();
  };
  if (r.loaded_image) {
    app.ui.compute.painted.clear();  // a new image: its own patches, never the last image's mask
    remember_recent(app.ui.recent_images, absolute(r.image->path));
    app.settings.recent_images = app.ui.recent_images;
  }
  // A model a Train window saved to its temporary folder (this viewer's or another's) goes with
  // that window: not remembered.
  if (r.loaded_model && !TrainSession::in_a_temporary_folder(r.model->path)) {
    remember_recent(app.ui.recent_models, absolute(r.model->path));
    app.settings.recent_models = app.ui.recent_models;
  }
  if (r.loaded_image || r.loaded_model) persist(app);
}

// A new computation on screen, the choices fitted to its grid.
void take_computation(App& app, const ComputeResult& r) {
  Document& doc = app.doc;
  const int old_rows = grid_rows(app), old_cols = grid_cols(app);
  doc.model = r.model;
  doc.image = r.image;
  doc.comp = r.comp;
  app.failed_key.reset();
  fit_choices_to(app, old_rows, old_cols);
  const Computation& c = *doc.comp;
  char text[512];
  if (r.loaded_image || r.loaded_model) {
    // The grid is not part of it: the status bar shows the current grid beside the message.
    std::snprintf(text, sizeof text, "Opened %s (%dx%d) with %s", r.image->path.c_str(), c.image.source_w,
                  c.image.source_h, doc.model->model.config.name.c_str());
    // The settings' warning outlives the first opening (the status bar shows what was opened).
    if (app.settings_warning.empty()) set_message(app, text, false);
    else set_message(app, app.settings_warning, true);
    app.settings_warning.clear();
  } else if (app.ui.message.error) {
    app.ui.message = {};  // a later good result clears an old error
  }
}

void take_compute_result(App& app, const ComputeResult& r) {
  if (r.job != app.compute_job) return;  // superseded while it finished
  const ComputeJob job = app.compute_in_flight;
  app.compute_job = 0;
  app.in_flight_key.reset();
  if (!r.error.empty()) {
    take_failure(app, r, job);
    return;
  }
  remember_loaded_files(app, r);
  if (r.comp) {
    take_computation(app, r);
    return;
  }
  // Loaded, nothing to compute yet (the other file is missing).
  if (r.model) app.doc.model = r.model;
  if (r.image) app.doc.image = r.image;
}

void take_export_result(App& app, const ExportResult& r) {
  app.export_jobs.erase(std::remove(app.export_jobs.begin(), app.export_jobs.end(), r.job), app.export_jobs.end());
  if (!r.error.empty()) {
    report_export_failure(app, "Export failed: " + r.error);
    return;
  }
  std::string names;
  for (const std::string& f : r.files) names += (names.empty() ? "" : ", ") + std::filesystem::path(f).filename().string();
  // The folder last: a status bar too narrow for the whole message shows its end.
  set_message(app, "Exported " + std::to_string(r.files.size()) + " files (" + names + ") into " + r.folder, false);
  app.settings.export_folder = r.folder;
  persist(app);
}

}  // namespace

void poll_worker(App& app) {
  for (const ComputeResult& r : app.worker.take_compute_results()) take_compute_result(app, r);
  for (const ExportResult& r : app.worker.take_export_results()) take_export_result(app, r);
}

void finish_exports(App& app, const std::function<void(const std::string&, bool)>& said) {
  if (app.export_jobs.empty()) return;
  app.worker.submit(ComputeJob{});  // cancels a pass nobody will see; the exports run first
  app.compute_job = 0;
  while (!app.export_jobs.empty()) {
    for (const ExportResult& r : app.worker.take_export_results()) {
      take_export_result(app, r);
      said(app.ui.message.text, app.ui.message.error);
    }
    app.worker.take_compute_results();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void process_requests(App& app) {
  Requests& req = app.requests;
  if (!req.open_image.empty() || !req.open_model.empty()) {
    ComputeJob job;
    job.model = app.doc.model;
    job.image = app.doc.image;
    job.load_image = req.open_image;
    job.load_model = req.open_model;
    job.load_options = app.load_options;
    job.choice = app.ui.compute;
    if (!req.open_image.empty()) job.choice.painted.clear();  // a new image: its own patches
    set_message(app, "Loading " + (req.open_image.empty() ? req.open_model : req.open_image) + " ...", false);
    submit_compute(app, std::move(job));
    req.open_image.clear();
    req.open_model.clear();
  }
  if (!req.export_folder.empty()) {
    start_export(app, req.export_folder);
    req.export_folder.clear();
  }
}

void schedule_compute(App& app) {
  if (!wanted_key(app)) return;
  ComputeJob job;
  job.model = app.doc.model;
  job.image = app.doc.image;
  job.choice = app.ui.compute;
  submit_compute(app, std::move(job));
}

bool is_idle(const App& app) {
  const bool maps_current = !app.doc.comp || app.derived.comp_serial == app.doc.comp->serial;
  return maps_current && app.compute_job == 0 && app.export_jobs.empty() && !app.worker.busy() && !app.requests.any() &&
         app.input.empty() && !wanted_key(app) && !training_wait_pending(app);
}

void note_display_size(LayoutState& layout, float width, float height) {
  if (width == layout.display_w && height == layout.display_h) return;
  if (layout.display_w > 0.0f) ++layout.generation;
  layout.display_w = width;
  layout.display_h = height;
}

// [SECTION] Actions

void pin_query(App& app, int row, int col) {
  if (!app.doc.comp) return;
  app.ui.view.query_row = std::clamp(row, 0, grid_rows(app) - 1);
  app.ui.view.query_col = std::clamp(col, 0, grid_cols(app) - 1);
  app.ui.view.query_prefix = -1;      // the patch is the query again
  app.ui.view.mode = MapMode::Query;  // pinning a query means: show this query's maps
}

void move_query(App& app, int drow, int dcol) {
  if (!app.doc.comp) return;
  pin_query(app, app.ui.view.query_row + drow, app.ui.view.query_col + dcol);
}

void set_hover(App& app, int row, int col) {
  ViewChoice& v = app.ui.view;
  if (!in_grid(app, row, col)) {
    v.hover_row = v.hover_col = -1;
    return;
  }
  v.hover_row = v.key_row = row;
  v.hover_col = v.key_col = col;
}

void paint_patch(App& app, int row, int col, bool forbid) {
  if (!in_grid(app, row, col)) return;
  auto& painted = app.ui.compute.painted;
  painted.resize(static_cast<size_t>(grid_rows(app) * grid_cols(app)), 0);
  painted[static_cast<size_t>(row * grid_cols(app) + col)] = forbid ? 1 : 0;
  app.ui.compute.mask = MaskMode::Painted;
}

void clear_paint(App& app) { app.ui.compute.painted.clear(); }

namespace {

// The folder itself when it exists, else its nearest existing parent (an export folder that is
// created on the first export).
std::string nearest_existing_folder(const std::string& folder) {
  std::error_code ec;
  std::string f = output_path(folder);
  while (!std::filesystem::is_directory(f, ec) && f != "/") f = parent_folder(f);
  return f;
}

}  // namespace

void open_browser(App& app, BrowserPurpose purpose) {
  BrowserState& b = app.ui.browser;
  b.purpose = purpose;
  b.open_requested = true;
  b.typed.clear();
  std::error_code ec;
  if (purpose == BrowserPurpose::ExportFolder || purpose == BrowserPurpose::ScreenshotFile) {
    // The list shows where the path field points: the export folder, or the screenshot's folder.
    const std::string& target = purpose == BrowserPurpose::ExportFolder ? app.ui.export_folder : app.ui.screenshot_path;
    b.typed = output_path(target);
    b.folder = nearest_existing_folder(purpose == BrowserPurpose::ExportFolder ? b.typed : folder_of(b.typed));
  } else if (b.folder.empty() || !std::filesystem::is_directory(b.folder, ec)) {
    const std::filesystem::path start = std::filesystem::absolute(folder_of(app.doc.image ? app.doc.image->path : ""), ec);
    b.folder = start.lexically_normal().string();
  }
  b.listed_folder.clear();  // list it afresh
}

bool patch_under(const App& app, const Rect& picture, float sx, float sy, int& row, int& col, int& px, int& py) {
  const int rows = grid_rows(app), cols = grid_cols(app);
  if (rows == 0 || picture.w <= 0.0f || picture.h <= 0.0f) return false;
  const float u = (sx - picture.x) / picture.w, v = (sy - picture.y) / picture.h;
  if (!(u >= 0.0f && v >= 0.0f && u < 1.0f && v < 1.0f)) return false;
  const int p = app.doc.model->model.config.patch_size;
  px = std::min(cols * p - 1, static_cast<int>(u * static_cast<float>(cols * p)));
  py = std::min(rows * p - 1, static_cast<int>(v * static_cast<float>(rows * p)));
  row = py / p;
  col = px / p;
  return true;
}

void set_mask(App& app, MaskMode mode) { app.ui.compute.mask = mode; }

bool set_query_prefix(App& app, int token) {
  if (token < 0) {
    app.ui.view.query_prefix = -1;
    return true;
  }
  if (!app.doc.comp || token >= app.doc.comp->forward.prefix) return false;
  app.ui.view.query_prefix = token;
  if (!app.ui.compute.rollout.on) app.ui.view.mode = MapMode::Query;  // as pinning a patch does
  return true;
}

void open_grid_cell(App& app, int layer, int head) {
  if (!app.doc.model || head < 0 || head >= app.doc.model->model.config.num_heads) return;
  if (layer == model_layers(app) && app.doc.model->model.config.attention_pool) {  // the grid's pool row
    app.ui.view.mode = MapMode::Pool;
    app.ui.view.focus_head = head;
    app.ui.compute.rollout.on = false;
    return;
  }
  if (layer < 0 || layer >= model_layers(app)) return;
  if (app.ui.view.mode == MapMode::Pool) app.ui.view.mode = MapMode::Query;  // a block's tile: the blocks' query
  app.ui.view.layer = layer;
  app.ui.view.focus_head = head;
  // The grid shows attention maps: the cell opens as one, also from rollout mode.
  if (app.ui.compute.rollout.on) {
    app.ui.view.mode = app.ui.view.rollout_from_query || !app.doc.comp->forward.has_class_token ? MapMode::Query
                                                                                                 : MapMode::ClassToken;
    app.ui.compute.rollout.on = false;
  }
}

void set_rollout(App& app, bool on) { app.ui.compute.rollout.on = on; }

std::string map_mode_caption(const App& app) {
  if (app.ui.compute.rollout.on)
    return "Rollout: the heads fused and the layers multiplied, from the class token or the query: which patches "
           "reach the output through every layer.";
  switch (app.ui.view.mode) {
    case MapMode::Query:
      return "Query patch: where one patch looks. Click a patch (or use the arrow keys) and each head lights up the "
             "patches it draws from: edges, texture, colour or nearby patches.";
    case MapMode::ClassToken: return "Class token: where the class token looks, the summary the classifier reads.";
    case MapMode::Pool:
      return "Attention pool: where the head's learned query looks over the last layer's patch tokens (SigLIP's "
             "pooled vector is their weighted sum); it sits after the blocks, so the layer does not change it.";
    case MapMode::Received:
      return "Received: how much attention each patch gets, averaged over every query; a few patches that every "
             "query visits stand out.";
  }
  return {};
}

// =============================================================================================
// [SECTION] Screenshots
// =============================================================================================
namespace {

constexpr const char* kDefaultScreenshotName = "vitlens-screenshot";

}  // namespace

std::string screenshot_path(const std::string& requested) {
  std::error_code ec;
  if (requested.empty()) throw Error("no file name given for the screenshot (such as " + std::string(kDefaultScreenshotName) + ".png)");
  if (requested.back() == '/' || std::filesystem::is_directory(requested, ec))
    throw Error(requested + ": is a folder; a screenshot needs a file name (such as " + kDefaultScreenshotName + ".png)");
  std::string path = output_path(requested);
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(), [](unsigned char c) { return std::tolower(c); });
  if (extension.empty()) return path + ".png";
  if (extension != ".png")
    throw Error(requested + ": a screenshot is a PNG file; give the name the extension .png");
  return path;
}

void save_screenshot(App& app, const std::string& requested, const cv::Mat& rgb8) {
  std::string path = requested;
  try {
    path = screenshot_path(requested);
    prepare_output_folder(folder_of(path));
    auto taken = file_stamp(path);
    const bool ours = taken && app.screenshots_written.count(*taken) > 0;
    if (taken && !ours) {
      const std::filesystem::path p(path);
      if (p.stem() != kDefaultScreenshotName || p.extension() != ".png")
        throw Error(path + ": exists and is not a screenshot this window saved; vitlens replaces no file it did not "
                           "write: choose another name");
      for (int n = 2; taken; ++n) {  // the default name, numbered on
        path = (p.parent_path() / (std::string(kDefaultScreenshotName) + "_" + std::to_string(n) + ".png")).string();
        taken = file_stamp(path);
      }
    }
    if (ours) {
      write_png_atomic(path, rgb8);
    } else {  // a new name: committed only while nothing has it (a file made meanwhile stays)
      FileGroup group(folder_of(path), true);
      const std::vector<unsigned char> bytes = png_bytes(rgb8, path);
      group.add_stream(std::filesystem::path(path).filename().string(),
                       [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
      group.commit();
    }
    if (const auto written = file_stamp(path)) app.screenshots_written.insert(*written);
    set_message(app, "Saved the screenshot to " + path, false);
  } catch (const Error& e) {
    report_export_failure(app, std::string("Screenshot failed: ") + e.what());
  }
}

}  // namespace vitlens::viewer
