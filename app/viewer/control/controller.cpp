// The viewer's state changes (see controller.hpp). Index:
//   [SECTION] Names
//   [SECTION] Helpers
//   [SECTION] Start and stop
//   [SECTION] Worker results and requests
//   [SECTION] Derived state
//   [SECTION] Actions
//   [SECTION] Export
//   [SECTION] Script
//   [SECTION] State for tests
#include "control/controller.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "control/file_list.hpp"
#include "core/model/attention.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/render/export_layers.hpp"
#include "core/render/heatmap.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

// [SECTION] Names

const char* mask_mode_name(MaskMode mode) {
  switch (mode) {
    case MaskMode::None: return "none";
    case MaskMode::Padding: return "padding";
    case MaskMode::Causal: return "causal";
    case MaskMode::Painted: return "painted";
  }
  return "?";
}

bool parse_mask_mode(const std::string& name, MaskMode& mode) {
  for (MaskMode m : {MaskMode::None, MaskMode::Padding, MaskMode::Causal, MaskMode::Painted})
    if (name == mask_mode_name(m)) {
      mode = m;
      return true;
    }
  return false;
}

const char* scale_mode_name(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Model: return "default";
    case ScaleMode::Unscaled: return "none";
    case ScaleMode::Temperature: return "temperature";
  }
  return "?";
}

bool parse_map_mode(const std::string& name, MapMode& mode) {
  for (MapMode m : {MapMode::Query, MapMode::ClassToken, MapMode::Received})
    if (name == map_mode_name(m)) {
      mode = m;
      return true;
    }
  return false;
}

bool parse_normalize(const std::string& name, Normalize& normalize) {
  for (Normalize n : {Normalize::PerHead, Normalize::Shared, Normalize::Log, Normalize::Robust})
    if (name == normalize_name(n)) {
      normalize = n;
      return true;
    }
  return false;
}

const char* upsample_name(Upsample upsample) { return upsample == Upsample::Nearest ? "nearest" : "bilinear"; }

bool parse_upsample(const std::string& name, Upsample& upsample) {
  if (name == "nearest") upsample = Upsample::Nearest;
  else if (name == "bilinear") upsample = Upsample::Bilinear;
  else return false;
  return true;
}

// [SECTION] Helpers

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void set_message(App& app, const std::string& text, bool error) {
  app.ui.message.text = text;
  app.ui.message.error = error;
}

void persist(App& app) {
  if (app.settings_file.empty()) return;
  try {
    save_settings(app.settings_file, app.settings);
  } catch (const Error& e) {
    set_message(app, e.what(), true);
  }
}

// The shortest text that reads back as the same float (0.6f -> "0.6", not "0.600000024").
std::string format_float(float v) {
  char buf[32];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}

// The query's token: the chosen prefix token, else the pinned patch.
int query_token(const App& app) {
  const Computation& c = *app.doc.comp;
  if (app.ui.view.query_prefix >= 0 && app.ui.view.query_prefix < c.forward.prefix) return app.ui.view.query_prefix;
  return c.forward.prefix + app.ui.view.query_row * c.forward.grid_w + app.ui.view.query_col;
}

// What the maps show: the map mode's request, or in rollout mode the attention of the rollout's
// own row (the class token, or the query), so the layers x heads grid shows where that token looks.
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
    const Settings& s = app.settings;
    if (is_colormap(s.colormap)) app.ui.display.style.colormap = s.colormap;
    app.ui.display.style.alpha = s.alpha;
    parse_normalize(s.normalize, app.ui.display.normalize);
    parse_upsample(s.upsample, app.ui.display.style.upsample);
    app.ui.display.show_grid = s.show_grid;
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

