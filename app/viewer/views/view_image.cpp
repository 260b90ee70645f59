// The image view: the processed image the model sees, with the patch grid, the pinned query and
// the patch under the cursor.
#include <imgui.h>

#include "views/views.hpp"
#include "views/widgets.hpp"

namespace vitlens::viewer {

namespace {

void DrawImageHeader(const App& app) {
  const Computation& c = *app.doc.comp;
  const ViewChoice& v = app.ui.view;
  const int p = app.doc.model->model.config.patch_size;
  gui::TextWrapped("%s", app.doc.image->path.c_str());
  gui::TextWrappedDisabled("%dx%d -> %dx%d (%dx%d patches of %dx%d, %d tokens)%s", c.image.source_w, c.image.source_h,
                      c.image.padded_w, c.image.padded_h, c.forward.grid_h, c.forward.grid_w, p, p, c.forward.tokens,
                      c.key.preprocess == Preprocess::Model ? ", the model's transform" : c.image.resized ? ", resized" : "");
  if (v.hover_row >= 0)
    gui::TextWrapped("hover: patch (%d, %d), pixels %d..%d x %d..%d", v.hover_row, v.hover_col, v.hover_col * p,
                v.hover_col * p + p - 1, v.hover_row * p, v.hover_row * p + p - 1);
  else if (v.mode == MapMode::Query && v.query_prefix >= 0 && v.query_prefix < c.forward.prefix)
    gui::TextWrapped("query: the %s (not on the image); click a patch to pin it instead",
                token_name(app.doc.model->model.config, c.forward.grid_w, v.query_prefix).c_str());
  else if (v.mode == MapMode::Query)
    gui::TextWrapped("query: patch (%d, %d), pixel centre (%d, %d); click to pin, arrow keys move it", v.query_row, v.query_col,
                v.query_col * p + p / 2, v.query_row * p + p / 2);
  else
    gui::TextWrappedDisabled("click a patch to pin it as the query");
}

}  // namespace

void DrawImageView(App& app, const ViewTextures& textures) {
  if (!app.ui.show_image) return;
  PlaceWindow(app, "Image", WindowSlot::Image);
  if (!ImGui::Begin("Image", &app.ui.show_image)) {
    ImGui::End();
    return;
  }
  if (!app.doc.ready()) {
    gui::TextWrapped("%s", app.compute_job ? "Loading ..." : "No image. Open one with File > Open image, or drop a file here.");
    ImGui::End();
    return;
  }
  DrawImageHeader(app);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  float w = 0.0f, h = 0.0f;
  FitPicture(app, avail.x, avail.y, w, h);
  DrawPicture(app, "image", textures.base, w, h, true);
  ImGui::End();
}

}  // namespace vitlens::viewer
