// The inspector: for the pinned query and the hovered key, the numbers attention computes, in
// the order it computes them (Vaswani et al. 2017, sec. 3.2.1; the seeds' AttentionHead):
//   patch values -> q, k, v (this layer's LN1(x) W_qkv^T + b) -> q.k -> x scale -> softmax -> w v
#include <cmath>
#include <cstdio>

#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// Tables wider than the window scroll sideways instead of squeezing their columns.
constexpr ImGuiTableFlags kWideTable = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollX;

ImVec2 TableSize(int rows) {
  const ImGuiStyle& style = ImGui::GetStyle();
  return ImVec2(0.0f, static_cast<float>(rows) * (ImGui::GetTextLineHeight() + 2.0f * style.CellPadding.y) +
                          style.ScrollbarSize + 4.0f);
}

std::string TokenName(const App& app, int token) {
  return token_name(app.doc.model->model.config, app.doc.comp->forward.grid_w, token);
}

// The 3 P P normalised values of a patch as P rows of P values per channel, side by side.
void DrawPatchValues(const char* id, const std::vector<float>& values, int p) {
  if (values.empty()) {
    gui::TextWrappedDisabled("(a class, distillation or register token has no pixels: it is a learned vector)");
    return;
  }
  const int columns = 3 * p;
  if (columns > 48) {
    gui::TextWrappedDisabled("%zu values (patch %dx%d): too many to list", values.size(), p, p);
    return;
  }
  if (!ImGui::BeginTable(id, columns, kWideTable, TableSize(p + 1))) return;
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < p; ++x) {
      char header[16];
      std::snprintf(header, sizeof header, "%s%d", c == 0 ? "R" : c == 1 ? "G" : "B", x);
      ImGui::TableSetupColumn(header);
    }
  ImGui::TableHeadersRow();
  for (int y = 0; y < p; ++y) {
    ImGui::TableNextRow();
    for (int c = 0; c < 3; ++c)
      for (int x = 0; x < p; ++x) {
        ImGui::TableNextColumn();
        gui::Text("%+.2f", static_cast<double>(values[static_cast<size_t>((c * p + y) * p + x)]));
      }
  }
  ImGui::EndTable();
}

void DrawVectorRow(const char* name, const std::vector<float>& values) {
  ImGui::TableNextRow();
  ImGui::TableNextColumn();
  gui::TextUnformatted(name);
  for (float v : values) {
    ImGui::TableNextColumn();
    gui::Text("%+.3f", static_cast<double>(v));
  }
}

void DrawHeadSteps(const App& app, const InspectorStep& step) {
  const VitConfig& config = app.doc.model->model.config;
  if (!ImGui::BeginTable("steps", 6, kWideTable | ImGuiTableFlags_RowBg,
                         TableSize(static_cast<int>(step.heads.size()) + 1)))
    return;
  ImGui::TableSetupColumn("head");
  ImGui::TableSetupColumn("q.k");
  ImGui::TableSetupColumn("x scale");
  ImGui::TableSetupColumn("softmax weight");
  ImGui::TableSetupColumn("|w v|");
  ImGui::TableSetupColumn("row max");
  ImGui::TableHeadersRow();
  for (size_t h = 0; h < step.heads.size(); ++h) {
    const HeadStep& s = step.heads[h];
    double norm = 0.0;
    for (float v : s.contribution) norm += static_cast<double>(v) * v;
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    gui::TextUnformatted(head_label(config, step.layer, static_cast<int>(h)).c_str());
    ImGui::TableNextColumn();
    gui::Text("%+.4f", static_cast<double>(s.dot));
    ImGui::TableNextColumn();
    gui::Text("%+.4f", static_cast<double>(s.scaled));
    ImGui::TableNextColumn();
    if (step.key_allowed) gui::Text("%.5f", static_cast<double>(s.weight));
    else gui::TextDisabled("0 (masked)");
    ImGui::TableNextColumn();
    gui::Text("%.4f", std::sqrt(norm));
    ImGui::TableNextColumn();
    gui::Text("%.5f", static_cast<double>(s.max_weight));
  }
  ImGui::EndTable();

  const int d = config.head_dim();
  for (size_t h = 0; h < step.heads.size(); ++h) {
    const HeadStep& s = step.heads[h];
    char title[64];
    std::snprintf(title, sizeof title, "head %zu: the %d-value vectors", h, d);
    if (!gui::TreeNode(title)) continue;
    if (d <= 32 && ImGui::BeginTable("vectors", d + 1, kWideTable, TableSize(5))) {
      DrawVectorRow("q (query)", s.q);
      DrawVectorRow("k (key)", s.k);
      DrawVectorRow("v (key)", s.v);
      DrawVectorRow("w v", s.contribution);
      DrawVectorRow("output", s.output);
      ImGui::EndTable();
    } else {
      gui::TextWrappedDisabled("head dimension %d: too wide to list", d);
    }
    gui::TextWrappedDisabled("q.k = %+.4f; x %.4f = %+.4f; weight %.5f; output = sum over keys of w v", static_cast<double>(s.dot),
                        static_cast<double>(step.score_scale), static_cast<double>(s.scaled), static_cast<double>(s.weight));
    ImGui::TreePop();
  }
}

}  // namespace

void DrawInspectorView(App& app) {
  if (!app.ui.show_inspector) return;
  PlaceWindow(app, "Inspector", WindowSlot::Inspector);
  if (!ImGui::Begin("Inspector", &app.ui.show_inspector)) {
    ImGui::End();
    return;
  }
  const Derived& d = app.derived;
  if (!app.doc.ready() || !d.inspector_valid) {
    gui::TextWrapped("%s", "Pin a query and hover a key to see the arithmetic.");
    ImGui::End();
    return;
  }
  const InspectorStep& step = d.inspector;
  const int p = app.doc.model->model.config.patch_size;
  gui::TextWrapped("query %s (token %d)  ->  key %s (token %d), layer %d", TokenName(app, step.query_token).c_str(),
              step.query_token, TokenName(app, step.key_token).c_str(), step.key_token, step.layer);
  gui::TextWrappedDisabled("hover a patch to choose the key; weight = softmax over all %d keys of q.k x %.4f%s",
                      app.doc.comp->forward.tokens, static_cast<double>(step.score_scale),
                      step.key_allowed ? "" : "; this key is masked for this query");
  DrawHeadSteps(app, step);
  char values_title[128];
  std::snprintf(values_title, sizeof values_title,
                "patch values (%d each, normalised)###patch values", 3 * p * p);
  if (gui::TreeNode(values_title)) {
    gui::TextUnformatted("query");
    DrawPatchValues("query_values", step.query_patch, p);
    gui::TextUnformatted("key");
    DrawPatchValues("key_values", step.key_patch, p);
    ImGui::TreePop();
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
