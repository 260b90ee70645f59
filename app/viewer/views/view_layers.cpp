// The layers x heads window: every head of every layer as a small map for the current query or
// mode (one picture core draws, layer_grid.hpp), with layer and head labels; a click on a tile
// opens that layer and head in the Heads window.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// What the tiles show, in words.
std::string GridCaption(const App& app) {
  const Computation& c = *app.doc.comp;
  const ViewChoice& v = app.ui.view;
  const bool rollout = app.ui.compute.rollout.on;
  const MapMode mode = rollout ? (v.rollout_from_query || !c.forward.has_class_token ? MapMode::Query : MapMode::ClassToken) : v.mode;
  std::string text;
  switch (mode) {
    case MapMode::Query: {
      const int token = v.query_prefix >= 0 && v.query_prefix < c.forward.prefix
                            ? v.query_prefix
                            : c.forward.prefix + v.query_row * c.forward.grid_w + v.query_col;
      text = "where the query " + token_name(app.doc.model->model.config, c.forward.grid_w, token) + " looks";
      break;
    }
    case MapMode::ClassToken: text = "where the class token looks"; break;
    case MapMode::Received: text = "attention each patch receives"; break;
    case MapMode::Pool: text = "the attention pool's query only"; break;
  }
  if (mode != MapMode::Pool && c.forward.pool_probs.size() > 0) text += "; the last row: the attention pool's query";
  return text + (rollout ? " (the rollout's row, layer by layer)" : "");
}

}  // namespace

void DrawLayersView(App& app, const ViewTextures& textures) {
  if (!app.ui.show_layers) return;
  PlaceWindow(app, "Layers x heads", WindowSlot::Inspector);  // over the Inspector: shown on demand, on top
  if (!ImGui::Begin("Layers x heads", &app.ui.show_layers)) {
    ImGui::End();
    return;
  }
  const Derived& d = app.derived;
  const LayerGrid& g = d.layers;
  if (!app.doc.ready() || g.rows() == 0 || textures.layers.id == 0) {
    gui::TextWrapped("%s", !d.layers_error.empty() ? d.layers_error.c_str() : app.compute_job ? "Computing ..." : "Nothing to show yet.");
    ImGui::End();
    return;
  }
  if (g.layers > 0)
    gui::TextWrapped("%d %s x %d heads, %s; click a tile to open it", g.layers, g.layers == 1 ? "layer" : "layers", g.heads,
                     GridCaption(app).c_str());
  else
    gui::TextWrapped("%d heads, %s; click a tile to open it", g.heads, GridCaption(app).c_str());
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  gui::TextWrapped("every map for this query: %.2f ms (from the cached q and K, no new forward pass)", d.layers_ms);
  ImGui::PopStyleColor();

  // Scale the one-pixel-per-patch picture to the window, leaving room for the labels: up, or down
  // when the window is narrower than one pixel a patch (every head stays in view, none cut off).
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float label_w = ImGui::CalcTextSize("L00").x + 6.0f, label_h = ImGui::GetTextLineHeight() + 2.0f;
  const float pic_w = static_cast<float>(g.picture.cols), pic_h = static_cast<float>(g.picture.rows);
  const float scale = std::max(0.05f, std::min((avail.x - label_w) / pic_w, (avail.y - label_h) / pic_h));
  const float width = std::max(1.0f, std::floor(pic_w * scale)), height = std::max(1.0f, std::floor(pic_h * scale));
  const float step_x = static_cast<float>(g.grid_w + kLayerGridGap) * scale;
  const float step_y = static_cast<float>(g.grid_h + kLayerGridGap) * scale;
  const ImVec2 start = ImGui::GetCursorScreenPos();
  const ImVec2 origin(start.x + label_w, start.y + label_h);
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  // Head labels above the columns and layer labels left of the rows, where they fit.
  char label[16];
  for (int h = 0; h < g.heads; ++h) {
    std::snprintf(label, sizeof label, "h%d", h);
    if (ImGui::CalcTextSize(label).x <= step_x || h % 2 == 0)
      draw->AddText(ImVec2(origin.x + static_cast<float>(h) * step_x, start.y), text, label);
  }
  for (int l = 0; l < g.rows(); ++l) {
    if (l < g.layers) std::snprintf(label, sizeof label, "L%d", l);
    else std::snprintf(label, sizeof label, "pool");
    if (ImGui::GetTextLineHeight() <= step_y || l % 2 == 0)
      draw->AddText(ImVec2(start.x, origin.y + static_cast<float>(l) * step_y), text, label);
  }
  ImGui::SetCursorScreenPos(origin);
  gui::Picture("layers x heads", ImVec2(width, height), ImGuiButtonFlags_MouseButtonLeft);
  const bool hovered = ImGui::IsItemHovered(), clicked = ImGui::IsItemClicked(ImGuiMouseButton_Left);
  draw->AddImage(textures.layers.imgui_id(), origin, ImVec2(origin.x + width, origin.y + height));
  const ImGuiIO& io = ImGui::GetIO();
  app.ui.layout["layers"] = Rect{origin.x * io.DisplayFramebufferScale.x, origin.y * io.DisplayFramebufferScale.y,
                                 width * io.DisplayFramebufferScale.x, height * io.DisplayFramebufferScale.y};

  // The tile the Heads window shows (its layer; its head when one is open), outlined.
  const int shown_layer = current_layer(app), shown_head = app.ui.view.focus_head;
  const bool pool_shown = app.ui.view.mode == MapMode::Pool && g.pool_row;  // the pool's row is what the Heads window shows
  if (!app.ui.compute.rollout.on && (shown_layer < g.layers || pool_shown)) {
    const float x0 = shown_head >= 0 ? origin.x + static_cast<float>(shown_head) * step_x : origin.x;
    const float x1 = shown_head >= 0 ? x0 + static_cast<float>(g.grid_w) * scale : origin.x + width;
    const float y0 = origin.y + static_cast<float>(pool_shown ? g.layers : shown_layer) * step_y;
    draw->AddRect(ImVec2(x0 - 1.0f, y0 - 1.0f), ImVec2(x1 + 1.0f, y0 + static_cast<float>(g.grid_h) * scale + 1.0f),
                  IM_COL32(255, 255, 255, 230), 0.0f, 0, 1.5f);
  }
  int layer = 0, head = 0;
  if (hovered && layer_grid_cell(g, kLayerGridGap, static_cast<int>((io.MousePos.x - origin.x) / scale),
                                 static_cast<int>((io.MousePos.y - origin.y) / scale), layer, head)) {
    if (layer == g.layers)  // the attention pool's row
      ImGui::SetTooltip("attention pool, pool head %d: click to open it", head);
    else
      ImGui::SetTooltip("layer %d, %s: click to open it", layer, head_label(app.doc.model->model.config, layer, head).c_str());
    if (clicked) open_grid_cell(app, layer == g.layers ? model_layers(app) : layer, head);
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
