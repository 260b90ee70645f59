// Derived state (see controller.hpp, update_derived): one function per cache, each rebuilt only
// when its typed key (app_state.hpp) differs from the one it was built with.
#include <cmath>

#include "control/controller.hpp"
#include "control/controller_detail.hpp"
#include "core/base/error.hpp"
#include "core/model/attention.hpp"
#include "core/render/export_layers.hpp"
#include "core/render/heatmap.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

using namespace detail;

namespace {

// The worked example does not need an image.
void update_example(Derived& d, const WorkedExample& in) {
  if (d.example_valid && d.example_inputs == in) return;
  MatRM q(2, 2), k(3, 2), v(3, 2);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 2; ++c) {
      if (r < 2) q(r, c) = in.q[r][c];
      k(r, c) = in.k[r][c];
      v(r, c) = in.v[r][c];
    }
  // The seed's example: scores = Q @ K.T / math.sqrt(2); weights = softmax; context = weights @ V
  const float scale = in.scaled ? 1.0f / std::sqrt(2.0f) : 1.0f;
  const AttentionResult res = scaled_dot_product_attention(q, k, v, {}, scale);
  d.example.scores = (q * k.transpose()) * scale;
  d.example.weights = res.weights;
  d.example.context = res.context;
  d.example_inputs = in;
  d.example_valid = true;
}

// The colour bars' ramp of the colour map.
void update_colormap_ramp(Derived& d, const std::string& colormap) {
  if (d.ramp_colormap == colormap) return;
  cv::Mat ramp(1, 256, CV_32F);
  for (int x = 0; x < 256; ++x) ramp.at<float>(0, x) = static_cast<float>(x) / 255.0f;
  d.colormap_ramp = apply_colormap(ramp, colormap);
  d.ramp_colormap = colormap;
  ++d.ramp_version;
}

// A new computation: the processed image, and a fresh analysis for its maps.
void update_base(App& app) {
  Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  if (d.comp_serial == c.serial) return;
  d.comp = &c;
  d.comp_serial = c.serial;
  d.view = ImageAnalysis{};
  d.view.image_path = app.doc.image->path;
  d.view.image = c.image;
  // The caption and the export's record name the model's transform when it made the image.
  if (c.key.preprocess == Preprocess::Model) d.view.transform = app.doc.model->transform;
  d.view.forward = c.forward;  // render_export_images marks the query on the grid it describes
  d.view.forward_ms = c.forward_ms;
  d.view.predictions = c.predictions;  // the export records what the window shows
  c.image.rgb.convertTo(d.base_rgb8, CV_8UC3, 255.0);
  ++d.base_version;
  d.map_key.reset();
}

// Maps: one attention row per head for a query (O(N d) each), or a stored row. True when rebuilt.
bool update_maps(App& app, const MapRequest& request) {
  Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  const MapKey key{c.serial, request.layer, request.mode, request.query_token};
  if (d.map_key == key) return false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    d.raw_maps = attention_maps(app.doc.model->model, c.forward, request);
    d.view.request = request;
    d.map_error.clear();
  } catch (const Error& e) {
    d.map_error = e.what();
  }
  d.maps_ms = ms_since(t0);
  d.map_key = key;
  return true;
}

float threshold_or_off(const DisplayState& disp) { return disp.threshold_on ? disp.threshold : 0.0f; }

