// Head statistics for the current image (entropy, mean attention distance in pixels as the ViT
// paper's figure 7 reports it, and the head-role lifts), the designed heads' descriptions, and timings;
// above them the classifier's top classes for the image, when the model has a classifier.
#include <algorithm>
#include <string>
#include <vector>

#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// What the model thinks the image is: the worker's predictions (core/model/classifier.hpp), the
// lines `vitlens export` prints; a model without a head says so in one line.
void DrawPredictions(const App& app) {
  const Predictions& p = app.doc.comp->predictions;
  const VitModel& model = app.doc.model->model;
  if (!p.has_classifier) {
    gui::TextWrappedDisabled("predictions: none, the model has no classifier head");
    return;
  }
  gui::Text("predictions: top %zu of %d classes", p.top.size(), model.w.num_classes);
  for (size_t i = 0; i < p.top.size(); ++i)
    gui::TextUnformatted(prediction_line(static_cast<int>(i) + 1, p.top[i].probability, p.labels[i]));
  if (p.padding_patches > 0)
    gui::TextWrappedDisabled("pooled over the %d patches of the image; the %d padding patches are left out", p.pooled_patches,
                             p.padding_patches);
  ImGui::Separator();
}

void DrawTimings(const App& app) {
  const Computation& c = *app.doc.comp;
  const Derived& d = app.derived;
  gui::TextWrapped("forward pass %.1f ms, head statistics %.1f ms; per query: maps %.2f ms + pictures %.2f ms; frame %.1f ms",
                   c.forward_ms, c.stats_ms, d.maps_ms, d.render_ms, 1000.0 / std::max(1.0f, ImGui::GetIO().Framerate));
}

// Head, entropy, distance and role lifts in narrow fixed columns; the designed heads' long
// descriptions are each head's tooltip, so every row stays one line high.
void DrawHeadTable(const App& app, const std::vector<HeadStats>& layer_stats, int layer) {
  const VitConfig& config = app.doc.model->model.config;
  const bool described = layer < static_cast<int>(config.head_descriptions.size());
  const auto& role_layers = app.doc.comp->roles.lift;
  // No role query (an image of one patch): no lifts to show (the JSON leaves them out too).
  const std::vector<RoleLifts>* roles =
      app.doc.comp->roles.queries > 0 && layer < static_cast<int>(role_layers.size()) &&
              role_layers[static_cast<size_t>(layer)].size() == layer_stats.size()
          ? &role_layers[static_cast<size_t>(layer)]
          : nullptr;
  const int columns = 3 + (roles ? kHeadRoles : 0);
  const ImGuiStyle& style = ImGui::GetStyle();
  const float row_h = ImGui::GetTextLineHeight() + 2.0f * style.CellPadding.y;
  // Wider than the window: the table scrolls sideways, its columns keep their width.
  const ImVec2 size(0.0f, static_cast<float>(layer_stats.size() + 1) * row_h + style.ScrollbarSize + 4.0f);
  if (!ImGui::BeginTable("heads", columns,
                         ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit |
                             ImGuiTableFlags_ScrollX,
                         size))
    return;
  ImGui::TableSetupColumn("head");
  ImGui::TableSetupColumn("entropy (nats)");
  ImGui::TableSetupColumn("distance (px)");
  if (roles)
    for (int role = 0; role < kHeadRoles; ++role) ImGui::TableSetupColumn(head_role_name(role));
  ImGui::TableHeadersRow();
  for (size_t h = 0; h < layer_stats.size(); ++h) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    gui::TextUnformatted(head_label(config, layer, static_cast<int>(h)));
    if (described && ImGui::IsItemHovered())
      ImGui::SetTooltip("%s", config.head_descriptions[static_cast<size_t>(layer)][h].c_str());
    ImGui::TableNextColumn();
    gui::Text("%.3f", layer_stats[h].entropy);
    ImGui::TableNextColumn();
    gui::Text("%.1f", layer_stats[h].mean_distance);
    if (roles) {
      // The head's strongest role in colour: the number to read first.
      const RoleLifts& lift = (*roles)[h];
      const auto best = std::max_element(lift.begin(), lift.end()) - lift.begin();
      for (int role = 0; role < kHeadRoles; ++role) {
        ImGui::TableNextColumn();
        if (role == best)
          gui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "%.2f", lift[static_cast<size_t>(role)]);
        else
          gui::Text("%.2f", lift[static_cast<size_t>(role)]);
      }
    }
  }
  ImGui::EndTable();
  if (described) gui::TextWrappedDisabled("hover a head's name for what it was designed to do");
}

