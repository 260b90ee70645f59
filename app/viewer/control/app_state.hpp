#pragma once
// The viewer's state as plain data, kept outside every draw function as Dear ImGui's examples do:
//   Document  what is loaded and computed (model, image, forward pass), swapped in whole
//   UiState   what the user chose (display, query, masks, windows), edited by the views
//   Derived   what follows from both (maps, pictures, inspector numbers), rebuilt when its inputs
//             change (controller.hpp), never every frame
//   Requests  what the views asked for this frame (open a file, export, screenshot)
//   Widgets   every widget drawn last frame (label, ID, rectangle) and the synthetic input the
//             script sends to them through the real input path
// Views read Document and Derived and write UiState and Requests; they never compute.
//
// Legend: N = tokens (class token first), H = heads, d = head dim, gh, gw = patch grid rows and
// columns, P = patch side.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <opencv2/core.hpp>

#include "control/attention_stats.hpp"
#include "core/render/export.hpp"
#include "core/render/head_roles.hpp"
#include "core/render/layer_grid.hpp"
#include "core/model/classifier.hpp"
#include "core/model/rollout.hpp"
#include "core/model/vit.hpp"

namespace vitlens::viewer {

// [SECTION] Choices

// Which keys a query may not see. Padding, Causal and Painted all keep the padded border masked
// (as `vitlens export` always does); None lets attention reach the padding too.
enum class MaskMode { None, Padding, Causal, Painted };
const char* mask_mode_name(MaskMode mode);  // "none", "padding", "causal", "painted"
bool parse_mask_mode(const std::string& name, MaskMode& mode);

// The factor on q.k before the softmax: the model's 1/sqrt(d), none (1), or 1/(sqrt(d) T).
enum class ScaleMode { Model, Unscaled, Temperature };
const char* scale_mode_name(ScaleMode mode);  // "default", "none", "temperature"

// What a left drag on a picture does while the painted mask is selected.
enum class Brush { Paint, Erase, Off };

// The names of MapMode, Normalize, Upsample and HeadFusion are core's (maps.hpp, export.hpp,
// heatmap.hpp, rollout.hpp); all are tables of core/base/enum_names.hpp.
const char* brush_name(Brush brush);  // "paint", "erase", "off"

constexpr int kMinWorkingSide = 64, kMaxWorkingSide = 512;
constexpr int kLayerGridGap = 1;  // pixels between the layers x heads grid's tiles (one pixel per patch)

// How the image becomes the model's input (`vitlens export --preprocess`): the whole image at the
// working size, aspect kept and padding masked, or the checkpoint's own transform (crop, squash).
enum class Preprocess { Whole, Model };
const char* preprocess_name(Preprocess p);  // "whole", "model"
bool parse_preprocess(const std::string& name, Preprocess& p);

// The viewer's default precision: float32, as `vitlens export` (README, "The viewer", says why).
constexpr Precision kViewerDefaultPrecision = Precision::Fp32;

// [SECTION] Document

struct LoadedModel {
  uint64_t serial = 0;  // unique per load, so a reloaded file counts as new
  std::string path;     // as the user gave it (it is written into exported JSON)
  VitModel model;
  // The checkpoint's own preprocessing (models/model_transform.hpp), read once at load: present()
  // when it publishes one vitlens reproduces; else `no_transform` says why, in one line.
  ImageTransform transform;
  std::string no_transform;
};

struct SourceImage {
  uint64_t serial = 0;
  std::string path;
  LoadedImage pixels;  // as load_image returns it (at most kMaxLoadSide a side, with the file's own size), before resizing
};

// Attention rollout as a view mode (rollout.hpp): it needs every layer's (N, N) weights, so it is
// part of the computation (the worker multiplies them and keeps only the (N, N) result).
struct RolloutChoice {
  bool on = false;
  HeadFusion fusion = HeadFusion::Mean;
  float discard = 0.0f;                  // [0, 1): vit-explain's discard_ratio
  int first_layer = 0, last_layer = -1;  // -1: the last layer
  bool operator==(const RolloutChoice& o) const {
    return on == o.on && fusion == o.fusion && discard == o.discard && first_layer == o.first_layer && last_layer == o.last_layer;
  }
  bool operator!=(const RolloutChoice& o) const { return !(*this == o); }
};

// Everything that decides a forward pass; equal keys give identical results.
struct ForwardKey {
  uint64_t model = 0, image = 0;
  int max_side = 0;                 // resolved working size (never "default")
  MaskMode mask = MaskMode::Padding;
  std::vector<uint8_t> painted;     // (gh*gw) 1 = forbidden key; empty unless mask is Painted
  float score_scale = -1.0f;        // < 0: the model's 1/sqrt(d)
  float temperature = 1.0f;         // the softmax temperature score_scale came from (1: none, or "no scale")
  RolloutChoice rollout;            // on: the pass keeps every weight and the rollout is computed
  Preprocess preprocess = Preprocess::Whole;  // Model only when the model has a transform (max_side then 0)
  Precision precision = Precision::Fp32;      // resolved: never Auto
  bool operator==(const ForwardKey& o) const {
    return model == o.model && image == o.image && max_side == o.max_side && mask == o.mask &&
           painted == o.painted && score_scale == o.score_scale && temperature == o.temperature && rollout == o.rollout &&
           preprocess == o.preprocess && precision == o.precision;
  }
  bool operator!=(const ForwardKey& o) const { return !(*this == o); }
};

// One forward pass of one image, with the head statistics that need every query.
struct Computation {
  uint64_t serial = 0;
  ForwardKey key;
  PreparedImage image;
  ForwardResult forward;
  ImageStats stats;
  HeadRoleScores roles;  // head-role lifts of every layer and head (core/render/head_roles.hpp)
  MatRM rollout;         // (N, N) attention_rollout of key.rollout when it is on, else empty; the
                         // forward's own (N, N) weights are dropped once it is made
  RolloutOptions rollout_options;
  Predictions predictions;  // the classifier's top classes (core/model/classifier.hpp); none without a head
  double forward_ms = 0.0, stats_ms = 0.0;  // stats_ms: entropy, distance and roles together
  double rollout_ms = 0.0;                  // the pass keeping every weight, plus the rollout
};

struct Document {
  std::shared_ptr<const LoadedModel> model;
  std::shared_ptr<const SourceImage> image;
  std::shared_ptr<const Computation> comp;  // null until the first result arrives
  bool ready() const { return model && image && comp; }
};

// [SECTION] UI state

struct DisplayState {
  HeatmapStyle style;                    // colormap, alpha (opacity), upsample
  Normalize normalize = kDefaultNormalize;   // as `vitlens export`
  bool threshold_on = false;
  float threshold = 0.6f;                // DINO's visualize_attention --threshold: top mass kept
  bool show_grid = false;
};

struct ViewChoice {
  MapMode mode = MapMode::Query;        // where the centre patch looks: the mode in which a head's
                                         // role shows on a photo (received averages every query)
  int layer = -1;                        // < 0: the last layer
  int query_row = -1, query_col = -1;    // pinned query patch; -1: the centre once an image is in
  int hover_row = -1, hover_col = -1;    // patch under the cursor this frame; -1: none
  int key_row = -1, key_col = -1;        // the inspector's key: the last hovered patch
  int query_prefix = -1;                 // a prefix token (class, distillation, register) as the query
                                         // instead of the pinned patch; -1: the patch
  int focus_head = -1;                   // the head opened large (from the layers x heads grid); -1: all
  bool rollout_from_query = false;       // rollout row: the query (patch or prefix token), else the class token
};

struct ComputeChoice {
  int max_side = 0;                      // working long side; 0: the model's img_size
  MaskMode mask = MaskMode::Padding;
  std::vector<uint8_t> painted;          // (gh*gw) of the current grid, or empty
  Brush brush = Brush::Paint;
  ScaleMode scale = ScaleMode::Model;
  float temperature = 1.0f;
  RolloutChoice rollout;
  Preprocess preprocess = Preprocess::Whole;  // Model applies only to a model with a transform
  Precision precision = kViewerDefaultPrecision;
};

enum class BrowserPurpose { OpenImage, OpenModel, ExportFolder, ScreenshotFile };
const char* browser_purpose_name(BrowserPurpose purpose);  // "open image", "open model", ...

struct BrowserState {
  bool open_requested = false;           // the menu asked; the browser opens its popup next frame
  bool shown = false;                    // the popup is on screen
  BrowserPurpose purpose = BrowserPurpose::OpenImage;
  std::string folder;                    // listed folder
  std::string typed;                     // the path field
  bool show_all = false;                 // ignore the extension filter
  std::string listed_folder;             // cache key of `entries`
  bool listed_show_all = false;
  std::vector<std::pair<std::string, bool>> entries;  // (name, is folder)
  std::string list_error;
};

struct Message {
  std::string text;
  bool error = false;
};

// The seed's worked example: 2 queries, 3 keys, dimension 2 (softmax(Q K^T / sqrt(2)) V).
struct WorkedExample {
  float q[2][2] = {{1, 0}, {0, 1}};
  float k[3][2] = {{1, 0}, {1, 1}, {0, 1}};
  float v[3][2] = {{10, 0}, {0, 5}, {0, 1}};
  bool scaled = true;                    // divide by sqrt(d_k)
  bool operator==(const WorkedExample& o) const {
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 2; ++c)
        if ((r < 2 && q[r][c] != o.q[r][c]) || k[r][c] != o.k[r][c] || v[r][c] != o.v[r][c]) return false;
    return scaled == o.scaled;
  }
  bool operator!=(const WorkedExample& o) const { return !(*this == o); }
};

