// The in-app file browser: folders, parent, extension filter, typed path. One modal for every
// purpose: open an image or a model, choose the export folder, name a screenshot.
#include <filesystem>

#include <imgui.h>
#include <imgui_stdlib.h>

#include "control/file_list.hpp"
#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

// Frames drawn before a screenshot the browser asked for is taken. The first frame after Save no
// longer draws the browser, but Dear ImGui still takes it for the window under the mouse (hovering
// is found from the last frame's windows), so the widget under the pointer lights up only in the
// second.
constexpr int kScreenshotWaitFrames = 2;

const char* Title(BrowserPurpose purpose) {
  switch (purpose) {
    case BrowserPurpose::OpenImage: return "Open an image";
    case BrowserPurpose::OpenModel: return "Open a model (.safetensors)";
    case BrowserPurpose::ExportFolder: return "Export into a folder";
    case BrowserPurpose::ScreenshotFile: return "Save a screenshot (.png)";
  }
  return "";
}

const char* ConfirmLabel(BrowserPurpose purpose) {
  switch (purpose) {
    case BrowserPurpose::OpenImage:
    case BrowserPurpose::OpenModel: return "Open";
    case BrowserPurpose::ExportFolder: return "Export here";
    case BrowserPurpose::ScreenshotFile: return "Save";
  }
  return "OK";
}

bool IsFolder(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

void Navigate(BrowserState& b, const std::string& folder) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(folder, ec).lexically_normal();
  b.folder = p.string();
  while (b.folder.size() > 1 && b.folder.back() == '/') b.folder.pop_back();
  b.listed_folder.clear();
}

void Relist(BrowserState& b) {
  const bool folders_only = b.purpose == BrowserPurpose::ExportFolder;
  const std::vector<std::string>& exts = b.show_all                              ? std::vector<std::string>{}
                                         : b.purpose == BrowserPurpose::OpenModel ? model_extensions()
                                         : b.purpose == BrowserPurpose::ScreenshotFile
                                             ? std::vector<std::string>{"png"}
                                             : image_extensions();
  FolderListing listing = list_folder(b.folder, exts, folders_only);
  b.entries = std::move(listing.entries);
  b.list_error = listing.error;
  b.listed_folder = b.folder;
  b.listed_show_all = b.show_all;
}

// The path the user chose: a typed relative path is taken relative to the listed folder.
std::string Resolve(const BrowserState& b, const std::string& typed) {
  if (typed.empty() || typed[0] == '/') return typed;
  return join_path(b.folder, typed);
}

// Returns true when the browser should close.
bool Confirm(App& app, const std::string& path) {
  BrowserState& b = app.ui.browser;
  if (path.empty()) return false;
  if (IsFolder(path) && b.purpose != BrowserPurpose::ExportFolder) {
    Navigate(b, path);
    b.typed.clear();
    return false;
  }
  switch (b.purpose) {
    case BrowserPurpose::OpenImage: app.requests.open_image = path; break;
    case BrowserPurpose::OpenModel: app.requests.open_model = path; break;
    case BrowserPurpose::ExportFolder:
      app.ui.export_folder = path;
      app.requests.export_folder = path;
      break;
    case BrowserPurpose::ScreenshotFile:
      app.ui.screenshot_path = path;
      app.requests.screenshot = path;
      app.requests.screenshot_wait = kScreenshotWaitFrames;  // the picture without the browser
      break;
  }
  return true;
}

}  // namespace

void DrawFileBrowser(App& app) {
  BrowserState& b = app.ui.browser;
  if (b.open_requested) {
    ImGui::OpenPopup("File browser");
    b.open_requested = false;
  }
  const ImVec2 display = ImGui::GetIO().DisplaySize;
  ImGui::SetNextWindowSize(ImVec2(display.x * 0.5f, display.y * 0.6f), ImGuiCond_Appearing);
  ImGui::SetNextWindowPos(ImVec2(display.x * 0.5f, display.y * 0.5f), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  b.shown = ImGui::BeginPopupModal("File browser");
  if (!b.shown) return;
  if (b.listed_folder != b.folder || b.listed_show_all != b.show_all) Relist(b);

  gui::TextUnformatted(Title(b.purpose));
  if (gui::Button("Up")) Navigate(b, parent_folder(b.folder));
  ImGui::SameLine();
  gui::TextWrapped("%s", b.folder.c_str());
  if (!b.list_error.empty()) gui::TextColored(ImVec4(1.0f, 0.4f, 0.4f, 1.0f), "%s", b.list_error.c_str());

  bool close = false;
  const float footer = ImGui::GetFrameHeightWithSpacing() * 2.0f + ImGui::GetStyle().ItemSpacing.y;
  ImGui::BeginChild("entries", ImVec2(0.0f, -footer), true);
  std::string navigate_to;
  // Only the rows in view are drawn (and recorded as widgets): a folder may hold 100,000 files.
  ImGuiListClipper clipper;
  clipper.Begin(static_cast<int>(b.entries.size()));
  while (clipper.Step()) {
    for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
      const std::string& name = b.entries[static_cast<size_t>(i)].first;
      const bool is_folder = b.entries[static_cast<size_t>(i)].second;
      const std::string label = is_folder ? name + "/" : name;
      const std::string full = join_path(b.folder, name);
      const bool selected = Resolve(b, b.typed) == full;
      ImGui::PushID(i);  // a file name is not an ID: it may hold "##"
      const bool pressed = gui::SelectableText(label, selected, ImGuiSelectableFlags_AllowDoubleClick);
      ImGui::PopID();
      if (pressed) {
        if (is_folder && b.purpose != BrowserPurpose::ExportFolder) {
          navigate_to = full;
        } else if (is_folder) {  // choosing a folder: one click selects, a double click enters
          if (ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) navigate_to = full;
          else b.typed = full;
        } else {
          b.typed = full;
          if (ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) close = Confirm(app, full);
        }
      }
    }
  }
  if (b.entries.empty() && b.list_error.empty()) gui::TextWrappedDisabled("(nothing here that fits the filter)");
  ImGui::EndChild();
  if (!navigate_to.empty()) Navigate(b, navigate_to);

  ImGui::SetNextItemWidth(-160.0f);
  if (gui::InputText("path", &b.typed, ImGuiInputTextFlags_EnterReturnsTrue)) close = Confirm(app, Resolve(b, b.typed));
  if (b.purpose != BrowserPurpose::ExportFolder) {
    ImGui::SameLine();
    gui::Checkbox("all files", &b.show_all);
  }
  if (gui::Button(ConfirmLabel(b.purpose))) close = Confirm(app, Resolve(b, b.purpose == BrowserPurpose::ExportFolder && b.typed.empty() ? b.folder : b.typed));
  ImGui::SameLine();
  if (gui::Button("Cancel") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) close = true;
  if (close) ImGui::CloseCurrentPopup();
  ImGui::EndPopup();
}

}  // namespace vitlens::viewer
