// The script's verbs (script.hpp): one row each of {verb, usage, split, check, apply}. `check`
// runs when the script is parsed, before a window opens; `apply` runs the line through the same
// functions the mouse, keys and menus call (controller.hpp). The Train window's verbs come from
// training/train_panel.cpp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <utility>

#include "control/controller.hpp"
#include "control/controller_detail.hpp"
#include "core/base/enum_names.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/json_text.hpp"
#include "core/render/heatmap.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

namespace {

// [SECTION] Checks (the words alone, before any image is in)

bool check_path(const ScriptArgs& a, std::string&) { return a.size() == 1 && !a[0].empty(); }
bool check_none(const ScriptArgs& a, std::string& why) {
  why = "takes no arguments";
  return a.empty();
}
bool check_row_col(const ScriptArgs& a, std::string&) {
  int i = 0;
  return a.size() == 2 && parse_int_arg(a[0], i) && parse_int_arg(a[1], i);
}
bool check_export(const ScriptArgs& a, std::string&) { return a.size() == 1 || (a.size() == 2 && a[1] == "raw"); }
bool check_key(const ScriptArgs& a, std::string&) {
  return a.size() == 1 && one_of(a[0], {"left", "right", "up", "down", "escape", "enter", "tab"});
}
bool check_click(const ScriptArgs& a, std::string&) {
  if (a.size() == 1 && !a[0].empty()) return true;
  return a.size() == 3 && float_in(a[1], 0.0f, 1.0f) && float_in(a[2], 0.0f, 1.0f);
}
bool check_drag(const ScriptArgs& a, std::string&) { return a.size() == 2 && float_in(a[1], 0.0f, 1.0f); }
bool check_expect(const ScriptArgs& a, std::string&) { return a.size() == 2 && !a[0].empty(); }
bool check_mode(const ScriptArgs& a, std::string&) {
  return a.size() == 1 && one_of(a[0], {"query", "cls", "received", "pool", "rollout"});
}
bool check_layer(const ScriptArgs& a, std::string&) { return a.size() == 1 && int_in(a[0], 0, 1000000); }
bool check_token(const ScriptArgs& a, std::string&) {
  if (a.size() != 1) return false;
  const bool reg = a[0].size() > 3 && a[0].compare(0, 3, "reg") == 0 && int_in(a[0].substr(3), 0, 1000000);
  return one_of(a[0], {"patch", "cls", "dist"}) || reg;
}
bool check_head(const ScriptArgs& a, std::string&) { return a.size() == 1 && (a[0] == "all" || int_in(a[0], 0, 1000000)); }
bool check_rollout(const ScriptArgs& a, std::string&) {
  const size_t n = a.size();
  float f = 0.0f;
  int i = 0, j = 0;
  if (n == 1) return one_of(a[0], {"on", "off"});
  if (n == 2 && a[0] == "fusion") return one_of(a[1], {"mean", "max", "min"});
  if (n == 2 && a[0] == "from") return one_of(a[1], {"cls", "query"});
  if (n == 2 && a[0] == "discard") return parse_float_arg(a[1], f) && f >= 0.0f && f < 1.0f;
  return n == 3 && a[0] == "layers" && parse_int_arg(a[1], i) && parse_int_arg(a[2], j) && i >= 0 && j >= i;
}
bool check_colormap(const ScriptArgs& a, std::string& why) {
  if (a.size() == 1 && is_colormap(a[0])) return true;
  std::string known;
  for (const auto& name : colormap_names()) known += (known.empty() ? "" : ", ") + name;
  why = "expects: colormap NAME (" + known + ")";
  return false;
}
bool check_alpha(const ScriptArgs& a, std::string&) { return a.size() == 1 && float_in(a[0], 0.0f, 1.0f); }
bool check_normalize(const ScriptArgs& a, std::string&) {
  Normalize n;
  return a.size() == 1 && parse_normalize_name(a[0], n);
}
bool check_upsample(const ScriptArgs& a, std::string&) {
  Upsample u;
  return a.size() == 1 && parse_upsample(a[0], u);
}
bool check_threshold(const ScriptArgs& a, std::string&) {
  float f = 0.0f;
  return a.size() == 1 && (a[0] == "off" || (parse_float_arg(a[0], f) && f > 0.0f && f <= 1.0f));
}
bool check_on_off(const ScriptArgs& a, std::string&) { return a.size() == 1 && one_of(a[0], {"on", "off"}); }
bool check_mask(const ScriptArgs& a, std::string&) {
  MaskMode m;
  return a.size() == 1 && parse_mask_mode(a[0], m);
}
bool check_scale(const ScriptArgs& a, std::string&) {
  if (a.size() == 1) return one_of(a[0], {"default", "none"});
  return a.size() == 2 && a[0] == "temperature" && float_in(a[1], 0.05f, 20.0f);
}
bool check_preprocess(const ScriptArgs& a, std::string&) {
  Preprocess p;
  return a.size() == 1 && parse_preprocess(a[0], p);
}
bool check_precision(const ScriptArgs& a, std::string&) {
  Precision p;
  return a.size() == 1 && parse_precision(a[0], p);
}
bool check_size(const ScriptArgs& a, std::string&) {
  return a.size() == 1 && (a[0] == "default" || int_in(a[0], kMinWorkingSide, kMaxWorkingSide));
}
bool check_show(const ScriptArgs& a, std::string&) {
  return a.size() == 2 && one_of(a[0], {"image", "heads", "controls", "inspector", "stats", "example", "train", "layers"}) &&
         one_of(a[1], {"on", "off"});
}
bool check_example(const ScriptArgs& a, std::string&) {
  if (a.size() == 1) return a[0] == "reset";
  if (a.size() == 2) return a[0] == "scaled" && one_of(a[1], {"on", "off"});
  float f = 0.0f;
  return a.size() == 4 && one_of(a[0], {"q", "k", "v"}) && int_in(a[1], 0, a[0] == "q" ? 1 : 2) && int_in(a[2], 0, 1) &&
         parse_float_arg(a[3], f);
}
// `browse WHAT`: what the file browser opens for.
constexpr EnumName<BrowserPurpose> kBrowseNames[] = {{BrowserPurpose::OpenImage, "image"},
                                                     {BrowserPurpose::OpenModel, "model"},
                                                     {BrowserPurpose::ExportFolder, "export"},
                                                     {BrowserPurpose::ScreenshotFile, "screenshot"}};

bool check_browse(const ScriptArgs& a, std::string&) {
  BrowserPurpose purpose;
  return a.size() == 1 && parse_enum(kBrowseNames, a[0], purpose);
}
bool check_window(const ScriptArgs& a, std::string&) { return a.size() == 2 && int_in(a[0], 320, 8192) && int_in(a[1], 240, 8192); }
bool check_frames(const ScriptArgs& a, std::string&) { return a.size() == 1 && int_in(a[0], 1, 10000); }

// [SECTION] Runs (the checks above passed; what depends on the image is checked here)

int int_of(const std::string& token) {
  int v = 0;
  parse_int_arg(token, v);
  return v;
}

float float_of(const std::string& token) {
  float v = 0.0f;
  parse_float_arg(token, v);
  return v;
}

std::string need_image(const App& app) {
  if (app.doc.ready()) return "";
  return "no image is loaded (" + (app.ui.message.text.empty() ? "nothing opened" : app.ui.message.text) + ")";
}

std::string need_patch(const App& app, int row, int col) {
  if (auto e = need_image(app); !e.empty()) return e;
  if (detail::in_grid(app, row, col)) return "";
  return "patch (" + std::to_string(row) + ", " + std::to_string(col) + ") is outside the " + std::to_string(grid_rows(app)) +
         "x" + std::to_string(grid_cols(app)) + " patch grid";
}

std::string layers_problem(const App& app, int last) {
  if (last < model_layers(app)) return "";
  return "the model has " + std::to_string(model_layers(app)) + " layer(s)";
}

// Runs `action` on the patch (ROW, COL) of the arguments once it is on the grid.
template <typename Action>
std::string on_patch(App& app, const ScriptArgs& a, Action action) {
  const int row = int_of(a[0]), col = int_of(a[1]);
  if (auto e = need_patch(app, row, col); !e.empty()) return e;
  action(row, col);
  return "";
}

// open, model, screenshot: the path becomes the request (the window or worker acts on it).
template <std::string Requests::*Field>
std::string request_path(App& app, const ScriptArgs& a) {
  app.requests.*Field = a[0];
  return "";
}

std::string run_pin(App& app, const ScriptArgs& a) {
  return on_patch(app, a, [&](int r, int c) { pin_query(app, r, c); });
}
std::string run_hover(App& app, const ScriptArgs& a) {
  return on_patch(app, a, [&](int r, int c) { set_hover(app, r, c); });
}
std::string run_paint(App& app, const ScriptArgs& a) {
  return on_patch(app, a, [&](int r, int c) { paint_patch(app, r, c, true); });
}
std::string run_erase(App& app, const ScriptArgs& a) {
  return on_patch(app, a, [&](int r, int c) { paint_patch(app, r, c, false); });
}

InputStep input_step(InputStep::Type type, float x = 0.0f, float y = 0.0f) {
  InputStep step;
  step.type = type;
  step.x = x;
  step.y = y;
  return step;
}

// Press and release in one frame, through the window's key queue (the quickest tap).
std::string run_key(App& app, const ScriptArgs& a) {
  InputStep down = input_step(InputStep::Type::KeyDown);
  down.key = a[0];
  InputStep up = down;
  up.type = InputStep::Type::KeyUp;
  up.same_frame = true;
  app.input.push_back(down);
  app.input.push_back(up);
  return "";
}

// The enabled widget named by `spec`, or null with the reason in `error`.
const WidgetInfo* enabled_widget(const App& app, const std::string& spec, std::string& error) {
  const WidgetInfo* w = find_widget(app.ui.widgets, spec, error);
  if (w && !w->enabled) {
    error = "'" + spec + "' is disabled";
    return nullptr;
  }
  return w;
}

std::string run_click(App& app, const ScriptArgs& a) {
  std::string error;
  const WidgetInfo* w = enabled_widget(app, a[0], error);
  if (!w) return error;
  const float fx = a.size() == 3 ? float_of(a[1]) : 0.5f;  // where in the widget, as fractions of its size
  const float fy = a.size() == 3 ? float_of(a[2]) : 0.5f;
  app.input.push_back(input_step(InputStep::Type::MouseMove, w->frame.x + fx * w->frame.w, w->frame.y + fy * w->frame.h));
  app.input.push_back(input_step(InputStep::Type::MouseDown));
  app.input.push_back(input_step(InputStep::Type::MouseUp));
  return "";
}

// Press on the middle of the track, move to the fraction T of its width, release.
std::string run_drag(App& app, const ScriptArgs& a) {
  std::string error;
  const WidgetInfo* w = enabled_widget(app, a[0], error);
  if (!w) return error;
  const float t = std::clamp(float_of(a[1]), 0.0f, 1.0f);
  const float y = w->frame.y + 0.5f * w->frame.h;
  app.input.push_back(input_step(InputStep::Type::MouseMove, w->frame.x + 0.5f * w->frame.w, y));
  app.input.push_back(input_step(InputStep::Type::MouseDown));
  app.input.push_back(input_step(InputStep::Type::MouseMove, w->frame.x + t * (w->frame.w - 1.0f), y));
  app.input.push_back(input_step(InputStep::Type::Wait));
  app.input.push_back(input_step(InputStep::Type::MouseUp));
  return "";
}

std::string run_drop(App& app, const ScriptArgs& a) {
  InputStep step = input_step(InputStep::Type::Drop);
  step.path = a[0];
  app.input.push_back(step);
  return "";
}

// JSON text of the viewer's state: paths in it may be any bytes, shown with U+FFFD where they are
// not UTF-8 (a strict dump would throw).
std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string write_json(const std::string& path, const nlohmann::json& j) {
  try {
    write_file_atomic(path, json_text(j, 2) + "\n");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string run_widgets(App& app, const ScriptArgs& a) { return write_json(a[0], widgets_json(app.ui.widgets)); }
std::string run_state(App& app, const ScriptArgs& a) { return write_json(a[0], state_json(app)); }

// The state's value at KEY ("normalize", "show/heads"), or null with the reason in `error`.
const nlohmann::json* state_value(const nlohmann::json& state, const std::string& key, std::string& error) {
  const nlohmann::json::json_pointer pointer(key[0] == '/' ? key : "/" + key);
  if (state.contains(pointer)) return &state.at(pointer);
  error = "the state has no '" + key + "'";
  return nullptr;
}

std::string run_expect(App& app, const ScriptArgs& a) {
  const nlohmann::json state = state_json(app);
  std::string error;
  const nlohmann::json* got = state_value(state, a[0], error);
  if (!got) return error;
  nlohmann::json want = parse_json_or_discarded(a[1]);
  if (want.is_discarded()) want = a[1];  // a bare word is a string
  const bool same = got->is_number() && want.is_number()
                        ? std::fabs(got->get<double>() - want.get<double>()) <= 1e-6 * std::max(1.0, std::fabs(want.get<double>()))
                        : *got == want;
  return same ? "" : "expected '" + a[0] + "' to be " + json_text(want) + ", it is " + json_text(*got);
}

std::string run_expect_contains(App& app, const ScriptArgs& a) {
  const nlohmann::json state = state_json(app);
  std::string error;
  const nlohmann::json* got = state_value(state, a[0], error);
  if (!got) return error;
  const std::string text = got->is_string() ? got->get<std::string>() : json_text(*got);
  return text.find(a[1]) == std::string::npos ? "'" + a[0] + "' is " + json_text(*got) + ", without '" + a[1] + "'" : "";
}

std::string run_expect_file(App&, const ScriptArgs& a) {
  std::error_code ec;
  return std::filesystem::is_regular_file(a[0], ec) ? "" : "expected the file " + a[0] + ", it is not there";
}

std::string run_mode(App& app, const ScriptArgs& a) {
  set_rollout(app, a[0] == "rollout");
  if (a[0] == "rollout") return "";
  MapMode mode = MapMode::Query;
  parse_map_mode(a[0], mode);
  if (mode == MapMode::ClassToken && app.doc.comp && !app.doc.comp->forward.has_class_token)
    return "model '" + app.doc.model->model.config.name + "' has no class token";
  if (mode == MapMode::Pool && app.doc.model && !app.doc.model->model.config.attention_pool)
    return "model '" + app.doc.model->model.config.name + "' has no attention pool (SigLIP's head)";
  app.ui.view.mode = mode;
  return "";
}

std::string run_layer(App& app, const ScriptArgs& a) {
  const int layer = int_of(a[0]);
  if (auto e = need_image(app); !e.empty()) return e;
  if (auto e = layers_problem(app, layer); !e.empty()) return e;
  app.ui.view.layer = layer;
  return "";
}

std::string run_token(App& app, const ScriptArgs& a) {
  if (auto e = need_image(app); !e.empty()) return e;
  if (a[0] == "patch") {
    set_query_prefix(app, -1);
    return "";
  }
  try {
    set_query_prefix(app, prefix_token_index(app.doc.model->model.config, a[0]));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string run_head(App& app, const ScriptArgs& a) {
  if (auto e = need_image(app); !e.empty()) return e;
  const int heads = app.doc.model->model.config.num_heads;
  if (a[0] != "all" && int_of(a[0]) >= heads) return "the model has " + std::to_string(heads) + " head(s)";
  app.ui.view.focus_head = a[0] == "all" ? -1 : int_of(a[0]);
  return "";
}

std::string run_rollout(App& app, const ScriptArgs& a) {
  RolloutChoice& r = app.ui.compute.rollout;
  if (a[0] == "on" || a[0] == "off") set_rollout(app, a[0] == "on");
  else if (a[0] == "fusion") parse_head_fusion(a[1], r.fusion);
  else if (a[0] == "discard") r.discard = float_of(a[1]);
  else if (a[0] == "from") app.ui.view.rollout_from_query = a[1] == "query";
  else {
    if (auto e = need_image(app); !e.empty()) return e;
    if (auto e = layers_problem(app, int_of(a[2])); !e.empty()) return e;
    r.first_layer = int_of(a[1]);
    r.last_layer = int_of(a[2]);
  }
  return "";
}

std::string run_colormap(App& app, const ScriptArgs& a) {
  app.ui.display.style.colormap = a[0];
  return "";
}
std::string run_alpha(App& app, const ScriptArgs& a) {
  app.ui.display.style.alpha = float_of(a[0]);
  return "";
}
std::string run_normalize(App& app, const ScriptArgs& a) {
  parse_normalize_name(a[0], app.ui.display.normalize);
  return "";
}
std::string run_upsample(App& app, const ScriptArgs& a) {
  parse_upsample(a[0], app.ui.display.style.upsample);
  return "";
}
std::string run_threshold(App& app, const ScriptArgs& a) {
  DisplayState& d = app.ui.display;
  d.threshold_on = a[0] != "off";
  if (d.threshold_on) d.threshold = float_of(a[0]);
  return "";
}
std::string run_grid(App& app, const ScriptArgs& a) {
  app.ui.display.show_grid = a[0] == "on";
  return "";
}
std::string run_mask(App& app, const ScriptArgs& a) {
  MaskMode mode = MaskMode::Padding;
  parse_mask_mode(a[0], mode);
  set_mask(app, mode);
  return "";
}
std::string run_clear_paint(App& app, const ScriptArgs&) {
  clear_paint(app);
  return "";
}
std::string run_scale(App& app, const ScriptArgs& a) {
  ComputeChoice& c = app.ui.compute;
  if (a[0] == "default") c.scale = ScaleMode::Model;
  else if (a[0] == "none") c.scale = ScaleMode::Unscaled;
  else {
    c.scale = ScaleMode::Temperature;
    c.temperature = float_of(a[1]);
  }
  return "";
}
std::string run_size(App& app, const ScriptArgs& a) {
  app.ui.compute.max_side = a[0] == "default" ? 0 : int_of(a[0]);
  return "";
}

std::string run_preprocess(App& app, const ScriptArgs& a) {
  Preprocess p = Preprocess::Whole;
  parse_preprocess(a[0], p);
  return set_preprocess(app, p);
}
std::string run_precision(App& app, const ScriptArgs& a) {
  Precision p = Precision::Fp32;
  parse_precision(a[0], p);
  set_precision(app, p);
  return "";
}

// The window switch `show NAME` turns on or off.
bool& window_switch(UiState& ui, const std::string& name) {
  if (name == "image") return ui.show_image;
  if (name == "heads") return ui.show_heads;
  if (name == "controls") return ui.show_controls;
  if (name == "inspector") return ui.show_inspector;
  if (name == "stats") return ui.show_stats;
  if (name == "train") return ui.show_train;
  if (name == "layers") return ui.show_layers;
  return ui.show_example;
}
std::string run_show(App& app, const ScriptArgs& a) {
  window_switch(app.ui, a[0]) = a[1] == "on";
  return "";
}

std::string run_example(App& app, const ScriptArgs& a) {
  WorkedExample& e = app.ui.example;
  if (a[0] == "reset") e = WorkedExample{};
  else if (a[0] == "scaled") e.scaled = a[1] == "on";
  else {
    const int r = int_of(a[1]), c = int_of(a[2]);
    (a[0] == "q" ? e.q[r][c] : a[0] == "k" ? e.k[r][c] : e.v[r][c]) = float_of(a[3]);
  }
  return "";
}

std::string run_export(App& app, const ScriptArgs& a) {
  if (auto e = need_image(app); !e.empty()) return e;
  app.ui.export_raw = a.size() == 2;
  app.requests.export_folder = a[0];
  return "";
}
std::string run_browse(App& app, const ScriptArgs& a) {
  BrowserPurpose purpose = BrowserPurpose::OpenImage;
  parse_enum(kBrowseNames, a[0], purpose);
  open_browser(app, purpose);
  return "";
}
std::string run_window(App& app, const ScriptArgs& a) {
  app.requests.window_w = int_of(a[0]);
  app.requests.window_h = int_of(a[1]);
  return "";
}
std::string run_frames(App& app, const ScriptArgs& a) {
  app.script.settle_frames = int_of(a[0]);
  return "";
}
std::string run_quit(App& app, const ScriptArgs&) {
  app.requests.quit = true;
  return "";
}

using S = ScriptSplit;

// The main view's verbs, by concern (script.hpp lists them all).

// Files: what is open, and what is written.
const ScriptVerb kFileVerbs[] = {
    {"open", "open PATH", S::Path, check_path, request_path<&Requests::open_image>},
    {"model", "model PATH", S::Path, check_path, request_path<&Requests::open_model>},
    {"export", "export DIR [raw]", S::PathRaw, check_export, run_export},
    {"screenshot", "screenshot PATH", S::Path, check_path, request_path<&Requests::screenshot>},
    {"state", "state PATH", S::Path, check_path, run_state},
};

// The query and the maps.
const ScriptVerb kQueryVerbs[] = {
    {"pin", "pin ROW COL", S::Words, check_row_col, run_pin},
    {"hover", "hover ROW COL", S::Words, check_row_col, run_hover},
    {"mode", "mode query|cls|received|pool|rollout", S::Words, check_mode, run_mode},
    {"layer", "layer N (N >= 0)", S::Words, check_layer, run_layer},
    {"token", "token patch|cls|dist|regK", S::Words, check_token, run_token},
};

// Heads and rollout.
const ScriptVerb kHeadVerbs[] = {
    {"head", "head N|all", S::Words, check_head, run_head},
    {"rollout",
     "rollout on|off | rollout fusion mean|max|min | rollout discard R (0 <= R < 1) | rollout layers A B (0 <= A <= B) | "
     "rollout from cls|query",
     S::Words, check_rollout, run_rollout},
};

// How the maps are drawn.
const ScriptVerb kDisplayVerbs[] = {
    {"colormap", "colormap NAME", S::Words, check_colormap, run_colormap},
    {"alpha", "alpha A (0 to 1)", S::Words, check_alpha, run_alpha},
    {"normalize", "normalize robust|head|shared|log", S::Words, check_normalize, run_normalize},
    {"upsample", "upsample nearest|bilinear", S::Words, check_upsample, run_upsample},
    {"threshold", "threshold off|T (0 < T <= 1)", S::Words, check_threshold, run_threshold},
};

// The forward pass: mask, scale, working size, preprocessing and precision.
const ScriptVerb kPassVerbs[] = {
    {"mask", "mask none|padding|causal|painted", S::Words, check_mask, run_mask},
    {"scale", "scale default|none|temperature T (0.05 to 20)", S::Words, check_scale, run_scale},
    {"size", "size default|N (64 to 512)", S::Words, check_size, run_size},
    {"preprocess", "preprocess whole|model (model: the checkpoint's own transform)", S::Words, check_preprocess,
     run_preprocess},
    {"precision", "precision fp32|bf16|auto", S::Words, check_precision, run_precision},
};

// The painted mask.
const ScriptVerb kPaintVerbs[] = {
    {"paint", "paint ROW COL", S::Words, check_row_col, run_paint},
    {"erase", "erase ROW COL", S::Words, check_row_col, run_erase},
    {"clear-paint", "clear-paint", S::Words, check_none, run_clear_paint},
};

// Windows and frames.
const ScriptVerb kWindowVerbs[] = {
    {"grid", "grid on|off", S::Words, check_on_off, run_grid},
    {"show", "show image|heads|controls|inspector|stats|example|train|layers on|off", S::Words, check_show, run_show},
    {"browse", "browse image|model|export|screenshot", S::Words, check_browse, run_browse},
    {"window", "window W H (pixels, 320x240 to 8192x8192)", S::Words, check_window, run_window},
    {"frames", "frames N (1 to 10000)", S::Words, check_frames, run_frames},
};

// The worked example.
const ScriptVerb kExampleVerbs[] = {
    {"example", "example q|k|v ROW COL VALUE (q: 2x2, k and v: 3x2) | example scaled on|off | example reset", S::Words,
     check_example, run_example},
};

// Real input, played through the window.
const ScriptVerb kInputVerbs[] = {
    {"key", "key left|right|up|down|escape|enter|tab", S::Words, check_key, run_key},
    {"click", "click LABEL [at FX FY] (LABEL may be WINDOW > SECTION > LABEL; FX, FY from 0 to 1)", S::LabelAt, check_click,
     run_click},
    {"drag", "drag LABEL to T (T from 0 to 1)", S::LabelTo, check_drag, run_drag},
    {"drop", "drop PATH", S::Path, check_path, run_drop},
};

// Checks, and the end.
const ScriptVerb kCheckVerbs[] = {
    {"widgets", "widgets PATH", S::Path, check_path, run_widgets},
    {"expect", "expect KEY VALUE (KEY as in the state file, e.g. normalize or show/heads)", S::KeyValue, check_expect, run_expect},
    {"expect-contains", "expect-contains KEY VALUE (KEY as in the state file, e.g. normalize or show/heads)", S::KeyValue,
     check_expect, run_expect_contains},
    {"expect-file", "expect-file PATH", S::Path, check_path, run_expect_file},
    {"quit", "quit", S::Words, check_none, run_quit},
};

}  // namespace

const std::vector<ScriptVerb>& script_verbs() {
  static const std::vector<ScriptVerb> table = [] {
    std::vector<ScriptVerb> rows;
    for (const auto& [group, size] : std::initializer_list<std::pair<const ScriptVerb*, size_t>>{
             {kFileVerbs, std::size(kFileVerbs)}, {kQueryVerbs, std::size(kQueryVerbs)},
             {kHeadVerbs, std::size(kHeadVerbs)}, {kDisplayVerbs, std::size(kDisplayVerbs)},
             {kPassVerbs, std::size(kPassVerbs)}, {kPaintVerbs, std::size(kPaintVerbs)},
             {kWindowVerbs, std::size(kWindowVerbs)}, {kExampleVerbs, std::size(kExampleVerbs)},
             {kInputVerbs, std::size(kInputVerbs)}, {kCheckVerbs, std::size(kCheckVerbs)}})
      rows.insert(rows.end(), group, group + size);
    for (const ScriptVerb& row : training_script_verbs()) rows.push_back(row);
    return rows;
  }();
  return table;
}

std::string apply_script_command(App& app, const ScriptCommand& command) {
  const ScriptVerb* row = find_script_verb(script_verbs(), command.verb);
  return row ? row->apply(app, command.args) : "unknown command '" + command.verb + "'";
}

bool step_script(App& app) {
  ScriptRunner& s = app.script;
  if (!s.active()) return false;
  if (!app.input.empty()) {
    s.settle_frames = 2;  // the frames after the last input step draw what it did
    return true;
  }
  if (s.settle_frames > 0) {
    --s.settle_frames;
    return true;
  }
  if (!is_idle(app)) return true;
  const ScriptCommand& c = s.commands[s.next++];
  s.settle_frames = 2;  // let the result be drawn (and windows settle) before the next command
  const std::string problem = apply_script_command(app, c);
  if (!problem.empty()) s.error = s.path + ":" + std::to_string(c.line) + ": '" + c.text + "': " + problem;
  return s.error.empty();
}

}  // namespace vitlens::viewer