struct Rect {
  float x = 0, y = 0, w = 0, h = 0;      // framebuffer pixels, top-left origin
};

// [SECTION] Widgets and synthetic input

// What a widget is, for `click` / `drag` and `--dump-widgets`.
enum class WidgetKind { Button, Checkbox, Radio, Slider, Combo, Input, Menu, MenuItem, Selectable, Header, TreeNode, Picture, DropTarget };
const char* widget_kind_name(WidgetKind kind);  // "button", "checkbox", ...

// One widget as it was drawn (views record each one through widgets.hpp).
struct WidgetInfo {
  std::string label;                 // the visible text (before any "##")
  std::string id_label;              // the text ImGui hashed for the ID ("...##export")
  uint32_t id = 0;                   // ImGuiID: equal IDs in one window are a clash
  std::string window;                // the ImGui window it is in
  std::vector<std::string> sections; // the collapsing header or menu it sits under, outermost first
  WidgetKind kind = WidgetKind::Button;
  Rect rect;                         // the whole item, in window pixels (ImGui's coordinates)
  Rect frame;                        // the part that takes the mouse (a slider's track, not its
                                     // label), cut to what shows inside the window
  bool enabled = true;
  bool visible = true;               // inside its window's visible area
  std::string value;                 // a text or number field: what it shows ("" for other kinds)
};

