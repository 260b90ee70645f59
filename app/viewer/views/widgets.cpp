// Widgets that record themselves (see widgets.hpp).
#include "views/widgets.hpp"

#include <algorithm>
#include <cstdarg>
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

// Every window drawn this frame, back to front, with what its contents can show and reach.
void RecordWindows() {
  const ImGuiContext& g = *ImGui::GetCurrentContext();
  for (const ImGuiWindow* w : g.Windows) {
    if (!w->Active || w->Hidden || w->IsFallbackWindow) continue;
    WindowInfo info;
    info.name = w->Name;
    const ImGuiWindowFlags f = w->Flags;
    info.kind = (f & ImGuiWindowFlags_Tooltip)     ? "tooltip"
                : (f & ImGuiWindowFlags_ChildMenu) ? "menu"
                : (f & ImGuiWindowFlags_Modal)     ? "modal"
                : (f & ImGuiWindowFlags_Popup)     ? "popup"
                : (f & ImGuiWindowFlags_ChildWindow) ? "child"
                : (f & ImGuiWindowFlags_MenuBar) && std::string(w->Name) == "##MainMenuBar" ? "menu bar"
                                                     : "window";
    if (w->ParentWindow && (f & ImGuiWindowFlags_ChildWindow)) info.parent = w->ParentWindow->Name;
    info.rect = ToRect(w->Pos, ImVec2(w->Pos.x + w->Size.x, w->Pos.y + w->Size.y));
    info.visible = ToRect(w->InnerRect.Min, w->InnerRect.Max);
    info.scroll_x = w->Scroll.x;
    info.scroll_y = w->Scroll.y;
    info.scroll_max_x = w->ScrollMax.x;
    info.scroll_max_y = w->ScrollMax.y;
    g_recorder.frame.windows.push_back(std::move(info));
  }
}

std::string Format(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  return out;
}

// `text` with its spaces turned into line breaks where a line would pass `width` pixels. Dear
// ImGui's own wrapping also breaks after a '.' or ',' (a number "0.000" drawn as "0." over
// "000"); broken here first, its wrapping only splits a word wider than the whole line.
std::string BreakAtSpaces(const std::string& text, float width) {
  const float space = ImGui::CalcTextSize(" ").x;
  std::string out;
  float line = 0.0f;
  bool line_start = true;  // nothing on this line yet: the next word needs no space before it
  bool broke = false;      // this line began at a break of ours
  for (size_t at = 0;;) {
    const size_t found = text.find_first_of(" \n", at);
    const size_t end = found == std::string::npos ? text.size() : found;
    const bool empty = end == at;  // one more space of a run
    if (!(line_start && broke && empty)) {  // the rest of a run of spaces our break ended is dropped
      const float word = ImGui::CalcTextSize(text.c_str() + at, text.c_str() + end).x;
      if (!line_start) {
        const bool fits = line + space + word <= width;
        out += fits ? ' ' : '\n';
        line = fits ? line + space : 0.0f;
        broke = !fits;
      }
      out.append(text, at, end - at);
      line += word;
      line_start = broke && empty;
    }
    if (end == text.size()) return out;
    if (text[end] == '\n') {
      out += '\n';
      line = 0.0f;
      line_start = true;
      broke = false;
    }
    at = end + 1;
  }
}

