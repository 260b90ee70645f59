// Widgets that record themselves (see widgets.hpp).
#include "widgets.hpp"

#include <algorithm>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include <imgui_internal.h>
#include <imgui_stdlib.h>

namespace vitlens::viewer {

namespace gui {

namespace {

// This frame's list, the open sections (headers, menus, combos) and the IDs seen so far.
struct Recorder {
  WidgetFrame frame;
  std::vector<std::string> sections;
  std::unordered_map<ImGuiID, size_t> seen;  // ID -> index in frame.widgets
};
Recorder g_recorder;

// An open menu or combo has begun its popup when BeginMenu / BeginCombo returns, so its own item
// is no longer ImGui's last item: it is recorded from the frame it was last drawn closed (it
// does not move while open). Keyed by "parent window|label".
std::unordered_map<std::string, WidgetInfo> g_closed_popups;

std::string VisiblePart(const char* label) {
  const std::string s = label;
  const auto hashes = s.find("##");
  return hashes == std::string::npos ? s : s.substr(0, hashes);
}

void Add(WidgetInfo w);

Rect ToRect(const ImVec2& min, const ImVec2& max) { return Rect{min.x, min.y, max.x - min.x, max.y - min.y}; }

// Notes the item ImGui just submitted. `frame_width` > 0: the part that takes the mouse is that
// wide from the item's left edge (a slider's track, without the label to its right).
void Record(const std::string& label, const char* id_label, WidgetKind kind, float frame_width = 0.0f) {
  const ImGuiContext& g = *ImGui::GetCurrentContext();
  WidgetInfo w;
  w.label = label;
  w.id_label = id_label;
  // A multi-part widget (InputFloat2) ends in a group, which has no ID: its ID is its label's
  // hash in the current scope, the scope its parts are pushed under.
  w.id = ImGui::GetItemID() != 0 ? ImGui::GetItemID() : ImGui::GetID(id_label);
  w.window = g.CurrentWindow ? g.CurrentWindow->Name : "";
  w.sections = g_recorder.sections;
  w.kind = kind;
  w.rect = ToRect(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  w.frame = w.rect;
  if (frame_width > 0.0f) {
    w.frame.w = frame_width;
    w.frame.h = ImGui::GetFrameHeight();
  }
  // Only the part inside the window's visible area takes the mouse (a widget cut by the
  // window's edge is clicked on what shows of it).
  if (g.CurrentWindow) {
    const ImRect clip = g.CurrentWindow->ClipRect;
    const float x0 = std::max(w.frame.x, clip.Min.x), y0 = std::max(w.frame.y, clip.Min.y);
    const float x1 = std::min(w.frame.x + w.frame.w, clip.Max.x), y1 = std::min(w.frame.y + w.frame.h, clip.Max.y);
    w.frame = Rect{x0, y0, std::max(0.0f, x1 - x0), std::max(0.0f, y1 - y0)};
  }
  w.enabled = (g.LastItemData.InFlags & ImGuiItemFlags_Disabled) == 0;
  w.visible = ImGui::IsItemVisible() && w.frame.w > 0.0f && w.frame.h > 0.0f;
  Add(std::move(w));
}

void Add(WidgetInfo w) {
  const auto [it, fresh] = g_recorder.seen.emplace(w.id, g_recorder.frame.widgets.size());
  if (!fresh) {
    const WidgetInfo& first = g_recorder.frame.widgets[it->second];
    char id_text[16];
    std::snprintf(id_text, sizeof id_text, "0x%08X", w.id);
    g_recorder.frame.clashes.push_back(w.window + ": '" + first.id_label + "' (" + widget_kind_name(first.kind) + ") and '" +
                                       w.id_label + "' (" + widget_kind_name(w.kind) + ") share ID " + id_text);
  }
  g_recorder.frame.widgets.push_back(std::move(w));
}

void Record(const char* label, WidgetKind kind, float frame_width = 0.0f) {
  Record(VisiblePart(label), label, kind, frame_width);
}

}  // namespace

void BeginFrame() { g_recorder = Recorder{}; }

WidgetFrame EndFrame(float display_w, float display_h) {
  WidgetInfo drop;
  drop.label = drop.id_label = "drop files here";
  drop.window = "(main window)";
  drop.kind = WidgetKind::DropTarget;
  drop.rect = drop.frame = Rect{0.0f, 0.0f, display_w, display_h};
  g_recorder.frame.widgets.push_back(drop);
  g_recorder.frame.display_w = static_cast<int>(display_w);
  g_recorder.frame.display_h = static_cast<int>(display_h);
  WidgetFrame out = std::move(g_recorder.frame);
  g_recorder = Recorder{};
  return out;
}

Section::Section(const char* name) {
  ImGui::PushID(name);
  g_recorder.sections.emplace_back(name);
}

Section::~Section() {
  g_recorder.sections.pop_back();
  ImGui::PopID();
}

bool Button(const char* label) {
  const bool pressed = ImGui::Button(label);
  Record(label, WidgetKind::Button);
  return pressed;
}

bool SmallButton(const char* label) {
  const bool pressed = ImGui::SmallButton(label);
  Record(label, WidgetKind::Button);
  return pressed;
}

bool Checkbox(const char* label, bool* value) {
  const bool changed = ImGui::Checkbox(label, value);
  Record(label, WidgetKind::Checkbox);
  return changed;
}

bool RadioButton(const char* label, bool active) {
  const bool pressed = ImGui::RadioButton(label, active);
  Record(label, WidgetKind::Radio);
  return pressed;
}

bool SliderInt(const char* label, int* value, int min, int max, const char* format) {
  const float width = ImGui::CalcItemWidth();  // before the widget uses up SetNextItemWidth
  const bool changed = ImGui::SliderInt(label, value, min, max, format);
  Record(label, WidgetKind::Slider, width);
  return changed;
}

bool SliderFloat(const char* label, float* value, float min, float max, const char* format, ImGuiSliderFlags flags) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::SliderFloat(label, value, min, max, format, flags);
  Record(label, WidgetKind::Slider, width);
  return changed;
}

namespace {

// A field's record also holds what it shows, so a tool that typed into it can read it back.
void RecordValue(std::string value) { g_recorder.frame.widgets.back().value = std::move(value); }

}  // namespace

bool InputText(const char* label, std::string* text, ImGuiInputTextFlags flags) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::InputText(label, text, flags);
  Record(label, WidgetKind::Input, width);
  RecordValue(*text);
  return changed;
}

bool InputFloat2(const char* label, float value[2], const char* format) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::InputFloat2(label, value, format);
  Record(label, WidgetKind::Input, width);
  return changed;
}

