#pragma once
// One view per panel, each with one public draw entry. A view reads the document and the derived
// pictures and numbers, edits UiState and sends Requests through the controller's actions; it
// never computes attention itself.
//
//   view_menu.cpp       main menu bar and the status bar (messages, progress)
//   view_image.cpp      the image: patch grid, hover (row, col, pixel), pin, paint
//   view_heads.cpp      one map per head plus the mean, colour bars, kept share; one head opened
//                       large; the rollout map in rollout mode
//   view_layers.cpp     the layers x heads grid: every head of every layer, click opens one
//   view_controls.cpp   working size, mode, layer, display, masks, softmax scale, export
//   view_inspector.cpp  the pinned query against the hovered key, step by step
//   view_stats.cpp      entropy and mean attention distance per head, timings, descriptions
//   view_example.cpp    the seed's worked example with editable Q, K, V
//   view_browser.cpp    the in-app file browser (open image / model, export folder, screenshot)
//   view_picture.cpp    the picture widget the image and heads views share; the default layout
// Every interactive widget is drawn through widgets.hpp (gui::Button, ...), which records its
// label, ID and rectangle for the script's `click` and --dump-widgets; a collapsing header's
// widgets sit in its gui::Section, so IDs never repeat within a window.
#include <string>

#include "control/controller.hpp"
#include "views/textures.hpp"

struct ImVec2;

namespace vitlens::viewer {

void DrawMainMenu(App& app);
void DrawStatusBar(App& app);
void DrawImageView(App& app, const ViewTextures& textures);
void DrawHeadsView(App& app, const ViewTextures& textures);
void DrawLayersView(App& app, const ViewTextures& textures);
void DrawControlsView(App& app);
void DrawInspectorView(App& app);
void DrawStatsView(App& app);
void DrawWorkedExampleView(App& app);
void DrawFileBrowser(App& app);
void DrawTrainView(App& app);  // view_train.cpp: the Train window

// [SECTION] Shared by the image and heads views

// Draws `texture` at `size` with the patch grid, the pinned query, the hovered patch and the
// painted mask over it; hovering sets the hovered patch, a click pins the query, a drag paints
// when the painted mask is selected. Records its rectangle in ui.layout under `name`.
// `mark_query`: outline the pinned query (the heads' pictures carry core's own marker).
void DrawPicture(App& app, const char* name, const Texture& texture, float width, float height, bool mark_query);

// The largest size with the image's aspect ratio that fits in (max_w, max_h).
void FitPicture(const App& app, float max_w, float max_h, float& width, float& height);

// The status bar's height (view_menu.cpp), which the layout leaves free at the bottom.
float StatusBarHeight();

// Where each window goes in the default layout (view_picture.cpp).
enum class WindowSlot { Controls, Image, Inspector, Heads, Stats, Train };
Rect WindowSlotRect(WindowSlot slot, float display_w, float display_h);
// Places the next window `name` in its slot on first use and after a resize or a layout reset.
void PlaceWindow(App& app, const char* name, WindowSlot slot);

}  // namespace vitlens::viewer