void poll_worker(App& app) {
  for (ComputeResult& r : app.worker.take_compute_results()) {
    if (r.job != app.compute_job) continue;  // superseded while it finished
    const ComputeJob job = app.compute_in_flight;
    app.compute_job = 0;
    app.in_flight_key.reset();
    Document& doc = app.doc;
    if (!r.error.empty()) {
      set_message(app, r.error, true);
      app.last_load_error = r.error;
      // The current image and model stay. At start, when nothing is loaded yet, keep what did load.
      if (!doc.model && r.model && !doc.comp) doc.model = r.model;
      if (!doc.image && r.image && !doc.comp) doc.image = r.image;
      // A pass that failed on what is loaded now (not a file that failed to load) is not retried
      // until a setting changes.
      if (r.model && r.image && doc.model == r.model && doc.image == r.image)
        app.failed_key = make_forward_key(*r.model, *r.image, job.choice);
      continue;
    }
    // Recent files are remembered with absolute paths, so they open from any folder later.
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
    if (r.loaded_model) {
      remember_recent(app.ui.recent_models, absolute(r.model->path));
      app.settings.recent_models = app.ui.recent_models;
    }
    if (r.loaded_image || r.loaded_model) persist(app);
    if (!r.comp) {  // loaded, nothing to compute yet (the other file is missing)
      if (r.model) doc.model = r.model;
      if (r.image) doc.image = r.image;
      continue;
    }
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
      set_message(app, text, false);
    } else if (app.ui.message.error) {
      app.ui.message = {};  // a later good result clears an old error
    }
  }
  for (ExportResult& r : app.worker.take_export_results()) {
    app.export_jobs.erase(std::remove(app.export_jobs.begin(), app.export_jobs.end(), r.job), app.export_jobs.end());
    if (!r.error.empty()) {
      report_export_failure(app, "Export failed: " + r.error);
      continue;
    }
    std::string names;
    for (const std::string& f : r.files) names += (names.empty() ? "" : ", ") + std::filesystem::path(f).filename().string();
    set_message(app, "Exported " + std::to_string(r.files.size()) + " files to " + r.folder + ": " + names, false);
    app.settings.export_folder = r.folder;
    persist(app);
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

// [SECTION] Derived state

void update_derived(App& app) {
  Derived& d = app.derived;
  const UiState& ui = app.ui;

  // The worked example does not need an image.
  if (!d.example_valid || d.example_inputs != ui.example) {
    MatRM q(2, 2), k(3, 2), v(3, 2);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 2; ++c) {
        if (r < 2) q(r, c) = ui.example.q[r][c];
        k(r, c) = ui.example.k[r][c];
        v(r, c) = ui.example.v[r][c];
      }
    // The seed's example: scores = Q @ K.T / math.sqrt(2); weights = softmax; context = weights @ V
    const float scale = ui.example.scaled ? 1.0f / std::sqrt(2.0f) : 1.0f;
    const AttentionResult res = scaled_dot_product_attention(q, k, v, {}, scale);
    d.example.scores = (q * k.transpose()) * scale;
    d.example.weights = res.weights;
    d.example.context = res.context;
    d.example_inputs = ui.example;
    d.example_valid = true;
  }

  if (d.ramp_colormap != ui.display.style.colormap) {
    cv::Mat ramp(1, 256, CV_32F);
    for (int x = 0; x < 256; ++x) ramp.at<float>(0, x) = static_cast<float>(x) / 255.0f;
    d.colormap_ramp = apply_colormap(ramp, ui.display.style.colormap);
    d.ramp_colormap = ui.display.style.colormap;
    ++d.ramp_version;
  }

  if (!app.doc.ready()) return;
  const Computation& c = *app.doc.comp;
  const VitModel& model = app.doc.model->model;
  if (d.comp_serial != c.serial) {
    d.comp = &c;
    d.comp_serial = c.serial;
    d.view = ImageAnalysis{};
    d.view.image_path = app.doc.image->path;
    d.view.image = c.image;
    d.view.forward = c.forward;  // render_export_images marks the query on the grid it describes
    d.view.forward_ms = c.forward_ms;
    c.image.rgb.convertTo(d.base_rgb8, CV_8UC3, 255.0);
    ++d.base_version;
    d.map_key.clear();
  }

  // Maps: one attention row per head for a query (O(N d) each), or a stored row.
  const int layer = current_layer(app);
  const MapRequest request = shown_request(app);
  char key[160];
  std::snprintf(key, sizeof key, "%llu|%d|%d|%d", static_cast<unsigned long long>(c.serial), layer,
                static_cast<int>(request.mode), request.query_token);
  bool maps_changed = false;
  if (d.map_key != key) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      d.raw_maps = attention_maps(model, c.forward, request);
      d.view.request = request;
      d.map_error.clear();
    } catch (const Error& e) {
      d.map_error = e.what();
    }
    d.maps_ms = ms_since(t0);
    d.map_key = key;
    maps_changed = true;
  }

  // Pictures: exactly what write_export draws, from the maps as shown.
  const DisplayState& disp = ui.display;
  const std::string picture_key = d.map_key + "|cm=" + disp.style.colormap + "|" + format_float(disp.style.alpha) + "|" +
                                  upsample_name(disp.style.upsample) + "|" + normalize_name(disp.normalize) + "|" +
                                  (disp.threshold_on ? format_float(disp.threshold) : std::string("off"));
  if ((maps_changed || d.picture_key != picture_key) && !d.raw_maps.heads.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    HeadMaps shown = d.raw_maps;
    // The same core call as `vitlens export --threshold`; the export records it from d.view.
    d.kept = disp.threshold_on ? apply_threshold(shown, disp.threshold) : std::vector<ThresholdResult>{};
    d.view.kept = d.kept;
    d.view.threshold = disp.threshold_on ? disp.threshold : 0.0f;
    d.entropy.clear();
    for (const MatRM& m : shown.heads) d.entropy.push_back(map_entropy(m));
    d.entropy.push_back(map_entropy(shown.mean));
    d.scales = map_scales(shown, disp.normalize);
    d.view.maps = std::move(shown);
    try {
      d.pictures = render_export_images(model, d.view, disp.style, disp.normalize);
    } catch (const Error& e) {
      d.map_error = e.what();  // shown above the heads; the last good pictures stay
    }
    d.render_ms = ms_since(t0);
    d.picture_key = picture_key;
    ++d.pictures_version;
  }

  // Rollout: the row of the rollout matrix the worker made, drawn as export_rollout draws it.
  d.rollout_query = -1;
  if (c.key.rollout.on && c.rollout.rows() == c.forward.tokens) {
    const int token = ui.view.rollout_from_query || !c.forward.has_class_token ? query_token(app) : 0;
    d.rollout_query = token;
    const std::string rollout_key = std::to_string(c.serial) + "|" + std::to_string(token) + "|" + disp.style.colormap + "|" +
                                    format_float(disp.style.alpha) + "|" + upsample_name(disp.style.upsample) + "|" +
                                    normalize_name(disp.normalize);
    if (d.rollout_key != rollout_key) {
      ExportSettings look;
      look.style = disp.style;
      look.normalize = disp.normalize;
      d.rollout_map = rollout_map(c.rollout, c.forward, token);
      d.rollout_picture = rollout_picture(model, c.image, d.rollout_map, look);
      d.rollout_key = rollout_key;
      ++d.rollout_version;
    }
  }

  // The layers x heads grid: every head of every layer for the same request, only while shown.
  if (ui.show_layers) {
    const std::string layers_key = std::to_string(c.serial) + "|" + std::to_string(static_cast<int>(request.mode)) + "|" +
                                   std::to_string(request.query_token) + "|" + disp.style.colormap + "|" +
                                   normalize_name(disp.normalize) + "|" +
                                   (disp.threshold_on ? format_float(disp.threshold) : std::string("off"));
    if (d.layers_key != layers_key) {
      const auto t0 = std::chrono::steady_clock::now();
      LayerGridStyle look;
      look.colormap = disp.style.colormap;
      look.normalize = disp.normalize;
      look.threshold = disp.threshold_on ? disp.threshold : 0.0f;
      look.cell_gap = kLayerGridGap;
      try {
        d.layers = layer_grid(model, c.forward, request.mode, request.query_token, look);
        d.layers_error.clear();
      } catch (const Error& e) {
        d.layers = LayerGrid{};
        d.layers_error = e.what();
      }
      d.layers_ms = ms_since(t0);
      d.layers_key = layers_key;
      ++d.layers_version;
    }
  }

  // Inspector: the pinned query (or the class token in cls mode) against the inspected key.
  const int prefix = c.forward.prefix;
  const int q_token = ui.view.mode == MapMode::ClassToken && c.forward.has_class_token ? 0 : query_token(app);
  const int k_token = in_grid(app, ui.view.key_row, ui.view.key_col)
                          ? prefix + ui.view.key_row * c.forward.grid_w + ui.view.key_col
                          : q_token;
  std::snprintf(key, sizeof key, "%llu|%d|%d|%d", static_cast<unsigned long long>(c.serial), layer, q_token, k_token);
  if (d.inspector_key != key) {
    try {
      d.inspector = inspect_pair(model, c.forward, c.image.grid, layer, q_token, k_token);
      d.inspector_valid = true;
    } catch (const Error&) {
      d.inspector_valid = false;
    }
    d.inspector_key = key;
  }
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
  if (layer < 0 || layer >= model_layers(app) || !app.doc.model || head < 0 || head >= app.doc.model->model.config.num_heads)
    return;
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
    case MapMode::Received:
      return "Received: how much attention each patch gets, averaged over every query; a few patches that every "
             "query visits stand out.";
  }
  return {};
}