// A line of text as it was drawn: `width` is what it needs, `room` what the window (or table
// column) had to the right of where it starts; width > room means the window cuts it off.
struct TextInfo {
  std::string text;
  std::string window;
  Rect rect;                         // window pixels
  float width = 0.0f, room = 0.0f;
  bool wrapped = false;              // broken into lines at the window's edge
};

// A window as it was drawn: `visible` is the part its contents show in (inside the title bar,
// borders and scroll bars); `scroll` and `scroll_max` say how far its contents reach, so a widget
// below the visible part is reachable when scroll_max covers it.
struct WindowInfo {
  std::string name;
  std::string parent;                // the window a child window (a scrolling table) sits in; "" for top level
  std::string kind;                  // "window", "child", "popup", "menu", "tooltip", "modal"
  Rect rect, visible;
  float scroll_x = 0, scroll_y = 0, scroll_max_x = 0, scroll_max_y = 0;
};

struct WidgetFrame {
  std::vector<WidgetInfo> widgets;   // in the order they were drawn
  std::vector<TextInfo> texts;       // every line of text drawn through gui::Text and its kin
  std::vector<WindowInfo> windows;   // every window drawn this frame, front-most last
  std::vector<std::string> clashes;  // "window: 'a' (button) and 'b' (header) share ID 0x..."
  int display_w = 0, display_h = 0;
};

