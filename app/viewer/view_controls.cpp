// The controls view: what to compute and how to draw it. Index:
//   [SECTION] Files and working size
//   [SECTION] Map
//   [SECTION] Display
//   [SECTION] Mask
//   [SECTION] Softmax scale
//   [SECTION] Export
//   [SECTION] View
#include <algorithm>
#include <cmath>

#include <imgui.h>
#include <imgui_stdlib.h>

#include "file_list.hpp"
#include "views.hpp"
#include "widgets.hpp"
#include "vitlens/image.hpp"

namespace vitlens::viewer {

namespace {

void HelpMarker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
    ImGui::TextUnformatted(text);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

// [SECTION] Files and working size

void DrawFiles(App& app) {
  const Document& doc = app.doc;
  ImGui::Text("Model: %s", doc.model ? doc.model->model.config.name.c_str() : "(none)");
  if (doc.model && ImGui::IsItemHovered())
    ImGui::SetTooltip("%s\n%s", doc.model->path.c_str(), doc.model->model.config.description.c_str());
  if (doc.model) {
    const VitConfig& c = doc.model->model.config;
    ImGui::TextDisabled("%d heads of %d dims, depth %d, patch %d, %s%s, %d register(s)", c.num_heads, c.head_dim(), c.depth,
                        c.patch_size, c.class_token ? "class token" : "no class token",
                        c.dist_token ? " + distillation token" : "", c.register_tokens);
  }
  if (gui::Button("Open image...")) open_browser(app, BrowserPurpose::OpenImage);
  ImGui::SameLine();
  if (gui::Button("Open model...")) open_browser(app, BrowserPurpose::OpenModel);
}

void DrawWorkingSize(App& app) {
  if (!app.doc.model || !app.doc.image) return;
  const VitConfig& config = app.doc.model->model.config;
  int& edit = app.ui.working_side_edit;
  const int committed = app.ui.compute.max_side > 0 ? app.ui.compute.max_side
                                                    : std::clamp(default_max_side(config), kMinWorkingSide, kMaxWorkingSide);
  if (!ImGui::IsAnyItemActive() || edit == 0) edit = committed;
  gui::SliderInt("working size", &edit, kMinWorkingSide, kMaxWorkingSide, "%d px");
  if (ImGui::IsItemDeactivatedAfterEdit()) app.ui.compute.max_side = edit;  // recompute on release only
  HelpMarker("The image's long side is scaled down to this (never up; aspect kept) and padded to whole patches. "
             "More pixels give more tokens: the forward pass grows as tokens squared. An image of exactly the "
             "model's img_size is never resampled, as `vitlens export` does.");
  const LoadedImage& src = app.doc.image->pixels;
  if (src.source_w == config.img_w && src.source_h == config.img_h)
    ImGui::TextDisabled("this image is the model's own size: it is never resampled");
  const GridPrediction g = predict_grid(src.source_w, src.source_h, config, edit);
  if (app.ui.compute.max_side > 0) {  // first, so a narrow window cuts the text, not the button
    if (gui::SmallButton("model size")) app.ui.compute.max_side = 0;
    ImGui::SameLine();
  }
  ImGui::TextDisabled("%dx%d -> %dx%d: grid %dx%d, %d tokens", src.source_w, src.source_h, g.content_w, g.content_h, g.grid_h,
                      g.grid_w, g.tokens);
}

// [SECTION] Map

// The query: the pinned patch or one of the model's prefix tokens (class, distillation, registers).
void DrawQueryToken(App& app) {
  if (!app.doc.ready() || app.doc.comp->forward.prefix == 0) return;
  const VitConfig& config = app.doc.model->model.config;
  const int prefix = app.doc.comp->forward.prefix, grid_w = app.doc.comp->forward.grid_w;
  ViewChoice& v = app.ui.view;
  const std::string preview = v.query_prefix >= 0 && v.query_prefix < prefix ? token_name(config, grid_w, v.query_prefix)
                                                                              : std::string("pinned patch");
  if (gui::BeginCombo("query token", preview.c_str())) {
    if (gui::Selectable("pinned patch", v.query_prefix < 0)) set_query_prefix(app, -1);
    for (int t = 0; t < prefix; ++t)
      if (gui::Selectable(token_name(config, grid_w, t).c_str(), v.query_prefix == t)) set_query_prefix(app, t);
    gui::EndCombo();
  }
  HelpMarker("The query whose attention row the maps show: the patch you pinned on the image, or a prefix token "
             "(class, distillation, register). Its row's weights on the patches; `vitlens export --token` writes the same.");
}

// Rollout mode's settings (rollout.hpp): what `vitlens export --rollout` takes.
void DrawRollout(App& app) {
  RolloutChoice& r = app.ui.compute.rollout;
  ViewChoice& v = app.ui.view;
  // The heads of each layer fused by their mean, maximum or minimum weight.
  for (HeadFusion f : {HeadFusion::Mean, HeadFusion::Max, HeadFusion::Min}) {
    if (f != HeadFusion::Mean) ImGui::SameLine();
    const std::string label = std::string("fuse ") + head_fusion_name(f);
    if (gui::RadioButton(label.c_str(), r.fusion == f)) r.fusion = f;
  }
  gui::SliderFloat("discard", &r.discard, 0.0f, 0.99f, "%.2f of the lowest");
  HelpMarker("Attention rollout (Abnar and Zuidema 2020, as vit-explain): each layer's heads fused, this share of the "
             "lowest weights set to zero (never the class token's own), the identity added, rows renormalised, the "
             "layers multiplied. Needs every layer's (N, N) weights: at most 4096 tokens.");
  const int layers = model_layers(app);
  if (layers > 1) {
    int first = std::min(r.first_layer, layers - 1), last = r.last_layer < 0 ? layers - 1 : std::min(r.last_layer, layers - 1);
    if (gui::SliderInt("first layer", &first, 0, layers - 1)) {
      r.first_layer = first;
      if (r.last_layer >= 0 && r.last_layer < first) r.last_layer = first;
    }
    if (gui::SliderInt("last layer", &last, 0, layers - 1)) {
      r.last_layer = last;
      if (r.first_layer > last) r.first_layer = last;
    }
  }
  const bool has_cls = app.doc.model && app.doc.model->model.config.class_token;
  ImGui::BeginDisabled(!has_cls);
  if (gui::RadioButton("from the class token", !v.rollout_from_query && has_cls)) v.rollout_from_query = false;
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (gui::RadioButton("from the query", v.rollout_from_query || !has_cls)) v.rollout_from_query = true;
}

void DrawMapChoice(App& app) {
  ViewChoice& v = app.ui.view;
  const bool has_cls = app.doc.model && app.doc.model->model.config.class_token;
  const bool rollout = app.ui.compute.rollout.on;
  if (gui::RadioButton("query patch", !rollout && v.mode == MapMode::Query)) {
    v.mode = MapMode::Query;
    set_rollout(app, false);
  }
  ImGui::SameLine();
  ImGui::BeginDisabled(!has_cls);
  if (gui::RadioButton("class token", !rollout && v.mode == MapMode::ClassToken)) {
    v.mode = MapMode::ClassToken;
    set_rollout(app, false);
  }
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (gui::RadioButton("received", !rollout && v.mode == MapMode::Received)) {
    v.mode = MapMode::Received;
    set_rollout(app, false);
  }
  // On its own line: four radios do not fit the Controls window's default width.
  if (gui::RadioButton("rollout", rollout)) set_rollout(app, true);
  HelpMarker("query patch: the attention row of the query (click a patch; arrow keys move it; or pick a prefix token "
             "below).\nclass token: the class token's row.\nreceived: for each patch, the mean weight it gets over all "
             "queries.\nrollout: attention rollout over the layers, from the class token or the query.");
  DrawQueryToken(app);
  if (rollout) {
    DrawRollout(app);
    return;
  }
  const int layers = model_layers(app);
  if (layers > 1) {
    int layer = current_layer(app);
    if (gui::SliderInt("layer", &layer, 0, layers - 1)) v.layer = layer;
  } else if (layers == 1) {
    ImGui::TextDisabled("layer 0 (the model has one block)");
  }
  if (gui::Button("Layers x heads grid")) app.ui.show_layers = !app.ui.show_layers;
  HelpMarker("Every head of every layer as a small map for this query or mode; click one to open it here.");
}

// [SECTION] Display

void DrawDisplay(App& app) {
  DisplayState& d = app.ui.display;
  if (gui::BeginCombo("colour map", d.style.colormap.c_str())) {
    for (const std::string& name : colormap_names())
      if (gui::Selectable(name.c_str(), name == d.style.colormap)) d.style.colormap = name;
    gui::EndCombo();
  }
  gui::SliderFloat("opacity", &d.style.alpha, 0.0f, 1.0f, "%.2f");
  ImGui::TextUnformatted("scale to");
  ImGui::SameLine();
  if (gui::RadioButton("robust", d.normalize == Normalize::Robust)) d.normalize = Normalize::Robust;
  ImGui::SameLine();
  if (gui::RadioButton("each head", d.normalize == Normalize::PerHead)) d.normalize = Normalize::PerHead;
  ImGui::SameLine();
  if (gui::RadioButton("shared", d.normalize == Normalize::Shared)) d.normalize = Normalize::Shared;
  ImGui::SameLine();
  if (gui::RadioButton("log", d.normalize == Normalize::Log)) d.normalize = Normalize::Log;
  HelpMarker("robust: every map to its 99th percentile, so one to three hot patches saturate instead of flattening "
             "the rest. each head: every map to its own maximum. shared: all maps to the largest maximum, so heads compare. "
             "log: each map to its maximum over three decades, so the faint tail shows.");
  ImGui::TextUnformatted("upsample");
  ImGui::SameLine();
  if (gui::RadioButton("nearest", d.style.upsample == Upsample::Nearest)) d.style.upsample = Upsample::Nearest;
  ImGui::SameLine();
  if (gui::RadioButton("bilinear", d.style.upsample == Upsample::Bilinear)) d.style.upsample = Upsample::Bilinear;
  gui::Checkbox("threshold", &d.threshold_on);
  HelpMarker("As DINO's visualize_attention: keep only the fewest patches that hold this share of each map's "
             "attention mass; the rest are drawn as zero.");
  if (d.threshold_on) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(-1.0f);
    gui::SliderFloat("##mass", &d.threshold, 0.05f, 1.0f, "top %.2f of the mass");
    const auto& kept = app.derived.kept;
    if (!kept.empty())
      ImGui::TextDisabled("mean map: %d of %d patches kept (%.1f%%)", kept.back().kept_patches, kept.back().total_patches,
                          100.0 * kept.back().kept_patches / std::max(1, kept.back().total_patches));
  }
  gui::Checkbox("patch grid", &d.show_grid);
}

// [SECTION] Mask

void DrawMask(App& app) {
  ComputeChoice& c = app.ui.compute;
  for (MaskMode m : {MaskMode::None, MaskMode::Padding, MaskMode::Causal, MaskMode::Painted}) {
    if (m != MaskMode::None) ImGui::SameLine();
    if (gui::RadioButton(mask_mode_name(m), c.mask == m)) set_mask(app, m);
  }
  HelpMarker("Keys a query may not attend to (weight exactly 0, the rest renormalised).\n"
             "none: every key, even the padded border. padding: not the padded border (as vitlens export).\n"
             "causal: only keys at or before the query in raster order (and not the padding).\n"
             "painted: not the patches you paint on the image (left drag paints, right drag erases).");
  if (c.mask == MaskMode::Painted) {
    if (gui::RadioButton("paint", c.brush == Brush::Paint)) c.brush = Brush::Paint;
    ImGui::SameLine();
    if (gui::RadioButton("erase", c.brush == Brush::Erase)) c.brush = Brush::Erase;
    ImGui::SameLine();
    if (gui::RadioButton("off (click pins)", c.brush == Brush::Off)) c.brush = Brush::Off;
    int painted = 0;
    for (uint8_t v : c.painted) painted += v;
    ImGui::Text("%d patches forbidden as keys", painted);
    ImGui::SameLine();
    if (gui::SmallButton("clear")) clear_paint(app);
  }
}

// [SECTION] Softmax scale

void DrawScale(App& app) {
  ComputeChoice& c = app.ui.compute;
  const int d = app.doc.model ? app.doc.model->model.config.head_dim() : 0;
  if (gui::RadioButton("1/sqrt(d)", c.scale == ScaleMode::Model)) c.scale = ScaleMode::Model;
  ImGui::SameLine();
  if (gui::RadioButton("none", c.scale == ScaleMode::Unscaled)) c.scale = ScaleMode::Unscaled;
  ImGui::SameLine();
  if (gui::RadioButton("temperature", c.scale == ScaleMode::Temperature)) c.scale = ScaleMode::Temperature;
  HelpMarker("softmax(q.k * scale). The model's scale 1/sqrt(d) keeps the scores' spread from growing with the "
             "head dimension d; without it the softmax saturates and each head attends to one or two keys. "
             "A temperature T divides the scaled scores: T > 1 flattens, T < 1 sharpens.");
  if (c.scale == ScaleMode::Temperature)
    gui::SliderFloat("T", &c.temperature, 0.1f, 10.0f, "%.2f", ImGuiSliderFlags_Logarithmic);
  if (app.doc.comp)
    ImGui::TextDisabled("scores x %.4f now (1/sqrt(%d) = %.4f)", static_cast<double>(app.doc.comp->forward.score_scale), d,
                        d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 0.0);
}

// [SECTION] Export

void DrawExport(App& app) {
  UiState& ui = app.ui;
  gui::InputText("folder", &ui.export_folder);
  ImGui::SameLine();
  if (gui::SmallButton("...##export")) open_browser(app, BrowserPurpose::ExportFolder);
  gui::Checkbox("raw weights (.npy)", &ui.export_raw);
  HelpMarker("Also write <stem>_attn.npy: float32 (layers, heads, tokens, tokens); at most 4096 tokens.");
  ImGui::BeginDisabled(!app.doc.ready());
  if (gui::Button("Export")) app.requests.export_folder = ui.export_folder;
  ImGui::EndDisabled();
  HelpMarker("Writes the heads, the mean, the montage and a JSON file into the folder above (created when it is "
             "the default, $VITLENS_EXPORT_DIR or ~/vitlens-exports). The status bar says where they went.");
  if (app.doc.ready()) {
    ImGui::PushTextWrapPos(0.0f);
    if (cli_equivalent(app)) {
      ImGui::TextDisabled("Same files as: %s", cli_command(app, ui.export_folder).c_str());
    } else {
      ImGui::TextDisabled("Viewer-only settings are on (mask or scale): the export shows them and "
                          "adds <stem>_view.json describing them.");
    }
    ImGui::PopTextWrapPos();
  }
  gui::InputText("screenshot", &ui.screenshot_path);
  ImGui::SameLine();
  if (gui::SmallButton("...##shot")) open_browser(app, BrowserPurpose::ScreenshotFile);
  if (gui::Button("Save screenshot")) app.requests.screenshot = ui.screenshot_path;
}

}  // namespace

// [SECTION] View

void DrawControlsView(App& app) {
  if (!app.ui.show_controls) return;
  PlaceWindow(0.0f, 0.0f, 0.23f, 1.0f);
  if (!ImGui::Begin("Controls", &app.ui.show_controls)) {
    ImGui::End();
    return;
  }
  ImGui::PushItemWidth(ImGui::GetWindowWidth() * 0.55f);
  DrawFiles(app);
  DrawWorkingSize(app);
  // Each header's widgets live in the header's ID scope (gui::Section): the mask's and the scale's
  // "none" are two widgets, and no widget shares its ID with the header above it.
  struct Part {
    const char* header;
    void (*draw)(App&);
  };
  for (const Part& part : {Part{"Map", DrawMapChoice}, Part{"Display", DrawDisplay}, Part{"Mask", DrawMask},
                           Part{"Softmax scale", DrawScale}, Part{"Export and screenshot", DrawExport}}) {
    if (!gui::CollapsingHeader(part.header, ImGuiTreeNodeFlags_DefaultOpen)) continue;
    gui::Section section(part.header);
    part.draw(app);
  }
  ImGui::PopItemWidth();
  ImGui::End();
}

}  // namespace vitlens::viewer
