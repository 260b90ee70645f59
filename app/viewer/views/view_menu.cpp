// The main menu bar and the status bar.
#include <algorithm>
#include <string>

#include <imgui.h>

#include "views/views.hpp"
#include "models/bundled_models.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// `text` cut at its start to fit `room` pixels ("...the end of a long path"), whole when it fits.
std::string FitToRoom(const std::string& text, float room) {
  if (ImGui::CalcTextSize(text.c_str()).x <= room) return text;
  size_t cut = 0;
  while (cut < text.size()) {
    ++cut;
    while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;  // a whole UTF-8 character
    if (ImGui::CalcTextSize(("..." + text.substr(cut)).c_str()).x <= room) break;
  }
  return "..." + text.substr(cut);
}

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
  if (gui::MenuItem("Reset layout")) ++ui.layout_windows.generation;
  gui::EndMenu();
}

// Every model file in assets/models, read again each time the menu opens, so a new bundled model
// appears without code changes. Its description shows beside the menu, never over the entries.
void DrawModelMenu(App& app) {
  if (!gui::BeginMenu("Model")) return;
  static std::vector<BundledModel> listed;
  if (ImGui::IsWindowAppearing()) listed = bundled_models(bundled_models_folder());
  if (listed.empty()) gui::TextDisabled("no models in %s", bundled_models_folder().c_str());
  for (size_t i = 0; i < listed.size(); ++i) {
    const BundledModel& m = listed[i];
    ImGui::PushID(static_cast<int>(i));
    const bool current = app.doc.model && app.doc.model->model.config.name == m.name;
    // Listed by the name --model takes (designed, fashion-mnist, ...); the file's own name beside it.
    const std::string label = bundled_model_name(m.path).empty() ? m.name : bundled_model_name(m.path);
    if (gui::MenuItemChecked(label.c_str(), current, m.error.empty())) app.requests.open_model = m.path;
    gui::SideTooltip(m.name + "\n" + (m.error.empty() ? m.description : m.error));
    ImGui::PopID();
  }
  gui::EndMenu();
}

void DrawHelpMenu() {
  if (!gui::BeginMenu("Help")) return;
  gui::TextUnformatted("Click a patch: pin it as the query. Arrow keys: move the query.");
  gui::TextUnformatted("Hover a patch: it becomes the inspector's key.");
  gui::TextUnformatted("Drop an image or a .safetensors model onto the window to open it.");
  gui::TextUnformatted("Painted mask: choose 'painted', then drag on a picture (right drag erases).");
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

float StatusBarHeight() {
  // One line of widgets and the window's padding, never below a window's minimum height (ImGui
  // would grow it past the display's bottom edge).
  const ImGuiStyle& style = ImGui::GetStyle();
  return std::max(ImGui::GetFrameHeight() + 2.0f * style.WindowPadding.y, style.WindowMinSize.y);
}

void DrawStatusBar(App& app) {
  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  const float height = StatusBarHeight();
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
    gui::TextUnformatted(status.c_str());
    ImGui::SameLine();
    gui::TextDisabled("|");
    ImGui::SameLine();
  }
  const Message& m = app.ui.message;
  if (!m.text.empty()) {
    // One line: a message longer than the bar shows its end (where the files went), all of it on hover.
    const float room = ImGui::GetContentRegionAvail().x - gui::ButtonWidth("x") - 2.0f * ImGui::GetStyle().ItemSpacing.x;
    const std::string shown = FitToRoom(m.text, std::max(40.0f, room));
    if (m.error) gui::TextColored(ImVec4(1.0f, 0.45f, 0.45f, 1.0f), "%s", shown.c_str());
    else gui::TextUnformatted(shown);
    if (shown != m.text && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", m.text.c_str());
    ImGui::SameLine();
    if (gui::SmallButton("x")) app.ui.message = {};
  } else if (!working) {
    gui::TextUnformatted(FitToRoom("Drop an image or a .safetensors model onto the window, or use File > Open.",
                                   ImGui::GetContentRegionAvail().x));
  }
  ImGui::End();
}

}  // namespace vitlens::viewer
