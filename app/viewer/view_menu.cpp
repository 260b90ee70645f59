// The main menu bar and the status bar.
#include <imgui.h>

#include "views.hpp"
#include "vitlens/bundled_models.hpp"
#include "widgets.hpp"

namespace vitlens::viewer {

namespace {

void DrawRecent(const char* title, const std::vector<std::string>& recent, std::string& request) {
  if (!gui::BeginMenu(title, !recent.empty())) return;
  for (size_t i = 0; i < recent.size(); ++i) {
    ImGui::PushID(static_cast<int>(i));  // a path is not an ID: it may hold "##"
    if (gui::MenuItem(recent[i].c_str())) request = recent[i];
    ImGui::PopID();
  }
  gui::EndMenu();
}

void DrawFileMenu(App& app) {
  if (!gui::BeginMenu("File")) return;
  if (gui::MenuItem("Open image...")) open_browser(app, BrowserPurpose::OpenImage);
  if (gui::MenuItem("Open model...")) open_browser(app, BrowserPurpose::OpenModel);
  DrawRecent("Recent images", app.ui.recent_images, app.requests.open_image);
  DrawRecent("Recent models", app.ui.recent_models, app.requests.open_model);
  ImGui::Separator();
  if (gui::MenuItem("Export...", app.doc.ready())) open_browser(app, BrowserPurpose::ExportFolder);
  if (gui::MenuItem("Save screenshot...")) open_browser(app, BrowserPurpose::ScreenshotFile);
  ImGui::Separator();
  if (gui::MenuItem("Quit")) app.requests.quit = true;
  gui::EndMenu();
}

void DrawViewMenu(App& app) {
  if (!gui::BeginMenu("View")) return;
  UiState& ui = app.ui;
  gui::MenuItemToggle("Controls", &ui.show_controls);
  gui::MenuItemToggle("Image", &ui.show_image);
  gui::MenuItemToggle("Heads", &ui.show_heads);
  gui::MenuItemToggle("Layers x heads", &ui.show_layers);
  gui::MenuItemToggle("Inspector", &ui.show_inspector);
  gui::MenuItemToggle("Head statistics", &ui.show_stats);
  gui::MenuItemToggle("Worked example", &ui.show_example);
  gui::MenuItemToggle("Train", &ui.show_train);
  ImGui::Separator();
  gui::MenuItemToggle("Patch grid", &ui.display.show_grid);
  gui::EndMenu();
}

// Every model file in assets/models, read again each time the menu opens, so a new bundled model
// appears without code changes.
void DrawModelMenu(App& app) {
  if (!ImGui::BeginMenu("Model")) return;
  static std::vector<BundledModel> listed;
  if (ImGui::IsWindowAppearing()) listed = bundled_models(bundled_models_folder());
  if (listed.empty()) ImGui::TextDisabled("no models in %s", bundled_models_folder().c_str());
  for (size_t i = 0; i < listed.size(); ++i) {
    const BundledModel& m = listed[i];
    ImGui::PushID(static_cast<int>(i));
    const bool current = app.doc.model && app.doc.model->model.config.name == m.name;
    // Listed by the name --model takes (designed, fashion-mnist, ...); the file's own name in the tooltip.
    const std::string label = bundled_model_name(m.path).empty() ? m.name : bundled_model_name(m.path);
    if (ImGui::MenuItem(label.c_str(), nullptr, current, m.error.empty())) app.requests.open_model = m.path;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("%s\n%s", m.name.c_str(), m.error.empty() ? m.description.c_str() : m.error.c_str());
    ImGui::PopID();
  }
  ImGui::EndMenu();
}

void DrawHelpMenu() {
  if (!gui::BeginMenu("Help")) return;
  ImGui::TextUnformatted("Click a patch: pin it as the query. Arrow keys: move the query.");
  ImGui::TextUnformatted("Hover a patch: it becomes the inspector's key.");
  ImGui::TextUnformatted("Drop an image or a .safetensors model onto the window to open it.");
  ImGui::TextUnformatted("Painted mask: choose 'painted', then drag on a picture (right drag erases).");
  gui::EndMenu();
}

}  // namespace

void DrawMainMenu(App& app) {
  if (!ImGui::BeginMainMenuBar()) return;
  DrawFileMenu(app);
  DrawModelMenu(app);
  DrawViewMenu(app);
  DrawHelpMenu();
  ImGui::EndMainMenuBar();
}

void DrawStatusBar(App& app) {
  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  const float height = ImGui::GetFrameHeight() + 8.0f;
  ImGui::SetNextWindowPos(ImVec2(viewport->WorkPos.x, viewport->WorkPos.y + viewport->WorkSize.y - height));
  ImGui::SetNextWindowSize(ImVec2(viewport->WorkSize.x, height));
  const ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                                 ImGuiWindowFlags_NoFocusOnAppearing | ImGuiWindowFlags_NoBringToFrontOnFocus;
  if (!ImGui::Begin("##status", nullptr, flags)) {
    ImGui::End();
    return;
  }
  const bool working = app.compute_job != 0 || !app.export_jobs.empty();
  if (working) {
    const std::string activity = app.worker.activity();
    ImGui::ProgressBar(app.worker.progress(), ImVec2(260.0f, 0.0f), activity.empty() ? "working" : activity.c_str());
    ImGui::SameLine();
  }
  // The current computation first (never an old message's grid), then the last message.
  const std::string status = status_text(app);
  if (!status.empty()) {
    ImGui::TextUnformatted(status.c_str());
    ImGui::SameLine();
    ImGui::TextDisabled("|");
    ImGui::SameLine();
  }
  const Message& m = app.ui.message;
  if (!m.text.empty()) {
    if (m.error) ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.45f, 1.0f), "%s", m.text.c_str());
    else ImGui::TextUnformatted(m.text.c_str());
    ImGui::SameLine();
    if (gui::SmallButton("x")) app.ui.message = {};
  } else if (!working) {
    ImGui::TextDisabled("Drop an image or a .safetensors model onto the window, or use File > Open.");
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
