#pragma once
// The viewer without its window: the App struct (app.hpp) holds the state, the worker and the
// bookkeeping; the functions below are the only way the main view's state changes. The mouse, the keys,
// the menus and the script all call the same functions, so a script drives the real code paths.
// Nothing here touches ImGui, GLFW or OpenGL.
#include <opencv2/core.hpp>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/app.hpp"

namespace vitlens::viewer {

// [SECTION] Start and stop

// Reads `settings_file` (when set) into app.settings and the UI; returns a warning or "".
std::string load_app_settings(App& app);
// Starts loading the first image and model.
void start_app(App& app, const std::string& image_path, const std::string& model_path);
void save_app_settings(App& app, int window_w, int window_h);

// [SECTION] Once per frame, in this order

void poll_worker(App& app);       // swap finished results in
void process_requests(App& app);  // file loads and exports (the screenshot is the window's job)
void schedule_compute(App& app);  // start a forward pass when its inputs changed
void update_derived(App& app);    // maps, pictures, inspector and worked example when stale
bool is_idle(const App& app);     // nothing loading, computing, exporting or requested
// After the window closed: waits for the exports asked for before (a pass still running is
// dropped) and takes each result as a frame would; `said` gets each one's status message and
// whether it is an error. Returns at once when none is waiting.
void finish_exports(App& app, const std::function<void(const std::string&, bool)>& said);
// The display size of this frame: a new size (after the first) starts a new layout generation,
// so the windows are laid out again for it (view_picture.cpp, PlaceWindow).
void note_display_size(LayoutState& layout, float width, float height);

// [SECTION] Actions (mouse, keys, menus and script)

void pin_query(App& app, int row, int col);   // clamped to the grid
void move_query(App& app, int drow, int dcol);
void set_hover(App& app, int row, int col);   // -1, -1: nothing hovered
void paint_patch(App& app, int row, int col, bool forbid);
void clear_paint(App& app);
void set_mask(App& app, MaskMode mode);
// A prefix token (0 .. prefix-1: class, distillation, registers) as the query, or -1 for the
// pinned patch; shows the query's maps. False when the model has no such token.
bool set_query_prefix(App& app, int token);
// A click on the layers x heads grid: that layer in the main view, that head opened large.
void open_grid_cell(App& app, int layer, int head);
// Rollout mode on or off (its settings stay); on needs a new pass keeping every weight.
void set_rollout(App& app, bool on);
// The image as the model's library prepares it (Preprocess::Model) or whole; "" when done, else
// why not (no model yet, or it publishes no transform vitlens reproduces) and nothing changes.
std::string set_preprocess(App& app, Preprocess preprocess);
// Why the model's own preprocessing cannot be chosen for the loaded model, or "" when it can
// (the switch's tooltip when disabled, the script's error).
std::string preprocess_unavailable(const App& app);
void set_precision(App& app, Precision precision);
// Opens the in-app file browser for a purpose (menus, buttons and the script's `browse`).
void open_browser(App& app, BrowserPurpose purpose);
// Exports the current view (what the heads panel shows) into `folder` on the worker.
void start_export(App& app, const std::string& folder);
// An export or a screenshot failed: shown as the status message and kept for the exit message.
void report_export_failure(App& app, const std::string& text);

// The patch (row, col) and processed-image pixel (x, y) under screen point (sx, sy) of a picture
// drawn at `picture`; false outside it or before an image is in.
bool patch_under(const App& app, const Rect& picture, float sx, float sy, int& row, int& col, int& px, int& py);

// Grid of the current computation (0, 0 before one) and the layer the maps show.
int grid_rows(const App& app);
int grid_cols(const App& app);
int current_layer(const App& app);
int model_layers(const App& app);

// Whether the current view is exactly what `vitlens export` can write (no viewer-only settings).
bool cli_equivalent(const App& app);
// The settings on screen that `vitlens export` has no flag for ("the mask 'painted'", "no softmax
// scale"), or "" when there are none.
std::string viewer_only_settings(const App& app);
// One line on what the map mode on screen shows, for a newcomer (the Controls window shows it).
std::string map_mode_caption(const App& app);
// The `vitlens export` flags that give the same files when cli_equivalent, for the UI to show.
std::string cli_command(const App& app, const std::string& out_dir);

// [SECTION] Preprocessing and precision, in words (pass_choice.cpp)

// The model's transform as one line, when the pass on screen used it ("timm eval transform (PIL):
// resize shortest edge 248 bicubic (pillow), center crop 224x224, ..."); "" in the whole-image mode.
std::string preprocess_caption(const App& app);
// What the precision switch alone does not say, one line each: auto's choice for the pass on
// screen and why, the precision on screen while another is computed, and, where bf16 is chosen
// or ran, that this CPU emulates it. Empty for fp32 chosen and run.
std::vector<std::string> precision_lines(const App& app);

// [SECTION] Output folders

// Where exports and screenshots go unless the user picks another place: $VITLENS_EXPORT_DIR when
// set, else ~/vitlens-exports (created on the first export or screenshot).
std::string default_export_folder();
// `path` made absolute and normal, so messages say exactly where files went.
std::string output_path(const std::string& path);
// Creates `folder` when it is the default export folder and does not exist yet; any other folder
// must exist already. Throws vitlens::Error naming the folder.
void prepare_output_folder(const std::string& folder);
// For a flag that names an output file: throws vitlens::Error when its folder does not exist.
void check_output_path(const std::string& path, const std::string& flag);

// The file a screenshot asked for as `path` goes to: `path` itself when it ends in .png, with
// ".png" added when its name has no extension. Throws vitlens::Error for a folder (or a name
// ending in '/') and for another extension (a screenshot is a PNG file).
std::string screenshot_path(const std::string& path);

// Saves `rgb8` (the window) as a PNG at `path`, never over a file this session did not write: a
// name taken by anything else is refused in the status bar, except the default name
// vitlens-screenshot.png, which is numbered on (vitlens-screenshot_2.png, ...). A screenshot this
// session wrote is replaced (a script that saves to one path twice). Reports in the status bar.
void save_screenshot(App& app, const std::string& path, const cv::Mat& rgb8);

// [SECTION] Status bar

// What the status bar shows after the message: the computation on screen (grid, tokens, working
// size), always the current one.
std::string status_text(const App& app);

// [SECTION] Widgets

// The widget named by `spec`: "LABEL", or "WINDOW > SECTION > LABEL" with any of the leading
// parts (each must be the widget's window or one of its sections, in that order). Only visible
// widgets count. Returns null and sets `error` when none or several fit.
const WidgetInfo* find_widget(const WidgetFrame& frame, const std::string& spec, std::string& error);
// The list as `--dump-widgets` and the script's `widgets FILE` write it.
nlohmann::json widgets_json(const WidgetFrame& frame);

// [SECTION] Script

// Runs the next commands when the app is idle; returns false once the script is done or failed.
bool step_script(App& app);
// Runs one command now. Returns an empty string, or why it failed.
std::string apply_script_command(App& app, const ScriptCommand& command);

// The state a test (or a curious user) wants to read: files, message, grid, query, settings, and
// where each picture was drawn.
nlohmann::json state_json(const App& app);

}  // namespace vitlens::viewer
