// The heads view: one panel per head plus the mean over heads, each the exported picture with its
// colour bar. Index: [SECTION] Colour bar, [SECTION] Panel, [SECTION] View.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// [SECTION] Colour bar

void FormatValue(char* buf, size_t size, double v) { std::snprintf(buf, size, "%.3g", v); }

// The colour map from the bottom to the top of the scale, with tick values under it: 0, half and
// the top for the linear scales, every decade for the log scale.
void DrawColourBar(const App& app, const Texture& ramp, float scale, float width) {
  const float bar_h = 8.0f;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  if (ramp.id) draw->AddImage(ramp.imgui_id(), origin, ImVec2(origin.x + width, origin.y + bar_h));
  const float text_h = ImGui::GetTextLineHeight();
  ImGui::Dummy(ImVec2(width, bar_h + text_h + 2.0f));
  const ImU32 colour = ImGui::GetColorU32(ImGuiCol_Text);
  // Ticks as (position in [0, 1], value); the two ends always get a label, the inner ones only
  // where their label does not run into a neighbour's.
  std::vector<std::pair<float, double>> ticks;
  if (!(scale > 0.0f)) {
    ticks = {{0.0f, 0.0}};
  } else if (app.ui.display.normalize == Normalize::Log) {
    const int decades = static_cast<int>(kLogDecades);
    for (int k = 0; k <= decades; ++k)  // drawn at 1 + log10(v / max) / decades
      ticks.emplace_back(static_cast<float>(k) / static_cast<float>(decades), scale * std::pow(10.0, k - decades));
  } else {
    ticks = {{0.0f, 0.0}, {0.5f, scale * 0.5}, {1.0f, static_cast<double>(scale)}};
  }
  struct Label {
    float x, w;
    char text[32];
  };
  std::vector<Label> labels(ticks.size());
  for (size_t i = 0; i < ticks.size(); ++i) {
    FormatValue(labels[i].text, sizeof labels[i].text, ticks[i].second);
    labels[i].w = ImGui::CalcTextSize(labels[i].text).x;
    labels[i].x = std::clamp(origin.x + ticks[i].first * width - labels[i].w * 0.5f, origin.x, origin.x + width - labels[i].w);
  }
  const float gap = 6.0f;
  float left_end = labels.front().x + labels.front().w;
  const float right_start = labels.size() > 1 ? labels.back().x : origin.x + width;
  for (size_t i = 0; i < labels.size(); ++i) {
    const float tx = origin.x + ticks[i].first * width;
    draw->AddLine(ImVec2(tx, origin.y + bar_h), ImVec2(tx, origin.y + bar_h + 2.0f), colour);
    const bool end = i == 0 || i + 1 == labels.size();
    if (!end && (labels[i].x < left_end + gap || labels[i].x + labels[i].w > right_start - gap)) continue;
    if (i + 1 == labels.size() && i > 0 && labels[i].x < left_end + gap) continue;  // too narrow for both ends
    draw->AddText(ImVec2(labels[i].x, origin.y + bar_h + 2.0f), colour, labels[i].text);
    left_end = labels[i].x + labels[i].w;
  }
}

// [SECTION] Panel

// index < H: a head; index == H: the mean over heads.
void DrawHeadPanel(App& app, const ViewTextures& textures, int index, float width, float height) {
  const VitModel& model = app.doc.model->model;
  const int heads = model.config.num_heads;
  const int layer = current_layer(app);
  const Derived& d = app.derived;
  const bool is_mean = index == heads;
  const bool pool = app.ui.view.mode == MapMode::Pool && !app.ui.compute.rollout.on;  // the pool's heads, as the export labels them
  const std::string label = is_mean ? std::string("mean of heads")
                            : pool  ? "pool head " + std::to_string(index)
                                    : head_label(model.config, layer, index);
  ImGui::BeginGroup();
  gui::TextUnformatted(label.c_str());
  if (!is_mean && !pool && layer < static_cast<int>(model.config.head_descriptions.size()) && ImGui::IsItemHovered())
    ImGui::SetTooltip("%s", model.config.head_descriptions[static_cast<size_t>(layer)][static_cast<size_t>(index)].c_str());
  const std::string name = is_mean ? std::string("mean") : "head" + std::to_string(index);
  const Texture& texture = is_mean ? textures.mean : textures.heads[static_cast<size_t>(index)];
  DrawPicture(app, name.c_str(), texture, width, height, false);
  const size_t i = static_cast<size_t>(index);
  DrawColourBar(app, textures.ramp, i < d.scales.size() ? d.scales[i] : 0.0f, width);
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + width);  // keep the text inside the panel's column
  if (i < d.entropy.size()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    if (!is_mean && i < d.view.maps.cls_weight.size() && app.doc.comp->forward.has_class_token)
      gui::TextWrapped("entropy %.2f, cls %.3f", d.entropy[i], static_cast<double>(d.view.maps.cls_weight[i]));
    else
      gui::TextWrapped("entropy %.2f", d.entropy[i]);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Shannon entropy of the map in nats (uniform over %d patches: %.2f); cls: the weight on the class token",
                        app.doc.comp->forward.grid_h * app.doc.comp->forward.grid_w,
                        std::log(static_cast<double>(app.doc.comp->forward.grid_h * app.doc.comp->forward.grid_w)));
    ImGui::PopStyleColor();
  }
  if (i < d.kept.size()) {
    const ThresholdResult& t = d.kept[i];
    if (t.no_structure)  // a flat map has no region to keep: drawn whole, and said so
      gui::TextWrapped("no structure: every patch has the same weight, nothing to threshold");
    else
      gui::TextWrapped("kept %d/%d (%.1f%%), %.1f%% of mass", t.kept_patches, t.total_patches,
                       100.0 * t.kept_patches / std::max(1, t.total_patches), 100.0 * t.kept_mass);
  }
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
}