// Pictures: exactly what write_export draws, from the maps as shown.
void update_pictures(App& app, bool maps_changed) {
  Derived& d = app.derived;
  const DisplayState& disp = app.ui.display;
  const PictureKey key{*d.map_key, disp.style.colormap, disp.style.alpha, disp.style.upsample, disp.normalize,
                       threshold_or_off(disp)};
  if ((!maps_changed && d.picture_key == key) || d.raw_maps.heads.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  HeadMaps shown = d.raw_maps;
  // The same core call as `vitlens export --threshold`; the export records it from d.view.
  d.picture_error.clear();
  try {
    d.kept = disp.threshold_on ? apply_threshold(shown, disp.threshold) : std::vector<ThresholdResult>{};
  } catch (const Error& e) {  // a mass outside (0, 1]: said above the heads, the maps drawn whole
    d.picture_error = e.what();
    d.kept.clear();
    shown = d.raw_maps;
  }
  d.view.kept = d.kept;
  d.view.threshold = threshold_or_off(disp);
  // The attention's own entropy: the threshold only changes what is drawn.
  d.entropy.clear();
  for (const MatRM& m : d.raw_maps.heads) d.entropy.push_back(map_entropy(m));
  d.entropy.push_back(map_entropy(d.raw_maps.mean));
  d.scales = map_scales(shown, disp.normalize);
  d.view.maps = std::move(shown);
  try {
    d.pictures = render_export_images(app.doc.model->model, d.view, disp.style, disp.normalize);
  } catch (const Error& e) {
    d.picture_error = e.what();  // shown above the heads; the last good pictures stay
  }
  d.render_ms = ms_since(t0);
  d.picture_key = key;
  ++d.pictures_version;
}

// Rollout: the row of the rollout matrix the worker made, drawn as export_rollout draws it.
void update_rollout(App& app) {
  Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  const DisplayState& disp = app.ui.display;
  d.rollout_query = -1;
  if (!c.key.rollout.on || c.rollout.rows() != c.forward.tokens) return;
  const int token = app.ui.view.rollout_from_query || !c.forward.has_class_token ? query_token(app) : 0;
  d.rollout_query = token;
  const RolloutKey key{c.serial, token, disp.style.colormap, disp.style.alpha, disp.style.upsample, disp.normalize};
  if (d.rollout_key == key) return;
  ExportSettings look;
  look.style = disp.style;
  look.normalize = disp.normalize;
  d.rollout_map = rollout_map(c.rollout, c.forward, token);
  d.rollout_picture = rollout_picture(app.doc.model->model, c.image, d.rollout_map, look);
  d.rollout_key = key;
  ++d.rollout_version;
}

// The layers x heads grid: every head of every layer for the same request, only while shown.
void update_layers(App& app, const MapRequest& request) {
  Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  const DisplayState& disp = app.ui.display;
  if (!app.ui.show_layers) return;
  const LayersKey key{c.serial, request.mode, request.query_token, disp.style.colormap, disp.normalize, threshold_or_off(disp)};
  if (d.layers_key == key) return;
  const auto t0 = std::chrono::steady_clock::now();
  LayerGridStyle look;
  look.colormap = disp.style.colormap;
  look.normalize = disp.normalize;
  look.threshold = threshold_or_off(disp);
  look.cell_gap = kLayerGridGap;
  try {
    d.layers = layer_grid(app.doc.model->model, c.forward, request.mode, request.query_token, look);
    d.layers_error.clear();
  } catch (const Error& e) {
    d.layers = LayerGrid{};
    d.layers_error = e.what();
  }
  d.layers_ms = ms_since(t0);
  d.layers_key = key;
  ++d.layers_version;
}

// Inspector: the pinned query (or the class token in cls mode) against the inspected key.
void update_inspector(App& app, int layer) {
  Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  const ViewChoice& v = app.ui.view;
  const int q_token = v.mode == MapMode::ClassToken && c.forward.has_class_token ? 0 : query_token(app);
  const int k_token =
      in_grid(app, v.key_row, v.key_col) ? c.forward.prefix + v.key_row * c.forward.grid_w + v.key_col : q_token;
  const InspectorKey key{c.serial, layer, q_token, k_token};
  if (d.inspector_key == key) return;
  try {
    d.inspector = inspect_pair(app.doc.model->model, c.forward, c.image.grid, layer, q_token, k_token);
    d.inspector_valid = true;
  } catch (const Error&) {
    d.inspector_valid = false;
  }
  d.inspector_key = key;
}

}  // namespace

void update_derived(App& app) {
  update_example(app.derived, app.ui.example);
  update_colormap_ramp(app.derived, app.ui.display.style.colormap);
  if (!app.doc.ready()) return;
  update_base(app);
  const MapRequest request = shown_request(app);
  const bool maps_changed = update_maps(app, request);
  update_pictures(app, maps_changed);
  update_rollout(app);
  update_layers(app, request);
  update_inspector(app, current_layer(app));
}

}  // namespace vitlens::viewer
