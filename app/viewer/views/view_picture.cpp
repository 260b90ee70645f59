// The picture widget shared by the image view and every head panel, and the windows' default layout.
#include <algorithm>
#include <cmath>

#include <imgui.h>
#include <imgui_internal.h>  // FindWindowByName: where a window is before Begin

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

// The default layout: Controls down the left; the image over the Inspector in the middle; the
// heads over their statistics on the right. The columns and rows touch and never overlap, so
// every window shows whole at any display size; on-demand windows take a slot and sit on top.
Rect WindowSlotRect(WindowSlot slot, float display_w, float display_h) {
  const float top = ImGui::GetFrameHeight();             // below the main menu bar
  const float bottom = StatusBarHeight();
  const float usable = std::floor(display_h - top - bottom);
  // Controls: wide enough for its rows of radio buttons (font-relative), at most a quarter.
  const float font = ImGui::GetFontSize();
  const float controls_w = std::floor(std::clamp(0.24f * display_w, 23.0f * font, 31.0f * font));
  const float rest = display_w - controls_w;
  const float middle_w = std::floor(0.42f * rest), right_w = rest - middle_w;
  const float image_h = std::floor(0.58f * usable), heads_h = std::floor(0.64f * usable);
  const float middle_x = controls_w, right_x = controls_w + middle_w;
  switch (slot) {
    case WindowSlot::Controls: return Rect{0.0f, top, controls_w, usable};
    case WindowSlot::Image: return Rect{middle_x, top, middle_w, image_h};
    case WindowSlot::Inspector: return Rect{middle_x, top + image_h, middle_w, usable - image_h};
    case WindowSlot::Heads: return Rect{right_x, top, right_w, heads_h};
    case WindowSlot::Stats: return Rect{right_x, top + heads_h, right_w, usable - heads_h};
    case WindowSlot::Train: return Rect{middle_x, top, rest, usable};
  }
  return Rect{};
}

void PlaceWindow(App& app, const char* name, WindowSlot slot) {
  LayoutState& layout = app.ui.layout_windows;
  // Placed once per layout: on first use (an imgui.ini may remember where the user put it), and
  // again after the display was resized or the layout reset.
  int& placed = layout.placed[name];
  const ImGuiCond cond = layout.generation > 0 && placed != layout.generation ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  placed = layout.generation;
  const ImVec2 display = ImGui::GetIO().DisplaySize;
  const Rect r = WindowSlotRect(slot, display.x, display.y);
  ImGui::SetNextWindowPos(ImVec2(r.x, r.y), cond);
  ImGui::SetNextWindowSize(ImVec2(r.w, r.h), cond);
  // Never over the main menu bar (a title bar dragged to the top, or an imgui.ini remembering it
  // there, would hide File and View > Reset layout): moved down to just below it.
  const float menu_bottom = ImGui::GetFrameHeight();
  if (cond != ImGuiCond_Always)
    if (const ImGuiWindow* window = ImGui::FindWindowByName(name); window && window->Pos.y < menu_bottom)
      ImGui::SetNextWindowPos(ImVec2(window->Pos.x, menu_bottom), ImGuiCond_Always);
}

void FitPicture(const App& app, float max_w, float max_h, float& width, float& height) {
  width = height = 0.0f;
  if (!app.doc.ready()) return;
  const auto& img = app.doc.comp->image;
  const float aspect = static_cast<float>(img.padded_h) / static_cast<float>(std::max(1, img.padded_w));
  width = std::max(16.0f, max_w);
  height = width * aspect;
  if (height > max_h && max_h > 16.0f) {
    height = max_h;
    width = height / aspect;
  }
  width = std::floor(width);
  height = std::floor(height);
}

namespace {

ImVec2 CellMin(ImVec2 origin, float cw, float ch, int row, int col) {
  return ImVec2(origin.x + col * cw, origin.y + row * ch);
}

}  // namespace