// [SECTION] Rollout

// Rollout mode: one picture, the rollout row's map over the image, as `vitlens export --rollout`.
void DrawRolloutPanel(App& app, const ViewTextures& textures) {
  const Derived& d = app.derived;
  const Computation& c = *app.doc.comp;
  const RolloutChoice& r = c.key.rollout;
  gui::TextWrapped("Attention rollout of the %s: layers %d to %d multiplied, heads fused by %s, %.0f%% of the lowest "
                     "weights discarded",
                     token_name(app.doc.model->model.config, c.forward.grid_w, d.rollout_query).c_str(), r.first_layer,
                     r.last_layer, head_fusion_name(r.fusion), 100.0 * static_cast<double>(r.discard));
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  float w = 0.0f, h = 0.0f;
  FitPicture(app, avail.x, std::max(48.0f, avail.y - 3.0f * ImGui::GetTextLineHeightWithSpacing() - 12.0f), w, h);
  DrawPicture(app, "rollout", textures.rollout, w, h, false);
  const float top = d.rollout_map.size() ? d.rollout_map.maxCoeff() : 0.0f;
  DrawColourBar(app, textures.ramp, top, w);
  gui::TextWrappedDisabled("entropy %.2f, patches hold %.3f of the row; %.0f ms for the pass and the rollout", map_entropy(d.rollout_map),
                      static_cast<double>(d.rollout_map.sum()), c.rollout_ms);
}

}  // namespace

// [SECTION] View

void DrawHeadsView(App& app, const ViewTextures& textures) {
  if (!app.ui.show_heads) return;
  PlaceWindow(app, "Heads", WindowSlot::Heads);
  if (!ImGui::Begin("Heads", &app.ui.show_heads)) {
    ImGui::End();
    return;
  }
  if (!app.doc.ready() || textures.heads_shown == 0) {
    gui::TextWrapped("%s", app.compute_job ? "Computing ..." : "Nothing to show yet.");
    ImGui::End();
    return;
  }
  const ViewChoice& v = app.ui.view;
  const Computation& c = *app.doc.comp;
  const int layer = current_layer(app);
  if (app.ui.compute.rollout.on) {
    if (c.key.rollout.on && app.derived.rollout_query >= 0) DrawRolloutPanel(app, textures);
    else gui::TextWrapped("%s", app.compute_job ? "Computing the rollout ..." : "No rollout: see the message below.");
    ImGui::End();
    return;
  }
  switch (v.mode) {
    case MapMode::Query:
      if (v.query_prefix >= 0 && v.query_prefix < c.forward.prefix)
        gui::TextWrapped("Where the %s looks, layer %d of %zu",
                    token_name(app.doc.model->model.config, c.forward.grid_w, v.query_prefix).c_str(), layer,
                    c.forward.layers.size());
      else
        gui::TextWrapped("Where query patch (%d, %d) looks, layer %d of %zu", v.query_row, v.query_col, layer,
                    c.forward.layers.size());
      break;
    case MapMode::ClassToken: gui::TextWrapped("Where the class token looks, layer %d", layer); break;
    case MapMode::Pool:
      gui::TextWrapped("Where the attention pool's query looks, over the output of layer %zu", c.forward.layers.size() - 1);
      break;
    case MapMode::Received:
      gui::TextWrapped("Attention each patch receives (mean over %d queries), layer %d", c.forward.received_queries, layer);
      break;
  }
  for (const std::string* error : {&app.derived.map_error, &app.derived.picture_error}) {
    if (error->empty()) continue;
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.4f, 0.4f, 1));
    gui::TextWrapped("%s", error->c_str());
    ImGui::PopStyleColor();
  }

  const int heads = app.doc.model->model.config.num_heads;
  if (v.focus_head >= 0 && v.focus_head < std::min(heads, textures.heads_shown)) {
    // One head opened large (from the layers x heads grid). The head is read before the button,
    // which resets it: this frame still draws the head it was drawn for.
    const int head = v.focus_head;
    if (gui::SmallButton("all heads")) app.ui.view.focus_head = -1;
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    float w = 0.0f, h = 0.0f;
    FitPicture(app, avail.x, std::max(48.0f, avail.y - 4.0f * ImGui::GetTextLineHeightWithSpacing() - 12.0f), w, h);
    DrawHeadPanel(app, textures, head, w, h);
    ImGui::End();
    return;
  }
  const int panels = std::min(heads, textures.heads_shown) + 1;
  const int columns = panels <= 3 ? panels : panels <= 6 ? 3 : 4;
  const int rows = (panels + columns - 1) / columns;
  const ImGuiStyle& style = ImGui::GetStyle();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  // Per panel: label line, picture, colour bar with ticks, one or two info lines.
  const float text_h = ImGui::GetTextLineHeightWithSpacing();
  const float extra_h = text_h * (app.ui.display.threshold_on ? 5.0f : 4.0f) + 12.0f;
  const float cell_w = (avail.x - style.ItemSpacing.x * static_cast<float>(columns - 1)) / static_cast<float>(columns);
  const float cell_h = (avail.y - style.ItemSpacing.y * static_cast<float>(rows - 1)) / static_cast<float>(rows) - extra_h;
  float w = 0.0f, h = 0.0f;
  FitPicture(app, cell_w, std::max(cell_h, 48.0f), w, h);
  for (int i = 0; i < panels; ++i) {
    if (i % columns != 0) ImGui::SameLine();
    DrawHeadPanel(app, textures, i == panels - 1 ? heads : i, w, h);
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
