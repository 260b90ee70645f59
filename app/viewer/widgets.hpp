#pragma once
// Dear ImGui widgets that record themselves: each wrapper calls the ImGui widget of the same name,
// then notes its label, ID, window, section and rectangle in this frame's widget list
// (app_state.hpp, WidgetFrame). The script's `click` / `drag` and `vitlens view --dump-widgets`
// read that list, so a test presses the widget a user sees, through the real input path.
//
// IDs: a widget's ID is its label hashed under the window's ID stack. Widgets under a collapsing
// header open a Section, which pushes the header's name onto that stack, so equal labels in two
// sections (the mask's "none", the softmax scale's "none") are different widgets, and a header
// never shares its ID with a widget under it. Two widgets with one ID in one frame are recorded
// as a clash (a test fails on any).
#include <string>

#include <imgui.h>

#include "app_state.hpp"

namespace vitlens::viewer::gui {

// The list filled during a frame: BeginFrame empties it, EndFrame returns it (with the drop
// target, the whole window, appended).
void BeginFrame();
WidgetFrame EndFrame(float display_w, float display_h);

// An ID scope (PushID) named after a collapsing header, for the widgets drawn inside it.
class Section {
 public:
  explicit Section(const char* name);
  ~Section();
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;
};

bool Button(const char* label);
bool SmallButton(const char* label);
bool Checkbox(const char* label, bool* value);
bool RadioButton(const char* label, bool active);
bool SliderInt(const char* label, int* value, int min, int max, const char* format = "%d");
bool SliderFloat(const char* label, float* value, float min, float max, const char* format, ImGuiSliderFlags flags = 0);
bool InputText(const char* label, std::string* text, ImGuiInputTextFlags flags = 0);
bool InputFloat2(const char* label, float value[2], const char* format);
// Number fields without +/- buttons (step 0), as the Train window's recipe fields.
bool InputInt(const char* label, int* value);
bool InputDouble(const char* label, double* value, const char* format);
bool CollapsingHeader(const char* label, ImGuiTreeNodeFlags flags = 0);
bool TreeNode(const char* label);
// An invisible button that takes the mouse over a picture.
bool Picture(const char* label, const ImVec2& size, ImGuiButtonFlags flags);
// A selectable whose text is drawn as given (a file name may hold "##"); its ID is the current
// ID scope plus `id`, so callers push a unique scope (the entry's index).
bool SelectableText(const std::string& text, bool selected, ImGuiSelectableFlags flags);
bool Selectable(const char* label, bool selected);

// Menus and combos: while open, what is drawn inside is recorded under their label.
bool BeginMenu(const char* label, bool enabled = true);
void EndMenu();
bool MenuItem(const char* label, bool enabled = true);
bool MenuItemToggle(const char* label, bool* selected);
bool BeginCombo(const char* label, const char* preview);
void EndCombo();

}  // namespace vitlens::viewer::gui
