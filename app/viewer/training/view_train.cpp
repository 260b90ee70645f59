// The Train window: data and recipe fields, start / pause / resume / stop / save / open,
// loss and accuracy curves, the probe image's per-head maps and the per-head statistics over
// training. It reads app.train.view (a snapshot refreshed by poll_training) and calls the actions
// in train_panel.hpp; training itself runs on the session's worker thread. Its fields and buttons
// record themselves (widgets.hpp), so --dump-widgets lists them for a real-input test.
// Index:
//   [SECTION] Pieces: fields, buttons, curves, probe maps, statistics
//   [SECTION] DrawTrainView
#include <algorithm>
#include <cstdio>

#include <imgui.h>
#include <imgui_stdlib.h>

#include "training/train_panel.hpp"
#include "views/views.hpp"
#include "views/widgets.hpp"
#include "core/render/heatmap.hpp"
#include "core/train/mae_objective.hpp"

namespace vitlens::viewer {

namespace {

// [SECTION] Pieces: fields, buttons, curves, probe maps, statistics

// A number field with its label before it, on this line when the pair fits, else on the next.
constexpr float kFieldWidth = 64.0f;

float FieldPairWidth(const char* label) {
  return ImGui::CalcTextSize(label, nullptr, true).x + ImGui::GetStyle().ItemSpacing.x + kFieldWidth;
}

void IntField(const char* label, int* value, bool first) {
  if (!first) gui::SameLineIfFits(FieldPairWidth(label) + ImGui::GetStyle().ItemSpacing.x);
  gui::LabelledInputInt(label, value, kFieldWidth);
}

void DoubleField(const char* label, double* value, const char* format, bool first) {
  if (!first) gui::SameLineIfFits(FieldPairWidth(label) + ImGui::GetStyle().ItemSpacing.x);
  gui::LabelledInputDouble(label, value, format, kFieldWidth);
}

void DrawSettings(TrainSettings& s, bool editable) {
  if (!editable) ImGui::BeginDisabled();
  gui::LabelledInputText("data (fashion-mnist, folder, photos[:DIR])##train_data", &s.data);
  const bool mae = is_photo_data(s.data);
  IntField("limit##train_limit", &s.limit, true);
  IntField("epochs##train_epochs", &s.epochs, false);
  IntField("batch##train_batch", &s.batch, false);
  IntField("depth##train_depth", &s.depth, false);
  IntField("dim##train_dim", &s.embed_dim, false);
  IntField("heads##train_heads", &s.heads, false);
  IntField("patch##train_patch", &s.patch, false);
  DoubleField("lr##train_lr", &s.lr, "%.5f", false);
  DoubleField("warmup##train_warmup", &s.warmup, "%.2f", false);
  IntField("probe every##train_probe", &s.probe_every, false);
  if (mae) {  // masked patch prediction: the decoder and the crops, as `vitlens train --data photos`
    DoubleField("mask ratio##train_mask_ratio", &s.mask_ratio, "%.2f", true);
    IntField("crops/photo##train_crops", &s.crops_per_photo, false);
    IntField("img size##train_img_size", &s.img_size, false);
    IntField("decoder dim##train_decoder_dim", &s.decoder_dim, false);
    IntField("decoder depth##train_decoder_depth", &s.decoder_depth, false);
    IntField("decoder heads##train_decoder_heads", &s.decoder_heads, false);
  }
  if (mae) gui::Checkbox("flip crops##train_flip_crops", &s.flip_crops);
  else gui::Checkbox("augment##train_augment", &s.augment);
  if (!editable) ImGui::EndDisabled();
}

void DrawButtons(App& app) {
  TrainPanel& t = app.train;
  const TrainState state = t.view.state;
  const bool busy = state == TrainState::Loading || state == TrainState::Running || state == TrainState::Paused;
  const bool have_model = t.view.parameters > 0;
  if (gui::Button(busy ? "Restart##train_start" : "Start##train_start")) start_training(app, t.settings);
  ImGui::SameLine();
  if (state == TrainState::Paused) {
    if (gui::Button("Resume##train_resume")) t.session.resume();
  } else {
    ImGui::BeginDisabled(state != TrainState::Running);
    if (gui::Button("Pause##train_pause")) t.session.pause();
    ImGui::EndDisabled();
  }
  ImGui::SameLine();
  ImGui::BeginDisabled(!busy);
  if (gui::Button("Stop##train_stop")) t.session.stop();
  ImGui::EndDisabled();
  ImGui::SameLine();
  ImGui::BeginDisabled(!have_model);
  if (gui::Button("Save##train_save")) t.session.request_save(t.save_path);
  ImGui::SameLine();
  if (gui::Button("Open in main view##train_open")) open_training_model(app);
  ImGui::EndDisabled();
  ImGui::SetNextItemWidth(-1.0f);
  gui::InputText("##train_save_path", &t.save_path);
}

void DrawStatus(const TrainPanel& t) {
  const TrainSnapshot& v = t.view;
  if (!t.start_error.empty()) gui::TextColored(ImVec4(1.0f, 0.45f, 0.45f, 1.0f), "%s", t.start_error.c_str());
  if (v.state == TrainState::Failed) {
    gui::TextColored(ImVec4(1.0f, 0.45f, 0.45f, 1.0f), "Training failed: %s", v.error.c_str());
    return;
  }
  if (v.state == TrainState::Idle) {
    gui::TextWrappedDisabled("No run yet: choose the data and the recipe above, then Start.");
    return;
  }
  if (v.epochs > 0)
    gui::TextWrapped("%s: step %lld of %lld, epoch %d of %d, %.1f s", train_state_name(v.state),
                     static_cast<long long>(v.step), static_cast<long long>(v.total_steps), std::min(v.epoch + 1, v.epochs),
                     v.epochs, v.seconds);
  else
    gui::TextWrapped("%s: step %lld, %.1f s", train_state_name(v.state), static_cast<long long>(v.step), v.seconds);
  if (v.total_steps > 0)
    ImGui::ProgressBar(static_cast<float>(v.step) / static_cast<float>(v.total_steps), ImVec2(-1.0f, 0.0f));
  if (!v.message.empty()) gui::TextWrappedDisabled("%s", v.message.c_str());
}

// A curve over the window's (or column's) width: its name and last value above, its range on the
// y axis, the first and last point under it. Values are per step, or per evaluation.
void DrawCurve(const std::string& what, const std::vector<float>& values, float height) {
  if (values.empty()) {
    gui::TextWrappedDisabled("%s: no points yet", what.c_str());
    return;
  }
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  char title[160];
  std::snprintf(title, sizeof title, "%s: %.4g", what.c_str(), static_cast<double>(values.back()));
  gui::PlotAxes axes;
  axes.lo = *lo;
  axes.hi = *hi;
  axes.y_format = "%.3g";
  axes.x_first = "1";
  axes.x_last = std::to_string(values.size());
  gui::Plot(title, values, false, axes, std::max(40.0f, ImGui::GetContentRegionAvail().x), height);
}

// The probe image and each head's received-attention map, as small grids of coloured cells.
void DrawProbe(const TrainSnapshot& v) {
  const ProbeMaps& p = v.probe;
  if (p.step < 0) {
    gui::TextWrappedDisabled("probe: waiting for the first maps");
    return;
  }
  if (p.label >= 0)
    gui::TextWrapped("probe (%s, class %d): attention received, layer %d, after step %lld", p.what.c_str(), p.label, p.layer,
                static_cast<long long>(p.step));
  else
    gui::TextWrapped("probe (%s): attention received, layer %d, after step %lld", p.what.c_str(), p.layer,
                static_cast<long long>(p.step));
  ImDrawList* draw = ImGui::GetWindowDrawList();
  // The image itself, one rectangle per pixel (probe images are small: 28 x 28 for Fashion-MNIST),
  // about 96 screen pixels high; each head's map beside it at the same size.
  const float pixel = std::max(1.0f, 96.0f / std::max(1, p.image_h));
  ImVec2 origin = ImGui::GetCursorScreenPos();
  for (int y = 0; y < p.image_h; ++y)
    for (int x = 0; x < p.image_w; ++x) {
      const float* rgb = &p.image_rgb[(static_cast<size_t>(y) * p.image_w + x) * 3];
      const ImU32 colour = ImGui::GetColorU32(ImVec4(rgb[0], rgb[1], rgb[2], 1.0f));
      draw->AddRectFilled(ImVec2(origin.x + x * pixel, origin.y + y * pixel),
                          ImVec2(origin.x + (x + 1) * pixel, origin.y + (y + 1) * pixel), colour);
    }
  ImGui::Dummy(ImVec2(p.image_w * pixel, p.image_h * pixel));
  for (size_t h = 0; h < p.heads.size(); ++h) {
    ImGui::SameLine();
    const MatRM& m = p.heads[h];
    const float top = std::max(m.maxCoeff(), 1e-12f);  // each head on its own scale, as "normalize head"
    cv::Mat unit(static_cast<int>(m.rows()), static_cast<int>(m.cols()), CV_32F);
    for (int r = 0; r < unit.rows; ++r)
      for (int c = 0; c < unit.cols; ++c) unit.at<float>(r, c) = m(r, c) / top;
    const cv::Mat rgb8 = apply_colormap(unit, "viridis");
    origin = ImGui::GetCursorScreenPos();
    const float side = p.image_h * pixel / std::max(1, p.grid_h);
    for (int r = 0; r < rgb8.rows; ++r)
      for (int c = 0; c < rgb8.cols; ++c) {
        const cv::Vec3b px = rgb8.at<cv::Vec3b>(r, c);
        draw->AddRectFilled(ImVec2(origin.x + c * side, origin.y + r * side),
                            ImVec2(origin.x + (c + 1) * side, origin.y + (r + 1) * side), IM_COL32(px[0], px[1], px[2], 255));
      }
    ImGui::Dummy(ImVec2(rgb8.cols * side, rgb8.rows * side));
  }
}

void DrawHeadStatistics(const TrainSnapshot& v) {
  if (v.stat_steps.empty()) return;
  gui::TextWrapped("per head over training (one point per probe refresh, last layer; steps %lld to %lld)",
              static_cast<long long>(v.stat_steps.front()), static_cast<long long>(v.stat_steps.back()));
  if (!ImGui::BeginTable("##train_head_stats", 3, ImGuiTableFlags_SizingStretchSame)) return;
  for (size_t h = 0; h < v.entropy.size(); ++h) {
    ImGui::PushID(static_cast<int>(h));
    char label[64];
    ImGui::TableNextColumn();
    std::snprintf(label, sizeof label, "head %zu entropy (nats)", h);
    DrawCurve(label, v.entropy[h], 40.0f);
    ImGui::TableNextColumn();
    std::snprintf(label, sizeof label, "head %zu distance (px)", h);
    DrawCurve(label, v.distance[h], 40.0f);
    ImGui::TableNextColumn();
    // The role with the largest lift now, and its curve.
    int best = 0;
    for (int r = 1; r < kHeadRoles; ++r)
      if (v.roles[h][r].back() > v.roles[h][best].back()) best = r;
    std::snprintf(label, sizeof label, "head %zu %s lift", h, head_role_name(best));
    DrawCurve(label, v.roles[h][best], 40.0f);
    gui::TextWrappedDisabled("%s %.2f  %s %.2f  %s %.2f  %s %.2f", head_role_name(0), v.roles[h][0].back(), head_role_name(1),
                        v.roles[h][1].back(), head_role_name(2), v.roles[h][2].back(), head_role_name(3),
                        v.roles[h][3].back());
    ImGui::PopID();
  }
  ImGui::EndTable();
}

}  // namespace

// [SECTION] DrawTrainView

void DrawTrainView(App& app) {
  if (!app.ui.show_train) return;
  PlaceWindow(app, "Train", WindowSlot::Train);
  if (!ImGui::Begin("Train", &app.ui.show_train)) {
    ImGui::End();
    return;
  }
  TrainPanel& t = app.train;
  const TrainSnapshot& v = t.view;
  const bool busy = v.state == TrainState::Loading || v.state == TrainState::Running || v.state == TrainState::Paused;
  DrawSettings(t.settings, !busy);
  DrawButtons(app);
  DrawStatus(t);
  ImGui::Separator();
  const std::string eval = v.eval_name.empty() ? std::string("validation") : v.eval_name;
  if (v.mae) {  // masked patch prediction has a reconstruction loss and nothing to be accurate about
    DrawCurve("train MAE loss", v.loss, 60.0f);
    DrawCurve(eval + " MAE loss", v.eval_loss, 50.0f);
    gui::TextDisabled("no accuracy for MAE (masked patch prediction has no labels)");
  } else {
    DrawCurve("train loss", v.loss, 60.0f);
    DrawCurve("train accuracy", v.accuracy, 60.0f);
    DrawCurve(eval + " loss", v.eval_loss, 50.0f);
    DrawCurve(eval + " accuracy", v.eval_accuracy, 50.0f);
  }
  ImGui::Separator();
  DrawProbe(v);
  DrawHeadStatistics(v);
  ImGui::End();
}

}  // namespace vitlens::viewer