// One step of synthetic input, played by the window into Dear ImGui's input (io.MousePos,
// io.MouseDown) or through the GLFW key and drop callbacks. Steps run one per frame, except a
// step marked `same_frame`, which runs in the frame of the step before it.
struct InputStep {
  enum class Type { MouseMove, MouseDown, MouseUp, KeyDown, KeyUp, Drop, Wait };
  Type type = Type::Wait;
  float x = 0.0f, y = 0.0f;          // MouseMove: window pixels
  int button = 0;                    // MouseDown / MouseUp: 0 left, 1 right
  std::string key;                   // KeyDown / KeyUp: left, right, up, down, escape, enter, tab
  std::string path;                  // Drop
  bool same_frame = false;
};

// The default layout (view_picture.cpp, PlaceWindow): each window is placed on first use, and again
// once per generation, which a display resize or View > Reset layout starts.
struct LayoutState {
  float display_w = 0.0f, display_h = 0.0f;  // the display size of the last frame
  int generation = 0;
  std::map<std::string, int> placed;         // window name -> the generation it was placed in
};

struct UiState {
  DisplayState display;
  ViewChoice view;
  ComputeChoice compute;
  bool show_image = true, show_heads = true, show_controls = true;
  bool show_inspector = true, show_stats = true, show_example = false;
  bool show_train = false;               // the Train window (view_train.cpp)
  bool show_layers = false;              // the layers x heads grid window (view_layers.cpp)
  BrowserState browser;
  Message message;
  WorkedExample example;
  std::string export_folder;             // empty: default_export_folder() (controller.hpp)
  bool export_raw = false;
  std::string screenshot_path;           // empty: vitlens-screenshot.png in the default export folder
  int working_side_edit = 0;             // the size slider while it is dragged (applied on release)
  std::vector<std::string> recent_images, recent_models;
  std::map<std::string, Rect> layout;    // where the pictures were drawn last frame (for tests)
  LayoutState layout_windows;            // where the windows go (view_picture.cpp)
  WidgetFrame widgets;                   // every widget drawn last frame (widgets.hpp)
};

// [SECTION] Requests

struct Requests {
  std::string open_image, open_model;    // load these (keep the current ones on failure)
  std::string export_folder;             // export the current view into this folder
  std::string screenshot;                // write the framebuffer after this frame
  int screenshot_wait = 0;               // frames to draw first (a file browser leaving the picture)
  int window_w = 0, window_h = 0;        // > 0: resize the window to this; kept until the display has that size
  bool quit = false;
  bool any() const {
    return !open_image.empty() || !open_model.empty() || !export_folder.empty() || !screenshot.empty() || window_w > 0;
  }
};

// [SECTION] Derived

struct WorkedResult {
  MatRM scores;   // (2, 3) Q K^T times the scale, before the softmax
  MatRM weights;  // (2, 3)
  MatRM context;  // (2, 2)
};

// The keys of Derived's caches: each cache is rebuilt when its key differs from the one it was
// built with (std::nullopt: never built, or dropped with its computation).
struct MapKey {  // the maps of one layer for one request
  uint64_t comp = 0;
  int layer = 0;
  MapMode mode = MapMode::Query;
  int query_token = -1;
  auto tie() const { return std::tie(comp, layer, mode, query_token); }
  bool operator==(const MapKey& o) const { return tie() == o.tie(); }
  bool operator!=(const MapKey& o) const { return !(*this == o); }
};