bool InputInt(const char* label, int* value) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::InputInt(label, value, 0);
  Record(label, WidgetKind::Input, width);
  RecordValue(std::to_string(*value));
  return changed;
}

bool InputDouble(const char* label, double* value, const char* format) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::InputDouble(label, value, 0.0, 0.0, format);
  Record(label, WidgetKind::Input, width);
  char shown[64];
  std::snprintf(shown, sizeof shown, format, *value);  // as the field formats it
  RecordValue(shown);
  return changed;
}

bool CollapsingHeader(const char* label, ImGuiTreeNodeFlags flags) {
  const bool open = ImGui::CollapsingHeader(label, flags);
  Record(label, WidgetKind::Header);
  return open;
}

bool TreeNode(const char* label) {
  const bool open = ImGui::TreeNode(label);
  Record(label, WidgetKind::TreeNode);
  return open;
}

bool Picture(const char* label, const ImVec2& size, ImGuiButtonFlags flags) {
  const bool pressed = ImGui::InvisibleButton(label, size, flags);
  Record(label, WidgetKind::Picture);
  return pressed;
}

bool SelectableText(const std::string& text, bool selected, ImGuiSelectableFlags flags) {
  // An empty label: ImGui would cut a name at "##" and hash it; the entry's scope is its ID.
  const ImVec2 text_pos = ImGui::GetCursorScreenPos();  // where Selectable would draw its label
  const bool pressed = ImGui::Selectable("##entry", selected, flags);
  ImGui::GetWindowDrawList()->AddText(text_pos, ImGui::GetColorU32(ImGuiCol_Text), text.c_str(), text.c_str() + text.size());
  Record(text, "##entry", WidgetKind::Selectable);
  return pressed;
}

bool Selectable(const char* label, bool selected) {
  const bool pressed = ImGui::Selectable(label, selected);
  Record(label, WidgetKind::Selectable);
  return pressed;
}

namespace {

std::string PopupKey(const char* label) {
  const ImGuiWindow* window = ImGui::GetCurrentContext()->CurrentWindow;
  return std::string(window ? window->Name : "") + "|" + label;
}

// After BeginMenu / BeginCombo: records the item (closed) or its last closed record (open).
void RecordPopupOwner(const std::string& key, const char* label, WidgetKind kind, bool open, float frame_width) {
  if (!open) {
    Record(label, kind, frame_width);
    g_closed_popups[key] = g_recorder.frame.widgets.back();
    return;
  }
  const auto it = g_closed_popups.find(key);
  if (it != g_closed_popups.end()) Add(it->second);
  g_recorder.sections.emplace_back(VisiblePart(label));
}

}  // namespace

bool BeginMenu(const char* label, bool enabled) {
  const std::string key = PopupKey(label);
  const bool open = ImGui::BeginMenu(label, enabled);
  RecordPopupOwner(key, label, WidgetKind::Menu, open, 0.0f);
  return open;
}

void EndMenu() {
  ImGui::EndMenu();
  g_recorder.sections.pop_back();
}

bool MenuItem(const char* label, bool enabled) {
  const bool pressed = ImGui::MenuItem(label, nullptr, false, enabled);
  Record(label, WidgetKind::MenuItem);
  return pressed;
}

bool MenuItemToggle(const char* label, bool* selected) {
  const bool pressed = ImGui::MenuItem(label, nullptr, selected);
  Record(label, WidgetKind::MenuItem);
  return pressed;
}

bool BeginCombo(const char* label, const char* preview) {
  const std::string key = PopupKey(label);
  const float width = ImGui::CalcItemWidth();
  const bool open = ImGui::BeginCombo(label, preview);
  RecordPopupOwner(key, label, WidgetKind::Combo, open, width);
  return open;
}

void EndCombo() {
  ImGui::EndCombo();
  g_recorder.sections.pop_back();
}

}  // namespace gui
}  // namespace vitlens::viewer
