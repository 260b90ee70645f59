// What a test (or a curious user) reads of the viewer: the status bar's text and the `state FILE`
// JSON (see controller.hpp). Each part of the JSON is built by its own function.
#include <algorithm>
#include <cstdio>

#include "control/controller.hpp"
#include "control/controller_detail.hpp"
#include "core/cpu/bf16.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

std::string status_text(const App& app) {
  if (!app.doc.ready()) return {};
  const Computation& c = *app.doc.comp;
  char text[160];
  std::snprintf(text, sizeof text, "%dx%d px, grid %dx%d, %d tokens", c.image.padded_w, c.image.padded_h, c.forward.grid_h,
                c.forward.grid_w, c.forward.tokens);
  return text;
}

namespace {

using nlohmann::json;

// The files, the message and the computation on screen.
void add_document(const App& app, json& j) {
  const UiState& ui = app.ui;
  j["image"] = app.doc.image ? json(app.doc.image->path) : json(nullptr);
  j["model"] = app.doc.model ? json(app.doc.model->path) : json(nullptr);
  j["message"] = {{"text", ui.message.text}, {"error", ui.message.error}};
  j["ready"] = app.doc.ready();
  if (!app.doc.ready()) return;
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
  // The classifier's top classes, as the export records them (add_predictions).
  json record;
  add_predictions(record, app.doc.model->model, c.forward, c.predictions);
  j["classifier"] = record["classifier"];
  j["predictions"] = record["predictions"];
}

// The map mode, layer, query and head.
void add_view(const App& app, json& j) {
  const UiState& ui = app.ui;
  j["mode"] = ui.compute.rollout.on ? "rollout" : map_mode_name(ui.view.mode);
  j["layer"] = current_layer(app);
  j["query"] = {ui.view.query_row, ui.view.query_col};
  j["head"] = ui.view.focus_head;
  j["query_token"] = nullptr;
  if (app.doc.ready()) {
    const int token = detail::query_token(app);
    j["query_token"] = {{"index", token}, {"name", token_name(app.doc.model->model.config, app.doc.comp->forward.grid_w, token)}};
  }
  j["key"] = {ui.view.key_row, ui.view.key_col};
}

// Rollout mode's choice and, when it is on screen, its map.
json rollout_json(const App& app) {
  const RolloutChoice& rc = app.ui.compute.rollout;
  json r = {{"on", rc.on}, {"fusion", head_fusion_name(rc.fusion)}, {"discard", rc.discard},
            {"layers", {rc.first_layer, rc.last_layer}}, {"from", app.ui.view.rollout_from_query ? "query" : "cls"}};
  if (app.derived.rollout_query >= 0 && app.doc.comp && app.doc.comp->key.rollout.on) {
    const MatRM& m = app.derived.rollout_map;
    r["token"] = app.derived.rollout_query;
    r["map"] = {{"max", m.maxCoeff()}, {"sum", m.sum()}, {"entropy", map_entropy(m)}};
    r["layers_used"] = {app.doc.comp->key.rollout.first_layer, app.doc.comp->key.rollout.last_layer};
  }
  return r;
}

// The display and compute choices, and what `vitlens export` would say.
void add_choices(const App& app, json& j) {
  const UiState& ui = app.ui;
  j["colormap"] = ui.display.style.colormap;
  j["alpha"] = ui.display.style.alpha;
  j["normalize"] = normalize_name(ui.display.normalize);
  j["upsample"] = upsample_name(ui.display.style.upsample);
  j["threshold"] = ui.display.threshold_on ? json(ui.display.threshold) : json(nullptr);
  j["cli_equivalent"] = cli_equivalent(app);
  j["cli_command"] = cli_equivalent(app) ? json(cli_command(app, ui.export_folder)) : json(nullptr);
  j["status"] = status_text(app);
  j["grid_lines"] = ui.display.show_grid;
  j["max_side"] = ui.compute.max_side;
  j["mask_choice"] = mask_mode_name(ui.compute.mask);
  j["brush"] = brush_name(ui.compute.brush);
  j["painted_choice"] = std::count(ui.compute.painted.begin(), ui.compute.painted.end(), uint8_t{1});
  j["scale"] = scale_mode_name(ui.compute.scale);
  j["temperature"] = ui.compute.temperature;
}

// Preprocessing and precision: the choices, what the pass on screen ran, and the loaded model's
// transform (or why it has none).
void add_pass_choices(const App& app, json& j) {
  const ComputeChoice& c = app.ui.compute;
  j["preprocess_choice"] = preprocess_name(c.preprocess);
  j["precision_choice"] = precision_name(c.precision);
  j["preprocess"] = app.doc.ready() ? json(preprocess_name(app.doc.comp->key.preprocess)) : json(nullptr);
  j["precision"] = app.doc.ready() ? json(precision_name(app.doc.comp->forward.precision)) : json(nullptr);
  j["precision_lines"] = precision_lines(app);
  j["bf16_kernel"] = bf16_kernel_name(bf16_kernel());
  json t = nullptr;
  if (app.doc.model) {
    const LoadedModel& m = *app.doc.model;
    t = {{"available", m.transform.present()}, {"why_not", preprocess_unavailable(app)}};
    if (m.transform.present()) t.update({{"library", m.transform.library}, {"from", m.transform.origin}, {"steps", m.transform.describe()}});
  }
  j["transform"] = t;
}

// The windows, the file browser, the output paths and the worked example.
void add_windows(const App& app, json& j) {
  const UiState& ui = app.ui;
  j["show"] = {{"image", ui.show_image}, {"heads", ui.show_heads}, {"controls", ui.show_controls},
               {"inspector", ui.show_inspector}, {"stats", ui.show_stats}, {"example", ui.show_example},
               {"layers", ui.show_layers}};
  j["export_folder"] = ui.export_folder;
  j["export_raw"] = ui.export_raw;
  j["screenshot_path"] = ui.screenshot_path;
  j["browser"] = {{"open", ui.browser.open_requested || ui.browser.shown},
                  {"purpose", browser_purpose_name(ui.browser.purpose)}, {"folder", ui.browser.folder},
                  {"path", ui.browser.typed}, {"show_all", ui.browser.show_all}};
  j["example"] = {{"q", ui.example.q}, {"k", ui.example.k}, {"v", ui.example.v}, {"scaled", ui.example.scaled}};
  j["widget_clashes"] = ui.widgets.clashes;
  j["recent_images"] = ui.recent_images;
  j["recent_models"] = ui.recent_models;
  json panels = json::object();
  for (const auto& [name, r] : ui.layout) panels[name] = {r.x, r.y, r.w, r.h};
  j["panels"] = panels;
}

// The maps on screen (heads, then the mean): enough to tell whether they followed the query.
json maps_json(const HeadMaps& shown) {
  json maps = json::array();
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
  return maps;
}

}  // namespace

nlohmann::json state_json(const App& app) {
  const Derived& d = app.derived;
  json j;
  add_document(app, j);
  add_view(app, j);
  j["rollout"] = rollout_json(app);
  j["layers_grid"] = {{"shown", app.ui.show_layers}, {"layers", d.layers.layers}, {"heads", d.layers.heads},
                      {"pool_row", d.layers.pool_row},
                      {"ms", d.layers_ms}, {"error", d.layers_error}};
  add_choices(app, j);
  add_pass_choices(app, j);
  add_windows(app, j);
  j["maps"] = maps_json(d.view.maps);
  j["train"] = training_state_json(app);
  if (!d.kept.empty()) {
    json kept = json::array();
    for (const ThresholdResult& t : d.kept) kept.push_back({t.kept_patches, t.total_patches, t.kept_mass});
    j["kept"] = kept;
  }
  return j;
}

}  // namespace vitlens::viewer
