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
//
// Text goes through gui::Text and its kin, which note the text, its width and the width it had
// room for, so a test finds any text the window cuts off (WidgetFrame::texts). EndFrame also notes
// every window's rectangle, visible area and scroll range (WidgetFrame::windows), so a test checks
// that no two windows overlap and every widget is inside its window or scrolled to.
#include <string>
#include <vector>

#include <imgui.h>

#include "control/app_state.hpp"

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

// Text that records itself. Wrapped text breaks at the window's (or the column's) right edge.
void Text(const char* fmt, ...) IM_FMTARGS(1);
void TextDisabled(const char* fmt, ...) IM_FMTARGS(1);
void TextColored(const ImVec4& colour, const char* fmt, ...) IM_FMTARGS(2);
void TextWrapped(const char* fmt, ...) IM_FMTARGS(1);
void TextWrappedDisabled(const char* fmt, ...) IM_FMTARGS(1);
void TextUnformatted(const std::string& text);
// A "(?)" after the last item, with `text` as its tooltip.
void HelpMarker(const char* text);
// SameLine when an item `width` pixels wide still fits on this line, else a new line: rows of
// radio buttons and fields flow onto as many lines as the window's width needs.
void SameLineIfFits(float width);
float RadioWidth(const char* label);   // a radio button or checkbox with this label
float ButtonWidth(const char* label);
// The tooltip of the item just drawn, placed to the right of its window (a menu's entry: the
// tooltip never covers the entries below it).
void SideTooltip(const std::string& text);

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
// The same fields with their label before them ("limit [ 24 ]"), `width` pixels wide; the label's
// visible part names the field in the widget list, as for the fields above.
bool LabelledInputInt(const char* label, int* value, float width);
bool LabelledInputDouble(const char* label, double* value, const char* format, float width);
// A text field under its label (the label on its own line, the field the window's width).
bool LabelledInputText(const char* label, std::string* text);

// A small chart `width` x `height` with its y range written on its axis (`lo` at the bottom,
// `hi` at the top, as `y_format`) and its first and last x under it: bars (one per value) or a
// line. The title goes on the line above (wrapped), never over the bars.
struct PlotAxes {
  float lo = 0.0f, hi = 1.0f;
  const char* y_format = "%.3g";
  std::string x_first, x_last;
};
void Plot(const std::string& title, const std::vector<float>& values, bool bars, const PlotAxes& axes,
          float width, float height);
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
bool MenuItemChecked(const char* label, bool checked, bool enabled);
bool MenuItemToggle(const char* label, bool* selected);
bool BeginCombo(const char* label, const char* preview);
void EndCombo();

}  // namespace vitlens::viewer::gui