// Draws `text` (wrapped at the window's or column's edge, or on one line) and notes it with the
// width it needed and the room it had.
void DrawText(const std::string& text, bool wrapped) {
  const float room = ImGui::GetContentRegionAvail().x;
  if (wrapped) {
    const ImGuiWindow* window = ImGui::GetCurrentContext()->CurrentWindow;
    const bool own_wrap = window->DC.TextWrapPos < 0.0f;  // no wrap position pushed: the edge
    if (own_wrap) ImGui::PushTextWrapPos(0.0f);
    // A pixel to spare, so Dear ImGui never finds a line of ours too long by rounding.
    const std::string lines = BreakAtSpaces(text, ImGui::CalcWrapWidthForPos(window->DC.CursorPos, window->DC.TextWrapPos) - 1.0f);
    ImGui::TextUnformatted(lines.c_str(), lines.c_str() + lines.size());
    if (own_wrap) ImGui::PopTextWrapPos();
  } else {
    ImGui::TextUnformatted(text.c_str(), text.c_str() + text.size());
  }
  const ImGuiContext& g = *ImGui::GetCurrentContext();
  TextInfo t;
  t.text = text;
  t.window = g.CurrentWindow ? g.CurrentWindow->Name : "";
  t.rect = ToRect(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  t.width = t.rect.w;
  t.room = room;
  t.wrapped = wrapped;
  g_recorder.frame.texts.push_back(std::move(t));
}

void DrawTextColoured(const ImVec4& colour, const std::string& text, bool wrapped) {
  ImGui::PushStyleColor(ImGuiCol_Text, colour);
  DrawText(text, wrapped);
  ImGui::PopStyleColor();
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
  RecordWindows();
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

void Text(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = Format(fmt, args);
  va_end(args);
  DrawText(text, false);
}

void TextDisabled(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = Format(fmt, args);
  va_end(args);
  DrawTextColoured(ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled), text, false);
}

void TextColored(const ImVec4& colour, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = Format(fmt, args);
  va_end(args);
  DrawTextColoured(colour, text, false);
}

void TextWrapped(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = Format(fmt, args);
  va_end(args);
  DrawText(text, true);
}

void TextWrappedDisabled(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string text = Format(fmt, args);
  va_end(args);
  DrawTextColoured(ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled), text, true);
}

void TextUnformatted(const std::string& text) { DrawText(text, false); }

