// Head statistics for the current image (entropy, mean attention distance in pixels as the ViT
// paper's figure 7 reports it, and the head-role lifts), the designed heads' descriptions, and timings.
#include <algorithm>
#include <string>
#include <vector>

#include <imgui.h>

#include "views.hpp"

namespace vitlens::viewer {

namespace {

void DrawTimings(const App& app) {
  const Computation& c = *app.doc.comp;
  const Derived& d = app.derived;
  ImGui::Text("forward pass %.1f ms, head statistics %.1f ms; per query: maps %.2f ms + pictures %.2f ms; frame %.1f ms",
              c.forward_ms, c.stats_ms, d.maps_ms, d.render_ms, 1000.0 / std::max(1.0f, ImGui::GetIO().Framerate));
}

void DrawHeadTable(const App& app, const std::vector<HeadStats>& layer_stats, int layer) {
  const VitConfig& config = app.doc.model->model.config;
  const bool described = layer < static_cast<int>(config.head_descriptions.size());
  const auto& role_layers = app.doc.comp->roles.lift;
  const std::vector<RoleLifts>* roles =
      layer < static_cast<int>(role_layers.size()) && role_layers[static_cast<size_t>(layer)].size() == layer_stats.size()
          ? &role_layers[static_cast<size_t>(layer)]
          : nullptr;
  const int columns = 3 + (roles ? kHeadRoles : 0) + (described ? 1 : 0);
  if (!ImGui::BeginTable("heads", columns,
                         ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp))
    return;
  ImGui::TableSetupColumn("head", ImGuiTableColumnFlags_WidthFixed);
  ImGui::TableSetupColumn("entropy (nats)", ImGuiTableColumnFlags_WidthFixed);
  ImGui::TableSetupColumn("mean distance (px)", ImGuiTableColumnFlags_WidthFixed);
  if (roles)
    for (int role = 0; role < kHeadRoles; ++role) ImGui::TableSetupColumn(head_role_name(role), ImGuiTableColumnFlags_WidthFixed);
  if (described) ImGui::TableSetupColumn("description", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (size_t h = 0; h < layer_stats.size(); ++h) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%zu", h);
    ImGui::TableNextColumn();
    ImGui::Text("%.3f", layer_stats[h].entropy);
    ImGui::TableNextColumn();
    ImGui::Text("%.1f", layer_stats[h].mean_distance);
    if (roles) {
      // The head's strongest role in colour: the number to read first.
      const RoleLifts& lift = (*roles)[h];
      const auto best = std::max_element(lift.begin(), lift.end()) - lift.begin();
      for (int role = 0; role < kHeadRoles; ++role) {
        ImGui::TableNextColumn();
        if (role == best)
          ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "%.2f", lift[static_cast<size_t>(role)]);
        else
          ImGui::Text("%.2f", lift[static_cast<size_t>(role)]);
      }
    }
    if (described) {
      ImGui::TableNextColumn();
      ImGui::TextWrapped("%s", config.head_descriptions[static_cast<size_t>(layer)][h].c_str());
    }
  }
  ImGui::EndTable();
}

void DrawPlots(const App& app, const std::vector<HeadStats>& layer_stats) {
  std::vector<float> entropy, distance;
  for (const HeadStats& s : layer_stats) {
    entropy.push_back(static_cast<float>(s.entropy));
    distance.push_back(static_cast<float>(s.mean_distance));
  }
  const float width = (ImGui::GetContentRegionAvail().x - ImGui::GetStyle().ItemSpacing.x) * 0.5f;
  const float max_entropy = std::max(1e-3f, *std::max_element(entropy.begin(), entropy.end()));
  const float max_distance = std::max(1e-3f, *std::max_element(distance.begin(), distance.end()));
  ImGui::PlotHistogram("##entropy", entropy.data(), static_cast<int>(entropy.size()), 0, "entropy per head", 0.0f,
                       max_entropy * 1.1f, ImVec2(width, 60.0f));
  ImGui::SameLine();
  ImGui::PlotHistogram("##distance", distance.data(), static_cast<int>(distance.size()), 0, "mean distance per head",
                       0.0f, max_distance * 1.1f, ImVec2(width, 60.0f));
  // Deeper models: how far each head looks, layer by layer (the ViT paper's figure 7 view).
  const auto& layers = app.doc.comp->stats.layers;
  if (layers.size() > 1) {
    std::vector<float> per_layer;
    for (const auto& l : layers) {
      double sum = 0.0;
      for (const HeadStats& s : l) sum += s.mean_distance;
      per_layer.push_back(static_cast<float>(sum / std::max<size_t>(1, l.size())));
    }
    ImGui::PlotLines("##layers", per_layer.data(), static_cast<int>(per_layer.size()), 0,
                     "mean distance by layer (mean over heads)", 0.0f, FLT_MAX, ImVec2(ImGui::GetContentRegionAvail().x, 50.0f));
  }
}

}  // namespace

void DrawStatsView(App& app) {
  if (!app.ui.show_stats) return;
  PlaceWindow(0.56f, 0.68f, 0.44f, 0.32f);
  if (!ImGui::Begin("Head statistics", &app.ui.show_stats)) {
    ImGui::End();
    return;
  }
  if (!app.doc.ready()) {
    ImGui::TextUnformatted("No image yet.");
    ImGui::End();
    return;
  }
  const Computation& c = *app.doc.comp;
  const int layer = current_layer(app);
  DrawTimings(app);
  ImGui::TextDisabled("layer %d, over %d patch queries of this image; distance between patch centres weighted by "
                      "attention, in pixels of the %dx%d processed image",
                      layer, c.stats.queries, c.image.padded_w, c.image.padded_h);
  ImGui::TextDisabled("role lifts (edge, texture, colour, position) over %d queries: attention on the top %.0f%% most "
                      "alike keys by that role, relative to uniform (1 = none, %.0f = all); see README, Head roles",
                      c.roles.queries, 100.0 * c.roles.top_fraction, 1.0 / c.roles.top_fraction);
  if (layer < static_cast<int>(c.stats.layers.size()) && !c.stats.layers[static_cast<size_t>(layer)].empty()) {
    const auto& layer_stats = c.stats.layers[static_cast<size_t>(layer)];
    DrawPlots(app, layer_stats);
    DrawHeadTable(app, layer_stats, layer);
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