// [SECTION] Export

std::string viewer_only_settings(const App& app) {
  if (!app.doc.ready()) return {};
  bool has_padding = false;
  for (uint8_t v : app.doc.comp->image.grid.patch_is_padding) has_padding = has_padding || v;
  // The pass on screen (and exported), not a choice whose pass is still running.
  const ForwardKey& key = app.doc.comp->key;
  const bool mask_ok = key.mask == MaskMode::Padding || key.mask == MaskMode::Causal ||
                       (key.mask == MaskMode::None && !has_padding) || (key.mask == MaskMode::Painted && key.painted.empty());
  // A temperature is `--temperature`; only "no scale" (softmax of the raw q.k) has no flag.
  const bool scale_ok = key.score_scale < 0.0f || key.temperature != 1.0f;
  std::string out;
  if (!mask_ok) out = std::string("the mask '") + mask_mode_name(key.mask) + "'";
  if (!scale_ok) out += std::string(out.empty() ? "" : " and ") + "no softmax scale";
  // Rollout mode: the export is `--rollout`, which takes no threshold (the viewer draws none on it).
  return out;
}

bool cli_equivalent(const App& app) { return app.doc.ready() && viewer_only_settings(app).empty(); }

namespace {

// The `--patch` or `--token` flag of the current query.
std::string query_flag(const App& app) {
  const int prefix = app.doc.comp->forward.prefix;
  if (app.ui.view.query_prefix >= 0 && app.ui.view.query_prefix < prefix)
    return " --token " + prefix_token_short_name(app.doc.model->model.config, app.ui.view.query_prefix);
  return " --patch " + std::to_string(app.ui.view.query_row) + "," + std::to_string(app.ui.view.query_col);
}

// --heads when the model's head count came from it (a timm checkpoint without config.json):
// without it the command could not open the model.
bool model_needed_heads(const App& app) {
  for (const std::string& note : app.doc.model->model.notes)
    if (note.find("from --heads") != std::string::npos) return true;
  return false;
}

}  // namespace

std::string cli_command(const App& app, const std::string& out_dir) {
  if (!app.doc.ready()) return {};
  const UiState& ui = app.ui;
  std::string cmd = "vitlens export '" + app.doc.image->path + "' --model '" + app.doc.model->path + "'";
  if (model_needed_heads(app)) cmd += " --heads " + std::to_string(app.doc.model->model.config.num_heads);
  const auto& f = app.doc.comp->forward;
  const RolloutChoice& rollout = app.doc.comp->key.rollout;  // the pass on screen, resolved
  if (rollout.on) {
    cmd += " --rollout";
    if (ui.view.rollout_from_query || !f.has_class_token) cmd += query_flag(app);
    cmd += std::string(" --fusion ") + head_fusion_name(rollout.fusion) + " --discard " + format_float(rollout.discard);
    if (rollout.first_layer != 0 || rollout.last_layer != static_cast<int>(f.layers.size()) - 1)
      cmd += " --layer " + std::to_string(rollout.first_layer) + "-" + std::to_string(rollout.last_layer);
  } else {
    switch (ui.view.mode) {
      case MapMode::Query: cmd += query_flag(app); break;
      case MapMode::ClassToken: cmd += " --cls"; break;
      case MapMode::Received: cmd += " --received"; break;
    }
    if (ui.view.layer >= 0 && ui.view.layer != static_cast<int>(f.layers.size()) - 1)
      cmd += " --layer " + std::to_string(current_layer(app));
  }
  if (app.doc.comp->key.mask == MaskMode::Causal) cmd += " --mask causal";
  if (app.doc.comp->key.temperature != 1.0f) cmd += " --temperature " + format_float(app.doc.comp->key.temperature);
  cmd += " --colormap " + ui.display.style.colormap + " --alpha " + format_float(ui.display.style.alpha);
  cmd += std::string(" --upsample ") + upsample_name(ui.display.style.upsample);
  cmd += std::string(" --normalize ") + normalize_name(ui.display.normalize);
  if (ui.display.threshold_on && !rollout.on) cmd += " --threshold " + format_float(ui.display.threshold);
  if (ui.compute.max_side > 0) cmd += " --size " + std::to_string(ui.compute.max_side);
  if (ui.export_raw && !rollout.on) cmd += " --raw";
  cmd += " --out '" + out_dir + "'";
  return cmd;
}