void HelpMarker(const char* text) {
  SameLineIfFits(ImGui::CalcTextSize("(?)").x);
  TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
    ImGui::TextUnformatted(text);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

void SameLineIfFits(float width) {
  ImGui::SameLine();
  if (ImGui::GetContentRegionAvail().x < width) ImGui::NewLine();
}

float RadioWidth(const char* label) {
  const ImGuiStyle& style = ImGui::GetStyle();
  return ImGui::GetFrameHeight() + style.ItemInnerSpacing.x + ImGui::CalcTextSize(label, nullptr, true).x;
}

float ButtonWidth(const char* label) {
  return ImGui::CalcTextSize(label, nullptr, true).x + 2.0f * ImGui::GetStyle().FramePadding.x;
}

void SideTooltip(const std::string& text) {
  if (!ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled) || text.empty()) return;
  const ImGuiWindow* window = ImGui::GetCurrentContext()->CurrentWindow;
  const float wrap = ImGui::GetFontSize() * 30.0f;
  const float display_w = ImGui::GetIO().DisplaySize.x;
  // Beside the window, or inside the display's right edge when the window is near it.
  const float x = std::min(window->Pos.x + window->Size.x + 4.0f, display_w - wrap - 2.0f * ImGui::GetStyle().WindowPadding.x);
  ImGui::SetNextWindowPos(ImVec2(std::max(0.0f, x), ImGui::GetItemRectMin().y));
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(wrap);
  ImGui::TextUnformatted(text.c_str(), text.c_str() + text.size());
  ImGui::PopTextWrapPos();
  ImGui::EndTooltip();
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

// Sliders always clamp: a value typed after Ctrl+click stays in the slider's range, as dragging does.
bool SliderInt(const char* label, int* value, int min, int max, const char* format) {
  const float width = ImGui::CalcItemWidth();  // before the widget uses up SetNextItemWidth
  const bool changed = ImGui::SliderInt(label, value, min, max, format, ImGuiSliderFlags_AlwaysClamp);
  Record(label, WidgetKind::Slider, width);
  return changed;
}

bool SliderFloat(const char* label, float* value, float min, float max, const char* format, ImGuiSliderFlags flags) {
  const float width = ImGui::CalcItemWidth();
  const bool changed = ImGui::SliderFloat(label, value, min, max, format, flags | ImGuiSliderFlags_AlwaysClamp);
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

namespace {

// The label's visible part drawn before the field; the field's own label is "##" and its ID part.
std::string FieldBeforeLabel(const char* label, float width) {
  const std::string visible = VisiblePart(label);
  const std::string full = label;
  const auto hashes = full.find("##");
  ImGui::AlignTextToFramePadding();
  DrawText(visible, false);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(width);
  return hashes == std::string::npos ? "##" + full : full.substr(hashes);
}

}  // namespace

bool LabelledInputInt(const char* label, int* value, float width) {
  const std::string id = FieldBeforeLabel(label, width);
  const bool changed = ImGui::InputInt(id.c_str(), value, 0);
  Record(VisiblePart(label), id.c_str(), WidgetKind::Input, width);
  RecordValue(std::to_string(*value));
  return changed;
}

bool LabelledInputDouble(const char* label, double* value, const char* format, float width) {
  const std::string id = FieldBeforeLabel(label, width);
  const bool changed = ImGui::InputDouble(id.c_str(), value, 0.0, 0.0, format);
  Record(VisiblePart(label), id.c_str(), WidgetKind::Input, width);
  char shown[64];
  std::snprintf(shown, sizeof shown, format, *value);
  RecordValue(shown);
  return changed;
}

bool LabelledInputText(const char* label, std::string* text) {
  const std::string full = label;
  const auto hashes = full.find("##");
  const std::string id = hashes == std::string::npos ? "##" + full : full.substr(hashes);
  DrawText(VisiblePart(label), false);
  const float width = ImGui::GetContentRegionAvail().x;
  ImGui::SetNextItemWidth(width);
  const bool changed = ImGui::InputText(id.c_str(), text);
  Record(VisiblePart(label), id.c_str(), WidgetKind::Input, width);
  RecordValue(*text);
  return changed;
}

void Plot(const std::string& title, const std::vector<float>& values, bool bars, const PlotAxes& axes,
          float width, float height) {
  if (!title.empty()) DrawText(title, true);
  char hi_text[32], lo_text[32];
  std::snprintf(hi_text, sizeof hi_text, axes.y_format, static_cast<double>(axes.hi));
  std::snprintf(lo_text, sizeof lo_text, axes.y_format, static_cast<double>(axes.lo));
  const float text_h = ImGui::GetTextLineHeight();
  const float margin = std::max(ImGui::CalcTextSize(hi_text).x, ImGui::CalcTextSize(lo_text).x) + 4.0f;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  width = std::max(width, margin + 16.0f);
  ImGui::Dummy(ImVec2(width, height + text_h + 2.0f));
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text), muted = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const ImU32 fill = ImGui::GetColorU32(ImGuiCol_PlotHistogram), line = ImGui::GetColorU32(ImGuiCol_PlotLines);
  const ImVec2 a(origin.x + margin, origin.y), b(origin.x + width, origin.y + height);  // the plot area
  draw->AddRectFilled(a, b, ImGui::GetColorU32(ImGuiCol_FrameBg));
  draw->AddText(ImVec2(origin.x + margin - 4.0f - ImGui::CalcTextSize(hi_text).x, a.y), muted, hi_text);
  draw->AddText(ImVec2(origin.x + margin - 4.0f - ImGui::CalcTextSize(lo_text).x, b.y - text_h), muted, lo_text);
  const float range = axes.hi > axes.lo ? axes.hi - axes.lo : 1.0f;
  auto y_of = [&](float v) { return b.y - (b.y - a.y) * std::clamp((v - axes.lo) / range, 0.0f, 1.0f); };
  const size_t n = values.size();
  if (bars && n > 0) {
    const float slot = (b.x - a.x) / static_cast<float>(n), gap = std::min(4.0f, 0.2f * slot);
    for (size_t i = 0; i < n; ++i) {
      const float x0 = a.x + slot * static_cast<float>(i) + gap * 0.5f;
      draw->AddRectFilled(ImVec2(x0, y_of(values[i])), ImVec2(x0 + slot - gap, b.y), fill);
    }
  } else if (n == 1) {
    draw->AddCircleFilled(ImVec2(0.5f * (a.x + b.x), y_of(values[0])), 2.5f, line);
  } else if (n > 1) {
    std::vector<ImVec2> points(n);
    for (size_t i = 0; i < n; ++i)
      points[i] = ImVec2(a.x + (b.x - a.x) * static_cast<float>(i) / static_cast<float>(n - 1), y_of(values[i]));
    draw->AddPolyline(points.data(), static_cast<int>(n), line, 0, 1.5f);
  }
  // The first and last x under the plot area's two ends.
  draw->AddText(ImVec2(a.x, b.y + 2.0f), text, axes.x_first.c_str());
  const float last_w = ImGui::CalcTextSize(axes.x_last.c_str()).x;
  if (b.x - last_w > a.x + ImGui::CalcTextSize(axes.x_first.c_str()).x + 8.0f)
    draw->AddText(ImVec2(b.x - last_w, b.y + 2.0f), text, axes.x_last.c_str());
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

bool MenuItemChecked(const char* label, bool checked, bool enabled) {
  const bool pressed = ImGui::MenuItem(label, nullptr, checked, enabled);
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