struct PictureKey {  // those maps drawn: thresholded, normalised and coloured
  MapKey maps;
  std::string colormap;
  float alpha = 0.0f;
  Upsample upsample = Upsample::Nearest;
  Normalize normalize = kDefaultNormalize;
  float threshold = 0.0f;  // 0: off
  auto tie() const { return std::tie(maps, colormap, alpha, upsample, normalize, threshold); }
  bool operator==(const PictureKey& o) const { return tie() == o.tie(); }
  bool operator!=(const PictureKey& o) const { return !(*this == o); }
};

struct RolloutKey {  // the rollout row of one token, drawn
  uint64_t comp = 0;
  int token = -1;
  std::string colormap;
  float alpha = 0.0f;
  Upsample upsample = Upsample::Nearest;
  Normalize normalize = kDefaultNormalize;
  auto tie() const { return std::tie(comp, token, colormap, alpha, upsample, normalize); }
  bool operator==(const RolloutKey& o) const { return tie() == o.tie(); }
  bool operator!=(const RolloutKey& o) const { return !(*this == o); }
};

struct LayersKey {  // the layers x heads grid for one request
  uint64_t comp = 0;
  MapMode mode = MapMode::Query;
  int query_token = -1;
  std::string colormap;
  Normalize normalize = kDefaultNormalize;
  float threshold = 0.0f;  // 0: off
  auto tie() const { return std::tie(comp, mode, query_token, colormap, normalize, threshold); }
  bool operator==(const LayersKey& o) const { return tie() == o.tie(); }
  bool operator!=(const LayersKey& o) const { return !(*this == o); }
};

struct InspectorKey {  // one query against one key in one layer
  uint64_t comp = 0;
  int layer = 0, query = 0, key = 0;
  auto tie() const { return std::tie(comp, layer, query, key); }
  bool operator==(const InspectorKey& o) const { return tie() == o.tie(); }
  bool operator!=(const InspectorKey& o) const { return !(*this == o); }
};

struct Derived {
  const Computation* comp = nullptr;     // what view/pictures were built from
  uint64_t comp_serial = 0;
  ImageAnalysis view;                    // image, request and shown maps as write_export takes them
  HeadMaps raw_maps;                     // the maps before the threshold
  std::vector<ThresholdResult> kept;     // (H + 1) when the threshold is on, else empty
  std::vector<double> entropy;           // (H + 1) of the attention maps (before any threshold)
  std::vector<float> scales;             // (H + 1) the value drawn at the top of the colour map
  ExportImages pictures;                 // render_export_images of `view`: what export writes
  cv::Mat base_rgb8;                     // the processed image
  cv::Mat colormap_ramp;                 // (1, 256) RGB of the colour map, for the colour bars
  std::optional<std::string> ramp_colormap;
  uint64_t pictures_version = 0, base_version = 0, ramp_version = 0;
  double maps_ms = 0.0, render_ms = 0.0; // the last per-query update
  std::string map_error;      // the maps could not be made (the last good ones stay)
  std::string picture_error;  // the pictures could not be drawn from them (cleared by the next that can)
  std::optional<MapKey> map_key;
  std::optional<PictureKey> picture_key;

  // The layers x heads grid (layer_grid.hpp), built only while its window is open.
  LayerGrid layers;
  std::string layers_error;
  std::optional<LayersKey> layers_key;
  uint64_t layers_version = 0;
  double layers_ms = 0.0;                // maps of every layer and head, thresholds, colours: one query

  // Rollout mode: the map of the rollout row and the picture export_rollout writes.
  int rollout_query = -1;                // the token whose row is shown; -1: none
  MatRM rollout_map;                     // (gh, gw)
  cv::Mat rollout_picture;               // CV_8UC3 RGB at the processed image's size
  std::optional<RolloutKey> rollout_key;
  uint64_t rollout_version = 0;

  bool inspector_valid = false;
  InspectorStep inspector;
  std::optional<InspectorKey> inspector_key;

  std::optional<WorkedExample> example_inputs;  // what `example` was computed from
  bool example_valid = false;
  WorkedResult example;
};

}  // namespace vitlens::viewer