void report_export_failure(App& app, const std::string& text) {
  set_message(app, text, true);
  ++app.export_failures;
  app.last_export_failure = text;
}

void start_export(App& app, const std::string& requested_folder) {
  if (!app.doc.ready() || app.derived.comp_serial != app.doc.comp->serial || app.derived.view.maps.heads.empty()) {
    report_export_failure(app, "Nothing to export yet: open an image and a model first");
    return;
  }
  if (app.ui.compute.rollout.on != app.doc.comp->key.rollout.on) {
    // Rollout mode whose pass failed or is still running: the screen does not show what was asked.
    report_export_failure(app, "Nothing to export yet: the " + std::string(app.ui.compute.rollout.on ? "rollout" : "maps") +
                         " for these settings are not on screen" + (app.compute_job ? " (still computing)" : ""));
    return;
  }
  const std::string folder = output_path(requested_folder);
  try {
    prepare_output_folder(folder);
  } catch (const Error& e) {
    report_export_failure(app, std::string("Export failed: ") + e.what());
    return;
  }
  const Computation& c = *app.doc.comp;
  const UiState& ui = app.ui;
  ExportJob job;
  job.model = app.doc.model;
  job.analysis = app.derived.view;  // image, forward state, request and the maps as shown
  job.analysis.forward_ms = c.forward_ms;
  job.analysis.maps_ms = app.derived.maps_ms;
  ExportSettings& s = job.settings;
  s.out_dir = folder;
  s.layer = current_layer(app);
  s.causal = c.key.mask == MaskMode::Causal;
  s.temperature = c.key.temperature;
  s.style = ui.display.style;
  s.normalize = ui.display.normalize;
  s.raw = ui.export_raw;
  s.max_side = c.key.max_side;
  switch (ui.view.mode) {
    case MapMode::Query:
      s.select = QuerySelect::Patch;
      s.patch_row = ui.view.query_row;
      s.patch_col = ui.view.query_col;
      if (ui.view.query_prefix >= 0 && ui.view.query_prefix < c.forward.prefix) {
        s.select = QuerySelect::Token;
        s.token = prefix_token_short_name(app.doc.model->model.config, ui.view.query_prefix);
      }
      break;
    case MapMode::ClassToken: s.select = QuerySelect::ClassToken; break;
    case MapMode::Received: s.select = QuerySelect::Received; break;
  }
  job.options = forward_options_for_key(c.key);
  if (c.key.rollout.on) {
    if (app.derived.rollout_query < 0) {
      report_export_failure(app, "Nothing to export yet: the rollout is not computed");
      return;
    }
    job.rollout_query = app.derived.rollout_query;
    job.rollout_matrix = c.rollout;
    job.rollout_options = c.rollout_options;
    job.rollout_ms = c.rollout_ms;
    s.raw = false;
  }
  if (!cli_equivalent(app)) {
    // What `vitlens export` cannot express goes into <stem>_view.json beside the usual files.
    nlohmann::json notes;
    notes["note"] = "viewer settings beyond `vitlens export`; the PNGs and JSON beside this file show the view with them";
    notes["mask"] = mask_mode_name(c.key.mask);
    nlohmann::json painted = nlohmann::json::array();
    for (size_t i = 0; i < c.key.painted.size(); ++i)
      if (c.key.painted[i]) painted.push_back({static_cast<int>(i) / c.forward.grid_w, static_cast<int>(i) % c.forward.grid_w});
    notes["painted_patches"] = painted;
    // The scale of the exported pass: the model's 1/sqrt(d), or the factor it ran with.
    notes["scale"] = c.key.score_scale < 0.0f ? "1/sqrt(d)" : "custom";
    notes["score_scale"] = c.forward.score_scale;
    // Floats as the user set them (0.7, not 0.699999988).
    auto exact = [](float v) { return std::strtod(format_float(v).c_str(), nullptr); };
    if (ui.display.threshold_on && !c.key.rollout.on) {
      nlohmann::json kept = nlohmann::json::array();
      for (const ThresholdResult& t : app.derived.kept)
        kept.push_back({{"kept_patches", t.kept_patches}, {"total_patches", t.total_patches}, {"kept_mass", t.kept_mass}});
      notes["threshold"] = {{"mass", exact(ui.display.threshold)}, {"heads_then_mean", kept}};
    }
    job.view_notes = notes;
  }
  set_message(app, "Exporting to " + folder + " ...", false);
  app.export_jobs.push_back(app.worker.submit(std::move(job)));
}

// [SECTION] Output folders

std::string default_export_folder() {
  const char* env = std::getenv("VITLENS_EXPORT_DIR");
  if (env && *env) return output_path(env);
  const char* home = std::getenv("HOME");
  return output_path(home && *home ? join_path(home, "vitlens-exports") : std::string("vitlens-exports"));
}

std::string output_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  std::string s = ec ? path : p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

void prepare_output_folder(const std::string& folder) {
  std::error_code ec;
  if (std::filesystem::is_directory(folder, ec)) return;
  if (output_path(folder) != default_export_folder())
    throw Error(folder + ": no such folder (choose an existing one, or leave the default " + default_export_folder() + ")");
  std::filesystem::create_directories(folder, ec);
  if (ec) throw Error(folder + ": cannot create the export folder (" + ec.message() + ")");
}