void DrawPicture(App& app, const char* name, const Texture& texture, float width, float height, bool mark_query) {
  ImGuiIO& io = ImGui::GetIO();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  gui::Picture(name, ImVec2(width, height), ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImVec2 end(origin.x + width, origin.y + height);
  if (texture.id != 0) draw->AddImage(texture.imgui_id(), origin, end);
  app.ui.layout[name] = Rect{origin.x * io.DisplayFramebufferScale.x, origin.y * io.DisplayFramebufferScale.y,
                             width * io.DisplayFramebufferScale.x, height * io.DisplayFramebufferScale.y};
  if (!app.doc.ready()) return;

  const int rows = grid_rows(app), cols = grid_cols(app);
  const float cw = width / static_cast<float>(cols), ch = height / static_cast<float>(rows);
  const auto& image = app.doc.comp->image;

  // Padding patches (made-up pixels past the image's right and bottom edges), hatched.
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      if (image.grid.patch_is_padding[static_cast<size_t>(r * cols + c)]) {
        const ImVec2 a = CellMin(origin, cw, ch, r, c);
        draw->AddLine(a, ImVec2(a.x + cw, a.y + ch), IM_COL32(120, 120, 120, 90));
      }
  // Painted mask: forbidden keys in red.
  const auto& painted = app.ui.compute.painted;
  if (app.ui.compute.mask == MaskMode::Painted && painted.size() == static_cast<size_t>(rows * cols))
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        if (painted[static_cast<size_t>(r * cols + c)]) {
          const ImVec2 a = CellMin(origin, cw, ch, r, c);
          draw->AddRectFilled(a, ImVec2(a.x + cw, a.y + ch), IM_COL32(230, 40, 40, 120));
        }
  // Patch grid, only when its lines are far enough apart to read.
  if (app.ui.display.show_grid && cw >= 4.0f && ch >= 4.0f) {
    const ImU32 line = IM_COL32(255, 255, 255, 60);
    for (int c = 1; c < cols; ++c) draw->AddLine(ImVec2(origin.x + c * cw, origin.y), ImVec2(origin.x + c * cw, end.y), line);
    for (int r = 1; r < rows; ++r) draw->AddLine(ImVec2(origin.x, origin.y + r * ch), ImVec2(end.x, origin.y + r * ch), line);
  }
  // The pinned query (white with a dark edge so it shows on any colour) and the inspected key.
  const ViewChoice& v = app.ui.view;
  const bool prefix_query = v.query_prefix >= 0 && v.query_prefix < app.doc.comp->forward.prefix;  // no patch to box
  if (mark_query && v.mode == MapMode::Query && v.query_row >= 0 && !prefix_query) {
    const ImVec2 a = CellMin(origin, cw, ch, v.query_row, v.query_col);
    const float pad = std::max(1.0f, std::min(cw, ch) * 0.15f);
    draw->AddRect(ImVec2(a.x - pad, a.y - pad), ImVec2(a.x + cw + pad, a.y + ch + pad), IM_COL32(0, 0, 0, 255), 0.0f, 0, 3.0f);
    draw->AddRect(ImVec2(a.x - pad, a.y - pad), ImVec2(a.x + cw + pad, a.y + ch + pad), IM_COL32(255, 255, 255, 255), 0.0f, 0, 1.5f);
  }
  if (v.key_row >= 0 && v.key_row < rows && v.key_col < cols) {
    const ImVec2 a = CellMin(origin, cw, ch, v.key_row, v.key_col);
    draw->AddRect(a, ImVec2(a.x + cw, a.y + ch), IM_COL32(255, 220, 0, 220), 0.0f, 0, 1.0f);
  }

  // Mouse: hover picks the inspected key; left click pins the query (or paints), right erases.
  int row = 0, col = 0, px = 0, py = 0;
  if (hovered && patch_under(app, Rect{origin.x, origin.y, width, height}, io.MousePos.x, io.MousePos.y, row, col, px, py)) {
    set_hover(app, row, col);
    ImGui::SetTooltip("patch (%d, %d)  pixel (%d, %d)%s", row, col, px, py,
                      image.grid.patch_is_padding[static_cast<size_t>(row * cols + col)] ? "  padding" : "");
    const bool painting = app.ui.compute.mask == MaskMode::Painted && app.ui.compute.brush != Brush::Off;
    if (painting && ImGui::IsMouseDown(ImGuiMouseButton_Left)) {
      paint_patch(app, row, col, app.ui.compute.brush == Brush::Paint);
    } else if (painting && ImGui::IsMouseDown(ImGuiMouseButton_Right)) {
      paint_patch(app, row, col, false);
    } else if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) {
      pin_query(app, row, col);
    }
  }
}

}  // namespace vitlens::viewer