// Bars per head, from 0 to a little above the largest, with the range on the axis.
void DrawHeadBars(const char* title, const std::vector<float>& values, const char* y_format, float width) {
  gui::PlotAxes axes;
  axes.hi = std::max(1e-3f, *std::max_element(values.begin(), values.end())) * 1.1f;
  axes.y_format = y_format;
  axes.x_first = "head 0";
  axes.x_last = "head " + std::to_string(values.size() - 1);
  gui::Plot(title, values, true, axes, width, 56.0f);
}

void DrawPlots(const App& app, const std::vector<HeadStats>& layer_stats) {
  std::vector<float> entropy, distance;
  for (const HeadStats& s : layer_stats) {
    entropy.push_back(static_cast<float>(s.entropy));
    distance.push_back(static_cast<float>(s.mean_distance));
  }
  const float spacing = ImGui::GetStyle().ItemSpacing.x;
  const float width = (ImGui::GetContentRegionAvail().x - spacing) * 0.5f;
  ImGui::BeginGroup();
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + width);
  DrawHeadBars("entropy per head (nats)", entropy, "%.2f", width);
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + width);
  DrawHeadBars("mean distance per head (px)", distance, "%.0f", width);
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
  // Deeper models: how far each head looks, layer by layer (the ViT paper's figure 7 view), on an
  // axis from 0, so equal layers draw a level line at their height, not at the top edge.
  const auto& layers = app.doc.comp->stats.layers;
  if (layers.size() > 1) {
    std::vector<float> per_layer;
    for (const auto& l : layers) {
      double sum = 0.0;
      for (const HeadStats& s : l) sum += s.mean_distance;
      per_layer.push_back(static_cast<float>(sum / std::max<size_t>(1, l.size())));
    }
    gui::PlotAxes axes;
    axes.hi = std::max(1e-3f, *std::max_element(per_layer.begin(), per_layer.end())) * 1.1f;
    axes.y_format = "%.0f";
    axes.x_first = "layer 0";
    axes.x_last = "layer " + std::to_string(per_layer.size() - 1);
    gui::Plot("mean distance by layer (px, mean over heads)", per_layer, false, axes, ImGui::GetContentRegionAvail().x, 50.0f);
  }
}

}  // namespace

void DrawStatsView(App& app) {
  if (!app.ui.show_stats) return;
  PlaceWindow(app, "Head statistics", WindowSlot::Stats);
  if (!ImGui::Begin("Head statistics", &app.ui.show_stats)) {
    ImGui::End();
    return;
  }
  if (!app.doc.ready()) {
    gui::TextUnformatted("No image yet.");
    ImGui::End();
    return;
  }
  const Computation& c = *app.doc.comp;
  const int layer = current_layer(app);
  DrawPredictions(app);
  DrawTimings(app);
  gui::TextWrappedDisabled("layer %d, over %d patch queries of this image; distance between patch centres weighted by "
                      "attention, in pixels of the %dx%d processed image",
                      layer, c.stats.queries, c.image.padded_w, c.image.padded_h);
  if (c.roles.queries > 0)
    gui::TextWrappedDisabled("role lifts (edge, texture, colour, position) over %d queries: attention on the top %.0f%% most "
                        "alike keys by that role, relative to uniform (1 = none, %.0f = all); see docs/head-roles.md",
                        c.roles.queries, 100.0 * c.roles.top_fraction, 1.0 / c.roles.top_fraction);
  else
    gui::TextWrappedDisabled("no role lifts: the image has too few patches to rank keys by role (see docs/head-roles.md)");
  if (layer < static_cast<int>(c.stats.layers.size()) && !c.stats.layers[static_cast<size_t>(layer)].empty()) {
    const auto& layer_stats = c.stats.layers[static_cast<size_t>(layer)];
    DrawHeadTable(app, layer_stats, layer);
    DrawPlots(app, layer_stats);
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