void check_output_path(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const std::string folder = folder_of(path);
  if (path.empty() || path.back() == '/' || std::filesystem::is_directory(path, ec))
    throw Error(flag + " " + path + ": expects a file name");
  if (!std::filesystem::is_directory(folder, ec)) throw Error(flag + " " + path + ": the folder " + folder + " does not exist");
}

// [SECTION] Status bar

std::string status_text(const App& app) {
  if (!app.doc.ready()) return {};
  const Computation& c = *app.doc.comp;
  char text[160];
  std::snprintf(text, sizeof text, "%dx%d px, grid %dx%d, %d tokens", c.image.padded_w, c.image.padded_h, c.forward.grid_h,
                c.forward.grid_w, c.forward.tokens);
  return text;
}

// [SECTION] Widgets

const char* widget_kind_name(WidgetKind kind) {
  switch (kind) {
    case WidgetKind::Button: return "button";
    case WidgetKind::Checkbox: return "checkbox";
    case WidgetKind::Radio: return "radio";
    case WidgetKind::Slider: return "slider";
    case WidgetKind::Combo: return "combo";
    case WidgetKind::Input: return "input";
    case WidgetKind::Menu: return "menu";
    case WidgetKind::MenuItem: return "menu item";
    case WidgetKind::Selectable: return "selectable";
    case WidgetKind::Header: return "header";
    case WidgetKind::TreeNode: return "tree node";
    case WidgetKind::Picture: return "picture";
    case WidgetKind::DropTarget: return "drop target";
  }
  return "?";
}

namespace {

std::vector<std::string> split_spec(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t sep = spec.find(" > ", start);
    parts.push_back(spec.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 3;
  }
  return parts;
}

// The parts before the label, in order, among the widget's window and sections (gaps allowed).
bool leading_parts_match(const std::vector<std::string>& parts, const std::vector<std::string>& places) {
  size_t next = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    while (next < places.size() && places[next] != parts[i]) ++next;
    if (next == places.size()) return false;
    ++next;
  }
  return true;
}

std::string widget_path(const WidgetInfo& w) {
  std::string path = w.window;
  for (const std::string& s : w.sections) path += " > " + s;
  return path + " > " + w.label;
}

}  // namespace

const WidgetInfo* find_widget(const WidgetFrame& frame, const std::string& spec, std::string& error) {
  const std::vector<std::string> parts = split_spec(spec);
  std::vector<const WidgetInfo*> found;
  for (const WidgetInfo& w : frame.widgets) {
    if (!w.visible || (w.label != parts.back() && w.id_label != parts.back())) continue;
    std::vector<std::string> places = {w.window};
    places.insert(places.end(), w.sections.begin(), w.sections.end());
    if (leading_parts_match(parts, places)) found.push_back(&w);
  }
  if (found.size() == 1) return found.front();
  if (found.empty()) {
    std::string shown;
    for (const WidgetInfo& w : frame.widgets)
      if (w.visible && w.kind != WidgetKind::DropTarget) shown += (shown.empty() ? "" : ", ") + w.label;
    error = "no visible widget '" + spec + "' (visible: " + shown + ")";
  } else {
    error = "'" + spec + "' names " + std::to_string(found.size()) + " widgets:";
    for (const WidgetInfo* w : found) error += " [" + widget_path(*w) + "]";
    error += "; name the window or section too (WINDOW > SECTION > LABEL)";
  }
  return nullptr;
}

nlohmann::json widgets_json(const WidgetFrame& frame) {
  using nlohmann::json;
  json list = json::array();
  for (const WidgetInfo& w : frame.widgets) {
    char id[16];
    std::snprintf(id, sizeof id, "0x%08X", w.id);
    list.push_back({{"label", w.label}, {"id_label", w.id_label}, {"id", id}, {"window", w.window},
                    {"sections", w.sections}, {"path", widget_path(w)}, {"kind", widget_kind_name(w.kind)},
                    {"rect", {w.rect.x, w.rect.y, w.rect.w, w.rect.h}},
                    {"frame", {w.frame.x, w.frame.y, w.frame.w, w.frame.h}},
                    {"centre", {w.frame.x + 0.5f * w.frame.w, w.frame.y + 0.5f * w.frame.h}},
                    {"enabled", w.enabled}, {"visible", w.visible}});
    if (w.kind == WidgetKind::Input) list.back()["value"] = w.value;
  }
  json texts = json::array();
  for (const TextInfo& t : frame.texts)
    texts.push_back({{"text", t.text}, {"window", t.window}, {"rect", {t.rect.x, t.rect.y, t.rect.w, t.rect.h}},
                     {"width", t.width}, {"room", t.room}, {"wrapped", t.wrapped}});
  json windows = json::array();
  for (const WindowInfo& w : frame.windows)
    windows.push_back({{"name", w.name}, {"parent", w.parent}, {"kind", w.kind}, {"rect", {w.rect.x, w.rect.y, w.rect.w, w.rect.h}},
                       {"visible", {w.visible.x, w.visible.y, w.visible.w, w.visible.h}},
                       {"scroll", {w.scroll_x, w.scroll_y}}, {"scroll_max", {w.scroll_max_x, w.scroll_max_y}}});
  return {{"note", "rectangles are [x, y, w, h] in window pixels, origin at the window's top left; a text's width is what "
                   "it needs, room what its window or column had to the right of it; windows back to front"},
          {"display", {frame.display_w, frame.display_h}}, {"widgets", list}, {"texts", texts}, {"windows", windows},
          {"clashes", frame.clashes}};
}

// [SECTION] Script

namespace {

InputStep input_step(InputStep::Type type) {
  InputStep step;
  step.type = type;
  return step;
}

}  // namespace

