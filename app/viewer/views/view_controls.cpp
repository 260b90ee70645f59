// The controls view: what to compute and how to draw it. Index:
//   [SECTION] Files, preprocessing, precision and working size
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

#include "control/file_list.hpp"
#include "views/views.hpp"
#include "views/widgets.hpp"
#include "core/io/image.hpp"

namespace vitlens::viewer {

namespace {

// [SECTION] Files, preprocessing, precision and working size

void DrawFiles(App& app) {
  const Document& doc = app.doc;
  gui::TextWrapped("Model: %s", doc.model ? doc.model->model.config.name.c_str() : "(none)");
  if (doc.model && ImGui::IsItemHovered())
    ImGui::SetTooltip("%s\n%s", doc.model->path.c_str(), doc.model->model.config.description.c_str());
  if (doc.model) {
    const VitConfig& c = doc.model->model.config;
    gui::TextWrappedDisabled("%d heads of %d dims, depth %d, patch %d, %s%s, %d register(s)", c.num_heads, c.head_dim(),
                             c.depth, c.patch_size, c.class_token ? "class token" : "no class token",
                             c.dist_token ? " + distillation token" : "", c.register_tokens);
  }
  if (gui::Button("Open image...")) open_browser(app, BrowserPurpose::OpenImage);
  gui::SameLineIfFits(gui::ButtonWidth("Open model..."));
  if (gui::Button("Open model...")) open_browser(app, BrowserPurpose::OpenModel);
}

// The whole image or the checkpoint's own transform (`vitlens export --preprocess`); the second
// is disabled, its tooltip saying why, for a model that publishes none vitlens reproduces.
void DrawPreprocess(App& app) {
  if (!app.doc.model) return;
  const std::string why_not = preprocess_unavailable(app);
  const bool model = app.ui.compute.preprocess == Preprocess::Model && why_not.empty();
  gui::TextUnformatted("input");
  ImGui::SameLine();
  if (gui::RadioButton("whole image", !model)) set_preprocess(app, Preprocess::Whole);
  gui::SideTooltip("The whole image at the working size, aspect kept, padded to whole patches (padding masked): every "
                   "pixel of the file has a token. `vitlens export --preprocess whole`, the default.");
  gui::SameLineIfFits(gui::RadioWidth("model's transform"));
  ImGui::BeginDisabled(!why_not.empty());
  if (gui::RadioButton("model's transform", model)) set_preprocess(app, Preprocess::Model);
  ImGui::EndDisabled();
  gui::SideTooltip(why_not.empty()
                       ? "What the checkpoint's library feeds the model (timm's pretrained_cfg, a Hugging Face "
                         "preprocessor_config.json), pixel for pixel: the picture shows the crop or squash the model "
                         "sees, so the maps are a notebook's. `vitlens export --preprocess model`."
                       : "Not available: " + why_not + ".");
}

// In the model's transform the transform sets the size: the line says what it does and gives.
void DrawTransform(App& app) {
  const std::string caption = preprocess_caption(app);
  if (caption.empty()) {
    gui::TextWrappedDisabled("computing with the model's transform ...");
    return;
  }
  const LoadedImage& src = app.doc.image->pixels;
  gui::TextWrappedDisabled("%s", caption.c_str());
  gui::TextWrappedDisabled("%dx%d image -> %s", src.source_w, src.source_h, status_text(app).c_str());
}

// fp32, bf16 or auto (`vitlens export --precision`) on one row, and under it what the pass on
// screen ran when the row alone does not say it (auto's choice, a pass still running) and whether
// this CPU emulates bf16.
void DrawPrecision(App& app) {
  gui::TextUnformatted("precision");
  for (Precision p : {Precision::Fp32, Precision::Bf16, Precision::Auto}) {
    if (p == Precision::Fp32) ImGui::SameLine();
    else gui::SameLineIfFits(gui::RadioWidth(precision_name(p)));
    if (gui::RadioButton(precision_name(p), app.ui.compute.precision == p)) set_precision(app, p);
  }
  gui::HelpMarker("The Linear layers' arithmetic, as `vitlens export --precision`. fp32: float32 throughout, what "
                  "PyTorch computes (the default). bf16: their operands rounded to bfloat16, sums in float32; softmax, "
                  "LayerNorm, GELU and the residual stay float32; trained models' maps stay within about one colour "
                  "level of fp32. auto: bf16 for models of 20 M parameters or more on a CPU with bfloat16 dot "
                  "products (AVX512-BF16), else fp32. The caption and the exported JSON say which ran.");
  for (const std::string& line : precision_lines(app)) gui::TextWrappedDisabled("%s", line.c_str());
}

// The slider edits a size; the line under it says what is on screen, in the status bar's words
// (status_text), and what a dragged size would give until it is released.
void DrawWorkingSize(App& app) {
  if (!app.doc.model || !app.doc.image) return;
  if (app.ui.compute.preprocess == Preprocess::Model && preprocess_unavailable(app).empty()) {
    DrawTransform(app);
    return;
  }
  const VitConfig& config = app.doc.model->model.config;
  int& edit = app.ui.working_side_edit;
  const int committed = working_side(config, app.ui.compute);
  if (!ImGui::IsAnyItemActive() || edit == 0) edit = committed;
  // A model smaller than the usual minimum (28 px Fashion-MNIST) can still be shown at its own size.
  gui::SliderInt("working size", &edit, std::min(kMinWorkingSide, committed), kMaxWorkingSide, "%d px");
  if (ImGui::IsItemDeactivatedAfterEdit()) app.ui.compute.max_side = edit;  // recompute on release only
  gui::HelpMarker("The image's long side is scaled down to this (never up; aspect kept) and padded to whole patches. "
                  "More pixels give more tokens: the forward pass grows as tokens squared. An image of exactly the "
                  "model's img_size is never resampled, as `vitlens export` does.");
  const LoadedImage& src = app.doc.image->pixels;  // the file's own size, whatever size it was loaded at
  if (src.source_w == config.img_w && src.source_h == config.img_h)
    gui::TextWrappedDisabled("this image is the model's own size: it is never resampled");
  if (app.ui.compute.max_side > 0) {
    if (gui::SmallButton("model size")) app.ui.compute.max_side = 0;
  }
  if (edit != committed) {
    const GridPrediction g = predict_grid(src.source_w, src.source_h, config, edit);
    gui::TextWrappedDisabled("on release: %dx%d px, grid %dx%d, %d tokens", g.content_w, g.content_h, g.grid_h, g.grid_w,
                             g.tokens);
  } else if (app.doc.comp && app.doc.comp->key.max_side == committed) {
    gui::TextWrappedDisabled("%dx%d image -> %s", src.source_w, src.source_h, status_text(app).c_str());
  } else {
    gui::TextWrappedDisabled("computing at %d px ...", committed);
  }
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
  gui::HelpMarker("The query whose attention row the maps show: the patch you pinned on the image, or a prefix token "
             "(class, distillation, register). Its row's weights on the patches; `vitlens export --token` writes the same.");
}

// Rollout mode's settings (rollout.hpp): what `vitlens export --rollout` takes.
void DrawRollout(App& app) {
  RolloutChoice& r = app.ui.compute.rollout;
  ViewChoice& v = app.ui.view;
  // The heads of each layer fused by their mean, maximum or minimum weight.
  for (HeadFusion f : {HeadFusion::Mean, HeadFusion::Max, HeadFusion::Min}) {
    const std::string label = std::string("fuse ") + head_fusion_name(f);
    if (f != HeadFusion::Mean) gui::SameLineIfFits(gui::RadioWidth(label.c_str()));
    if (gui::RadioButton(label.c_str(), r.fusion == f)) r.fusion = f;
  }
  gui::SliderFloat("discard", &r.discard, 0.0f, 0.99f, "%.2f of the lowest");
  gui::HelpMarker("Attention rollout (Abnar and Zuidema 2020, as vit-explain): each layer's heads fused, this share of the "
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
  gui::SameLineIfFits(gui::RadioWidth("from the query"));
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
  gui::SameLineIfFits(gui::RadioWidth("class token"));
  ImGui::BeginDisabled(!has_cls);
  if (gui::RadioButton("class token", !rollout && v.mode == MapMode::ClassToken)) {
    v.mode = MapMode::ClassToken;
    set_rollout(app, false);
  }
  ImGui::EndDisabled();
  gui::SameLineIfFits(gui::RadioWidth("received"));
  if (gui::RadioButton("received", !rollout && v.mode == MapMode::Received)) {
    v.mode = MapMode::Received;
    set_rollout(app, false);
  }
  // The attention pool's latent query (SigLIP's head): a query of its own, after the last block.
  const bool has_pool = app.doc.model && app.doc.model->model.config.attention_pool;
  gui::SameLineIfFits(gui::RadioWidth("attention pool"));
  ImGui::BeginDisabled(!has_pool);
  if (gui::RadioButton("attention pool", !rollout && v.mode == MapMode::Pool && has_pool)) {
    v.mode = MapMode::Pool;
    set_rollout(app, false);
  }
  ImGui::EndDisabled();
  gui::SameLineIfFits(gui::RadioWidth("rollout"));
  if (gui::RadioButton("rollout", rollout)) set_rollout(app, true);
  gui::TextWrappedDisabled("%s", map_mode_caption(app).c_str());
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
    gui::TextDisabled("layer 0 (the model has one block)");
  }
  if (gui::Button("Layers x heads grid")) app.ui.show_layers = !app.ui.show_layers;
  gui::HelpMarker("Every head of every layer as a small map for this query or mode; click one to open it here.");
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
  gui::TextUnformatted("scale to");
  ImGui::SameLine();
  if (gui::RadioButton("robust", d.normalize == Normalize::Robust)) d.normalize = Normalize::Robust;
  gui::SameLineIfFits(gui::RadioWidth("each head"));
  if (gui::RadioButton("each head", d.normalize == Normalize::PerHead)) d.normalize = Normalize::PerHead;
  gui::SameLineIfFits(gui::RadioWidth("shared"));
  if (gui::RadioButton("shared", d.normalize == Normalize::Shared)) d.normalize = Normalize::Shared;
  gui::SameLineIfFits(gui::RadioWidth("log"));
  if (gui::RadioButton("log", d.normalize == Normalize::Log)) d.normalize = Normalize::Log;
  gui::HelpMarker("robust: every map to its 99th percentile, raised so that at most 10 % of its weight saturates: a few "
             "hot patches saturate instead of flattening the rest, and a head that looks at one patch shows that one "
             "patch. each head: every map to its own maximum. shared: all maps to the largest maximum, so heads compare. "
             "log: each map to its maximum over three decades, so the faint tail shows.");
  gui::TextUnformatted("upsample");
  ImGui::SameLine();
  if (gui::RadioButton("nearest", d.style.upsample == Upsample::Nearest)) d.style.upsample = Upsample::Nearest;
  gui::SameLineIfFits(gui::RadioWidth("bilinear"));
  if (gui::RadioButton("bilinear", d.style.upsample == Upsample::Bilinear)) d.style.upsample = Upsample::Bilinear;
  gui::Checkbox("threshold", &d.threshold_on);
  gui::HelpMarker("As DINO's visualize_attention: keep only the fewest patches that hold this share of each map's "
             "attention mass; the rest are drawn as zero.");
  if (d.threshold_on) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(-1.0f);
    gui::SliderFloat("##mass", &d.threshold, 0.05f, 1.0f, "top %.2f of the mass");
    const auto& kept = app.derived.kept;
    if (!kept.empty())
      gui::TextWrappedDisabled("mean map: %d of %d patches kept (%.1f%%)", kept.back().kept_patches, kept.back().total_patches,
                          100.0 * kept.back().kept_patches / std::max(1, kept.back().total_patches));
  }
  gui::Checkbox("patch grid", &d.show_grid);
}

// [SECTION] Mask

void DrawMask(App& app) {
  ComputeChoice& c = app.ui.compute;
  for (MaskMode m : {MaskMode::None, MaskMode::Padding, MaskMode::Causal, MaskMode::Painted}) {
    if (m != MaskMode::None) gui::SameLineIfFits(gui::RadioWidth(mask_mode_name(m)));
    if (gui::RadioButton(mask_mode_name(m), c.mask == m)) set_mask(app, m);
  }
  gui::HelpMarker("Keys a query may not attend to (weight exactly 0, the rest renormalised).\n"
             "none: every key, even the padded border. padding: not the padded border (as vitlens export).\n"
             "causal: only keys at or before the query in raster order (and not the padding).\n"
             "painted: not the patches you paint on the image (left drag paints, right drag erases).");
  if (c.mask == MaskMode::Painted) {
    if (gui::RadioButton("paint", c.brush == Brush::Paint)) c.brush = Brush::Paint;
    gui::SameLineIfFits(gui::RadioWidth("erase"));
    if (gui::RadioButton("erase", c.brush == Brush::Erase)) c.brush = Brush::Erase;
    gui::SameLineIfFits(gui::RadioWidth("off (click pins)"));
    if (gui::RadioButton("off (click pins)", c.brush == Brush::Off)) c.brush = Brush::Off;
    int painted = 0;
    for (uint8_t v : c.painted) painted += v;
    gui::Text("%d patches forbidden as keys", painted);
    gui::SameLineIfFits(gui::ButtonWidth("clear"));
    if (gui::SmallButton("clear")) clear_paint(app);
  }
}

// [SECTION] Softmax scale

void DrawScale(App& app) {
  ComputeChoice& c = app.ui.compute;
  const int d = app.doc.model ? app.doc.model->model.config.head_dim() : 0;
  if (gui::RadioButton("1/sqrt(d)", c.scale == ScaleMode::Model)) c.scale = ScaleMode::Model;
  gui::SameLineIfFits(gui::RadioWidth("none"));
  if (gui::RadioButton("none", c.scale == ScaleMode::Unscaled)) c.scale = ScaleMode::Unscaled;
  gui::SameLineIfFits(gui::RadioWidth("temperature"));
  if (gui::RadioButton("temperature", c.scale == ScaleMode::Temperature)) c.scale = ScaleMode::Temperature;
  gui::HelpMarker("softmax(q.k * scale). The model's scale 1/sqrt(d) keeps the scores' spread from growing with the "
             "head dimension d; without it the softmax saturates and each head attends to one or two keys. "
             "A temperature T divides the scaled scores: T > 1 flattens, T < 1 sharpens.");
  if (c.scale == ScaleMode::Temperature)
    gui::SliderFloat("T", &c.temperature, 0.1f, 10.0f, "%.2f", ImGuiSliderFlags_Logarithmic);
  if (app.doc.comp)
    gui::TextWrappedDisabled("scores x %.4f now (1/sqrt(%d) = %.4f)", static_cast<double>(app.doc.comp->forward.score_scale), d,
                        d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 0.0);
}

// [SECTION] Export

void DrawExport(App& app) {
  UiState& ui = app.ui;
  gui::InputText("folder", &ui.export_folder);
  ImGui::SameLine();
  if (gui::SmallButton("...##export")) open_browser(app, BrowserPurpose::ExportFolder);
  gui::Checkbox("raw weights (.npy)", &ui.export_raw);
  gui::HelpMarker("Also write <stem>_attn.npy: float32 (layers, heads, tokens, tokens); at most 4096 tokens.");
  ImGui::BeginDisabled(!app.doc.ready());
  if (gui::Button("Export")) {
    if (ui.export_folder.empty()) report_export_failure(app, "Export: the folder field is empty; type or choose a folder");
    else app.requests.export_folder = ui.export_folder;
  }
  ImGui::EndDisabled();
  gui::HelpMarker("Writes the heads, the mean, the montage and a JSON file into the folder above (created when it is "
             "the default, $VITLENS_EXPORT_DIR or ~/vitlens-exports). The status bar says where they went.");
  if (app.doc.ready()) {
    const std::string viewer_only = viewer_only_settings(app);
    if (viewer_only.empty())
      gui::TextWrappedDisabled("Same files as: %s", cli_command(app, ui.export_folder).c_str());
    else
      gui::TextWrappedDisabled("%s has no `vitlens export` flag: the export shows it and adds <stem>_view.json "
                               "describing it.", viewer_only.c_str());
  }
  gui::InputText("screenshot", &ui.screenshot_path);
  ImGui::SameLine();
  if (gui::SmallButton("...##shot")) open_browser(app, BrowserPurpose::ScreenshotFile);
  if (gui::Button("Save screenshot")) {
    if (ui.screenshot_path.empty()) report_export_failure(app, "Screenshot: the file field is empty; type or choose a name");
    else app.requests.screenshot = ui.screenshot_path;
  }
}

}  // namespace

// [SECTION] View

void DrawControlsView(App& app) {
  if (!app.ui.show_controls) return;
  PlaceWindow(app, "Controls", WindowSlot::Controls);
  if (!ImGui::Begin("Controls", &app.ui.show_controls)) {
    ImGui::End();
    return;
  }
  // Fields and sliders leave room on their right for the longest label and its "(?)".
  const ImGuiStyle& style = ImGui::GetStyle();
  ImGui::PushItemWidth(-(ImGui::CalcTextSize("working size (?)").x + 2.0f * style.ItemInnerSpacing.x + style.ItemSpacing.x));
  DrawFiles(app);
  DrawPreprocess(app);
  DrawPrecision(app);
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
