// The seeds' worked example with editable Q, K and V:
//   Q = [[1, 0], [0, 1]]  K = [[1, 0], [1, 1], [0, 1]]  V = [[10, 0], [0, 5], [0, 1]]
//   scores = Q @ K.T / math.sqrt(2); weights = scores.softmax(dim=-1); context = weights @ V
// computed by vitlens::scaled_dot_product_attention, the function the engine is tested against.
#include <cmath>
#include <cstdio>

#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// The seed's printed output, rounded to 3 decimals.
constexpr float kSeedWeights[2][3] = {{0.401f, 0.401f, 0.198f}, {0.198f, 0.401f, 0.401f}};
constexpr float kSeedContext[2][2] = {{4.011f, 2.203f}, {1.978f, 2.407f}};

void DrawInputMatrix(const char* name, float (*rows)[2], int count) {
  gui::TextUnformatted(name);
  ImGui::PushID(name);
  for (int r = 0; r < count; ++r) {
    ImGui::PushID(r);
    ImGui::SetNextItemWidth(160.0f);
    gui::InputFloat2("##row", rows[r], "%.3f");
    ImGui::PopID();
  }
  ImGui::PopID();
}

void DrawResultMatrix(const char* id, const MatRM& m) {
  if (!ImGui::BeginTable(id, static_cast<int>(m.cols()), ImGuiTableFlags_Borders | ImGuiTableFlags_SizingFixedFit)) return;
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    ImGui::TableNextRow();
    for (Eigen::Index c = 0; c < m.cols(); ++c) {
      ImGui::TableNextColumn();
      gui::Text("%.3f", static_cast<double>(m(r, c)));
    }
  }
  ImGui::EndTable();
}

bool MatchesSeed(const WorkedResult& r) {
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j)
      if (!(std::fabs(r.weights(i, j) - kSeedWeights[i][j]) <= 6e-4f)) return false;  // NaN: no match
    for (int j = 0; j < 2; ++j)
      if (!(std::fabs(r.context(i, j) - kSeedContext[i][j]) <= 6e-4f)) return false;
  }
  return true;
}

}  // namespace

void DrawWorkedExampleView(App& app) {
  if (!app.ui.show_example) return;
  PlaceWindow(app, "Worked example", WindowSlot::Heads);  // on demand, over the heads
  if (!ImGui::Begin("Worked example", &app.ui.show_example)) {
    ImGui::End();
    return;
  }
  WorkedExample& ex = app.ui.example;
  gui::TextWrapped("Two queries, three keys, dimension 2. Each query scores every key with a dot product, the "
                     "softmax turns the scores into weights that sum to one, and the context is the weighted mix of "
                     "the values. Edit any number.");
  ImGui::BeginGroup();
  DrawInputMatrix("Q (queries)", ex.q, 2);
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  DrawInputMatrix("K (keys)", ex.k, 3);
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  DrawInputMatrix("V (values)", ex.v, 3);
  ImGui::EndGroup();
  gui::Checkbox("divide the scores by sqrt(d_k) = sqrt(2)", &ex.scaled);
  ImGui::SameLine();
  if (gui::Button("Reset to the seed's numbers")) ex = WorkedExample{};

  const Derived& d = app.derived;
  if (d.example_valid) {
    ImGui::Separator();
    gui::Text("scores = Q K^T%s", ex.scaled ? " / sqrt(2)" : "");
    DrawResultMatrix("scores", d.example.scores);
    gui::TextUnformatted("weights = softmax(scores) over each row");
    DrawResultMatrix("weights", d.example.weights);
    gui::TextUnformatted("context = weights V");
    DrawResultMatrix("context", d.example.context);
    ImGui::Separator();
    gui::TextDisabled("The seed prints: weights [[0.401, 0.401, 0.198], [0.198, 0.401, 0.401]]");
    gui::TextDisabled("                 context [[4.011, 2.203], [1.978, 2.407]]");
    if (MatchesSeed(d.example)) gui::TextColored(ImVec4(0.4f, 0.9f, 0.4f, 1.0f), "Same numbers as the seed.");
    else gui::TextWrappedDisabled("Your inputs differ from the seed's: the numbers above are yours.");
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