std::string apply_script_command(App& app, const ScriptCommand& command) {
  const std::string& v = command.verb;
  const auto& a = command.args;
  UiState& ui = app.ui;
  int i = 0, j = 0;
  float f = 0.0f;
  auto need_image = [&]() -> std::string {
    return app.doc.ready() ? "" : "no image is loaded (" + (ui.message.text.empty() ? "nothing opened" : ui.message.text) + ")";
  };
  auto check_patch = [&](int row, int col) -> std::string {
    if (auto e = need_image(); !e.empty()) return e;
    if (in_grid(app, row, col)) return "";
    return "patch (" + std::to_string(row) + ", " + std::to_string(col) + ") is outside the " +
           std::to_string(grid_rows(app)) + "x" + std::to_string(grid_cols(app)) + " patch grid";
  };

  if (v == "open") app.requests.open_image = a[0];
  else if (v == "model") app.requests.open_model = a[0];
  else if (v == "train" || v == "model-menu") return apply_train_command(app, command);
  else if (v == "pin" || v == "hover" || v == "paint" || v == "erase") {
    parse_int_arg(a[0], i);
    parse_int_arg(a[1], j);
    if (auto e = check_patch(i, j); !e.empty()) return e;
    if (v == "pin") pin_query(app, i, j);
    else if (v == "hover") set_hover(app, i, j);
    else paint_patch(app, i, j, v == "paint");
  } else if (v == "key") {
    // Press and release in one frame, through the window's key queue (the quickest tap).
    InputStep down;
    down.type = InputStep::Type::KeyDown;
    down.key = a[0];
    InputStep up = down;
    up.type = InputStep::Type::KeyUp;
    up.same_frame = true;
    app.input.push_back(down);
    app.input.push_back(up);
  } else if (v == "click" || v == "drag") {
    std::string error;
    const WidgetInfo* w = find_widget(ui.widgets, a[0], error);
    if (!w) return error;
    if (!w->enabled) return "'" + a[0] + "' is disabled";
    InputStep step;
    step.type = InputStep::Type::MouseMove;
    if (v == "click") {
      float fx = 0.5f, fy = 0.5f;  // where in the widget, as fractions of its size
      if (a.size() == 3) {
        parse_float_arg(a[1], fx);
        parse_float_arg(a[2], fy);
      }
      step.x = w->frame.x + fx * w->frame.w;
      step.y = w->frame.y + fy * w->frame.h;
      app.input.push_back(step);
      app.input.push_back(input_step(InputStep::Type::MouseDown));
      app.input.push_back(input_step(InputStep::Type::MouseUp));
    } else {
      // Press on the middle of the track, move to the fraction T of its width, release.
      parse_float_arg(a[1], f);
      step.x = w->frame.x + 0.5f * w->frame.w;
      step.y = w->frame.y + 0.5f * w->frame.h;
      app.input.push_back(step);
      app.input.push_back(input_step(InputStep::Type::MouseDown));
      step.x = w->frame.x + std::clamp(f, 0.0f, 1.0f) * (w->frame.w - 1.0f);
      app.input.push_back(step);
      app.input.push_back(input_step(InputStep::Type::Wait));
      app.input.push_back(input_step(InputStep::Type::MouseUp));
    }
  } else if (v == "drop") {
    InputStep step;
    step.type = InputStep::Type::Drop;
    step.path = a[0];
    app.input.push_back(step);
  } else if (v == "widgets") {
    try {
      write_file_atomic(a[0], widgets_json(ui.widgets).dump(2) + "\n");
    } catch (const Error& e) {
      return e.what();
    }
  } else if (v == "expect" || v == "expect-contains") {
    const nlohmann::json state = state_json(app);
    const nlohmann::json::json_pointer pointer(a[0][0] == '/' ? a[0] : "/" + a[0]);
    if (!state.contains(pointer)) return "the state has no '" + a[0] + "'";
    const nlohmann::json& got = state.at(pointer);
    if (v == "expect-contains") {
      const std::string text = got.is_string() ? got.get<std::string>() : got.dump();
      if (text.find(a[1]) == std::string::npos) return "'" + a[0] + "' is " + got.dump() + ", without '" + a[1] + "'";
    } else {
      nlohmann::json want = nlohmann::json::parse(a[1], nullptr, false);
      if (want.is_discarded()) want = a[1];  // a bare word is a string
      const bool same = got.is_number() && want.is_number()
                            ? std::fabs(got.get<double>() - want.get<double>()) <= 1e-6 * std::max(1.0, std::fabs(want.get<double>()))
                            : got == want;
      if (!same) return "expected '" + a[0] + "' to be " + want.dump() + ", it is " + got.dump();
    }
  } else if (v == "expect-file") {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(a[0], ec)) return "expected the file " + a[0] + ", it is not there";
  } else if (v == "mode") {
    set_rollout(app, a[0] == "rollout");
    if (a[0] == "rollout") return {};
    MapMode mode = MapMode::Query;
    parse_map_mode(a[0], mode);
    if (mode == MapMode::ClassToken && app.doc.comp && !app.doc.comp->forward.has_class_token)
      return "model '" + app.doc.model->model.config.name + "' has no class token";
    ui.view.mode = mode;
  } else if (v == "layer") {
    parse_int_arg(a[0], i);
    if (auto e = need_image(); !e.empty()) return e;
    if (i >= model_layers(app)) return "the model has " + std::to_string(model_layers(app)) + " layer(s)";
    ui.view.layer = i;
  } else if (v == "token") {
    if (auto e = need_image(); !e.empty()) return e;
    if (a[0] == "patch") {
      set_query_prefix(app, -1);
    } else {
      try {
        set_query_prefix(app, prefix_token_index(app.doc.model->model.config, a[0]));
      } catch (const Error& e) {
        return e.what();
      }
    }
  } else if (v == "head") {
    if (auto e = need_image(); !e.empty()) return e;
    if (a[0] == "all") ui.view.focus_head = -1;
    else if (parse_int_arg(a[0], i) && i < app.doc.model->model.config.num_heads) ui.view.focus_head = i;
    else return "the model has " + std::to_string(app.doc.model->model.config.num_heads) + " head(s)";
  } else if (v == "rollout") {
    RolloutChoice& r = ui.compute.rollout;
    if (a[0] == "on" || a[0] == "off") set_rollout(app, a[0] == "on");
    else if (a[0] == "fusion") r.fusion = a[1] == "max" ? HeadFusion::Max : a[1] == "min" ? HeadFusion::Min : HeadFusion::Mean;
    else if (a[0] == "discard") parse_float_arg(a[1], r.discard);
    else if (a[0] == "from") ui.view.rollout_from_query = a[1] == "query";
    else {
      if (auto e = need_image(); !e.empty()) return e;
      parse_int_arg(a[1], i);
      parse_int_arg(a[2], j);
      if (j >= model_layers(app)) return "the model has " + std::to_string(model_layers(app)) + " layer(s)";
      r.first_layer = i;
      r.last_layer = j;
    }
  } else if (v == "colormap") ui.display.style.colormap = a[0];
  else if (v == "alpha") parse_float_arg(a[0], ui.display.style.alpha);
  else if (v == "normalize") parse_normalize(a[0], ui.display.normalize);
  else if (v == "upsample") parse_upsample(a[0], ui.display.style.upsample);
  else if (v == "threshold") {
    ui.display.threshold_on = a[0] != "off";
    if (ui.display.threshold_on) parse_float_arg(a[0], ui.display.threshold);
  } else if (v == "grid") ui.display.show_grid = a[0] == "on";
  else if (v == "mask") {
    MaskMode mode = MaskMode::Padding;
    parse_mask_mode(a[0], mode);
    set_mask(app, mode);
  } else if (v == "clear-paint") clear_paint(app);
  else if (v == "scale") {
    if (a[0] == "default") ui.compute.scale = ScaleMode::Model;
    else if (a[0] == "none") ui.compute.scale = ScaleMode::Unscaled;
    else {
      ui.compute.scale = ScaleMode::Temperature;
      parse_float_arg(a[1], ui.compute.temperature);
    }
  } else if (v == "size") {
    ui.compute.max_side = a[0] == "default" ? 0 : (parse_int_arg(a[0], i), i);
  } else if (v == "show") {
    const bool on = a[1] == "on";
    if (a[0] == "image") ui.show_image = on;
    else if (a[0] == "heads") ui.show_heads = on;
    else if (a[0] == "controls") ui.show_controls = on;
    else if (a[0] == "inspector") ui.show_inspector = on;
    else if (a[0] == "stats") ui.show_stats = on;
    else if (a[0] == "train") ui.show_train = on;
    else if (a[0] == "layers") ui.show_layers = on;
    else ui.show_example = on;
  } else if (v == "example") {
    if (a[0] == "reset") ui.example = WorkedExample{};
    else if (a[0] == "scaled") ui.example.scaled = a[1] == "on";
    else {
      parse_int_arg(a[1], i);
      parse_int_arg(a[2], j);
      parse_float_arg(a[3], f);
      (a[0] == "q" ? ui.example.q[i][j] : a[0] == "k" ? ui.example.k[i][j] : ui.example.v[i][j]) = f;
    }
  } else if (v == "export") {
    if (auto e = need_image(); !e.empty()) return e;
    ui.export_raw = a.size() == 2;
    app.requests.export_folder = a[0];
  } else if (v == "screenshot") app.requests.screenshot = a[0];
  else if (v == "state") {
    try {
      write_file_atomic(a[0], state_json(app).dump(2) + "\n");
    } catch (const Error& e) {
      return e.what();
    }
  } else if (v == "browse") {
    open_browser(app, a[0] == "image"    ? BrowserPurpose::OpenImage
                      : a[0] == "model"  ? BrowserPurpose::OpenModel
                      : a[0] == "export" ? BrowserPurpose::ExportFolder
                                         : BrowserPurpose::ScreenshotFile);
  } else if (v == "window") {
    parse_int_arg(a[0], app.requests.window_w);
    parse_int_arg(a[1], app.requests.window_h);
  } else if (v == "frames") {
    parse_int_arg(a[0], i);
    app.script.settle_frames = i;
  } else if (v == "quit") app.requests.quit = true;
  return {};
}

bool step_script(App& app) {
  ScriptRunner& s = app.script;
  if (!s.active()) return false;
  if (!app.input.empty()) {
    s.settle_frames = 2;  // the frames after the last input step draw what it did
    return true;
  }
  if (s.settle_frames > 0) {
    --s.settle_frames;
    return true;
  }
  if (!is_idle(app)) return true;
  const ScriptCommand& c = s.commands[s.next++];
  s.settle_frames = 2;  // let the result be drawn (and windows settle) before the next command
  const std::string problem = apply_script_command(app, c);
  if (!problem.empty()) s.error = s.path + ":" + std::to_string(c.line) + ": '" + c.text + "': " + problem;
  return s.error.empty();
}

// [SECTION] State for tests

nlohmann::json state_json(const App& app) {
  using nlohmann::json;
  const UiState& ui = app.ui;
  json j;
  j["image"] = app.doc.image ? json(app.doc.image->path) : json(nullptr);
  j["model"] = app.doc.model ? json(app.doc.model->path) : json(nullptr);
  j["message"] = {{"text", ui.message.text}, {"error", ui.message.error}};
  j["ready"] = app.doc.ready();
  if (app.doc.ready()) {
    const Computation& c = *app.doc.comp;
    j["grid"] = {c.forward.grid_h, c.forward.grid_w};
    j["tokens"] = c.forward.tokens;
    j["heads"] = app.doc.model->model.config.num_heads;
    j["working_side"] = c.key.max_side;
    j["score_scale"] = c.forward.score_scale;
    j["forward_ms"] = c.forward_ms;
    j["mask"] = mask_mode_name(c.key.mask);
    int painted = 0;
    for (uint8_t p : c.key.painted) painted += p;
    j["painted_patches"] = painted;
  }
  j["mode"] = ui.compute.rollout.on ? "rollout" : map_mode_name(ui.view.mode);
  j["layer"] = current_layer(app);
  j["query"] = {ui.view.query_row, ui.view.query_col};
  j["head"] = ui.view.focus_head;
  j["query_token"] = nullptr;
  if (app.doc.ready()) {
    const int token = query_token(app);
    j["query_token"] = {{"index", token}, {"name", token_name(app.doc.model->model.config, app.doc.comp->forward.grid_w, token)}};
  }
  const RolloutChoice& rc = ui.compute.rollout;
  j["rollout"] = {{"on", rc.on}, {"fusion", head_fusion_name(rc.fusion)}, {"discard", rc.discard},
                  {"layers", {rc.first_layer, rc.last_layer}}, {"from", ui.view.rollout_from_query ? "query" : "cls"}};
  if (app.derived.rollout_query >= 0 && app.doc.comp && app.doc.comp->key.rollout.on) {
    const MatRM& m = app.derived.rollout_map;
    j["rollout"]["token"] = app.derived.rollout_query;
    j["rollout"]["map"] = {{"max", m.maxCoeff()}, {"sum", m.sum()}, {"entropy", map_entropy(m)}};
    j["rollout"]["layers_used"] = {app.doc.comp->key.rollout.first_layer, app.doc.comp->key.rollout.last_layer};
  }
  j["layers_grid"] = {{"shown", ui.show_layers}, {"layers", app.derived.layers.layers}, {"heads", app.derived.layers.heads},
                      {"ms", app.derived.layers_ms}, {"error", app.derived.layers_error}};
  j["key"] = {ui.view.key_row, ui.view.key_col};
  j["colormap"] = ui.display.style.colormap;
  j["alpha"] = ui.display.style.alpha;
  j["normalize"] = normalize_name(ui.display.normalize);
  j["upsample"] = upsample_name(ui.display.style.upsample);
  j["threshold"] = ui.display.threshold_on ? json(ui.display.threshold) : json(nullptr);
  j["cli_equivalent"] = cli_equivalent(app);
  j["cli_command"] = cli_equivalent(app) ? json(cli_command(app, ui.export_folder)) : json(nullptr);
  j["status"] = status_text(app);
  j["show"] = {{"image", ui.show_image}, {"heads", ui.show_heads}, {"controls", ui.show_controls},
               {"inspector", ui.show_inspector}, {"stats", ui.show_stats}, {"example", ui.show_example},
               {"layers", ui.show_layers}};
  j["grid_lines"] = ui.display.show_grid;
  j["max_side"] = ui.compute.max_side;
  j["mask_choice"] = mask_mode_name(ui.compute.mask);
  j["brush"] = ui.compute.brush == Brush::Paint ? "paint" : ui.compute.brush == Brush::Erase ? "erase" : "off";
  j["painted_choice"] = std::count(ui.compute.painted.begin(), ui.compute.painted.end(), uint8_t{1});
  j["scale"] = scale_mode_name(ui.compute.scale);
  j["temperature"] = ui.compute.temperature;
  j["export_folder"] = ui.export_folder;
  j["export_raw"] = ui.export_raw;
  j["screenshot_path"] = ui.screenshot_path;
  const char* purposes[] = {"open image", "open model", "export folder", "screenshot file"};
  j["browser"] = {{"open", ui.browser.open_requested || ui.browser.shown},
                  {"purpose", purposes[static_cast<int>(ui.browser.purpose)]}, {"folder", ui.browser.folder},
                  {"path", ui.browser.typed}, {"show_all", ui.browser.show_all}};
  j["example"] = {{"q", ui.example.q}, {"k", ui.example.k}, {"v", ui.example.v}, {"scaled", ui.example.scaled}};
  j["widget_clashes"] = ui.widgets.clashes;
  j["recent_images"] = ui.recent_images;
  j["recent_models"] = ui.recent_models;
  json panels = json::object();
  for (const auto& [name, r] : ui.layout) panels[name] = {r.x, r.y, r.w, r.h};
  j["panels"] = panels;
  // The maps on screen (heads, then the mean): enough to tell whether they followed the query.
  json maps = json::array();
  const HeadMaps& shown = app.derived.view.maps;
  for (size_t i = 0; i <= shown.heads.size() && !shown.heads.empty(); ++i) {
    const MatRM& m = i < shown.heads.size() ? shown.heads[i] : shown.mean;
    double sum = 0.0, r_sum = 0.0, c_sum = 0.0;
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      for (Eigen::Index c = 0; c < m.cols(); ++c) {
        sum += m(r, c);
        r_sum += m(r, c) * static_cast<double>(r);
        c_sum += m(r, c) * static_cast<double>(c);
      }
    maps.push_back({{"entropy", map_entropy(m)}, {"max", m.maxCoeff()},
                    {"centroid", {sum > 0 ? r_sum / sum : 0.0, sum > 0 ? c_sum / sum : 0.0}}});
  }
  j["maps"] = maps;
  j["train"] = training_state_json(app);
  if (!app.derived.kept.empty()) {
    json kept = json::array();
    for (const ThresholdResult& t : app.derived.kept) kept.push_back({t.kept_patches, t.total_patches, t.kept_mass});
    j["kept"] = kept;
  }
  return j;
}

}  // namespace vitlens::viewer
