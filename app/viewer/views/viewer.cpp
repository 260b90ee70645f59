// `vitlens view`: the window, the Dear ImGui context and the main loop, in the phases of Dear
// ImGui's example_glfw_opengl3: setup window, setup context, main loop, rendering, cleanup.
// Index:
//   [SECTION] Automation: --script, --screenshot and --frames become one script
//   [SECTION] GLFW callbacks
//   [SECTION] Frame pieces
//   [SECTION] run_viewer
#include "views/viewer.hpp"

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include <sys/stat.h>

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>

#include "app/cli.hpp"
#include "control/controller.hpp"
#include "control/file_list.hpp"
#include "views/input.hpp"
#include "views/textures.hpp"
#include "views/views.hpp"
#include "views/widgets.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "models/model_io.hpp"

namespace vitlens::viewer {

namespace {

constexpr int kAutomatedWidth = 1440, kAutomatedHeight = 900;  // fixed, so screenshots compare
constexpr int kDefaultScreenshotFrames = 3;

// [SECTION] Automation: --script, --screenshot and --frames become one script

ScriptCommand MakeCommand(const std::string& verb, const std::string& arg, const std::string& text) {
  ScriptCommand c;
  c.verb = verb;
  if (!arg.empty()) c.args.push_back(arg);
  c.text = text;
  return c;
}

// Commands of --script, then the command-line switches, then quit. Throws on a malformed script.
ScriptRunner BuildScript(const ViewerArgs& args) {
  ScriptRunner runner;
  runner.path = args.script.empty() ? std::string("command line") : args.script;
  if (!args.script.empty()) runner.commands = load_script(args.script);
  if (args.frames > 0) runner.commands.push_back(MakeCommand("frames", std::to_string(args.frames), "--frames"));
  if (!args.screenshot.empty()) {
    if (args.frames <= 0)
      runner.commands.push_back(MakeCommand("frames", std::to_string(kDefaultScreenshotFrames), "--screenshot"));
    runner.commands.push_back(MakeCommand("screenshot", args.screenshot, "--screenshot " + args.screenshot));
  }
  runner.commands.push_back(MakeCommand("quit", "", "end of script"));
  return runner;
}

// [SECTION] GLFW callbacks

// Ctrl+C, a TERM signal or a HUP (the terminal closed) closes the window the normal way, so the
// settings are saved.
volatile std::sig_atomic_t g_stop_requested = 0;
void OnStopSignal(int) { g_stop_requested = 1; }

std::string g_glfw_error;  // the last GLFW error, for the one-line message

void OnGlfwError(int /*code*/, const char* description) { g_glfw_error = description ? description : "unknown"; }

// [SECTION] Frame pieces

// A dropped .safetensors file is a model; anything else is tried as an image.
void RouteDroppedFiles(App& app, std::vector<std::string>& dropped) {
  for (const std::string& path : dropped) {
    if (has_extension(path, model_extensions())) app.requests.open_model = path;
    else app.requests.open_image = path;
  }
  dropped.clear();
}

void HandleKeys(App& app) {
  if (ImGui::GetIO().WantCaptureKeyboard || !app.doc.ready()) return;
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow))) move_query(app, 0, -1);
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow))) move_query(app, 0, 1);
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_UpArrow))) move_query(app, -1, 0);
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_DownArrow))) move_query(app, 1, 0);
}

void DrawViews(App& app, const ViewTextures& textures) {
  DrawMainMenu(app);
  DrawControlsView(app);
  DrawImageView(app, textures);
  DrawHeadsView(app, textures);
  DrawLayersView(app, textures);
  DrawInspectorView(app);
  DrawStatsView(app);
  DrawWorkedExampleView(app);
  DrawTrainView(app);
  DrawFileBrowser(app);
  DrawStatusBar(app);
}

// Writes the frame just rendered (the back buffer, before the swap).
void CaptureScreenshot(App& app, int width, int height) {
  const std::string path = app.requests.screenshot;
  app.requests.screenshot.clear();
  save_screenshot(app, path, read_framebuffer(width, height));
}

// --dump-widgets: the widget list once the first image is on screen and settled (or, when
// nothing can load, once the app is idle), and again whenever it changes and settles (a window
// opened, a field appeared, a button's label or state changed), so a real-input test finds the
// widgets of what it just opened. Settled: the app idle and the widgets and windows the same for
// 3 frames (windows take a frame or two to find their size). The texts ride along: a text that
// changes while the widgets stay (a training run's step count) is written too, at most every
// kTextOnlyWriteSeconds, so a test can wait for it. Each write replaces the file atomically.
struct DumpState {
  std::string pending;             // the widgets and windows as JSON text while they settle
  int same_frames = 0;             // frames in a row it was `pending`
  std::string written, written_structure;  // what the file holds, and its widgets and windows
  double written_at = 0.0;         // glfwGetTime() of the last write
};
constexpr double kTextOnlyWriteSeconds = 0.2;

void DumpWidgets(App& app, const std::string& path, DumpState& dump) {
  if (path.empty()) return;
  if (!is_idle(app)) {
    dump.same_frames = 0;
    return;
  }
  // A label or field may hold a file name that is not UTF-8: replaced, never thrown on.
  const auto as_text = [](const nlohmann::json& j) {
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  };
  nlohmann::json list = widgets_json(app.ui.widgets);
  std::string text = as_text(list);
  list.erase("texts");
  std::string structure = as_text(list);
  if (structure != dump.pending) {
    dump.pending = std::move(structure);
    dump.same_frames = 1;
    return;
  }
  if (++dump.same_frames < 3 || text == dump.written) return;
  const double now = glfwGetTime();
  if (dump.pending == dump.written_structure && now - dump.written_at < kTextOnlyWriteSeconds) return;
  dump.written = std::move(text);
  dump.written_structure = dump.pending;
  dump.written_at = now;
  try {
    write_file_atomic(path, dump.written);
  } catch (const Error& e) {
    app.ui.message = {std::string("--dump-widgets: ") + e.what(), true};
    std::fprintf(stderr, "vitlens: --dump-widgets: %s\n", e.what());
  }
}

// The script's `window W H`: asks the window system once, then keeps the request (so the script
// waits) until the display has that size; a size it never gets fails the script.
struct ResizeState {
  int asked_w = 0, asked_h = 0;
  int frames = 0;  // frames since it was asked
};
constexpr int kResizeFrames = 600;  // far more than any window system needs to apply a resize

void ResizeWindow(App& app, GLFWwindow* window, const ImVec2& display, ResizeState& resize) {
  Requests& r = app.requests;
  if (r.window_w <= 0) return;
  if (r.window_w != resize.asked_w || r.window_h != resize.asked_h) {
    glfwSetWindowSize(window, r.window_w, r.window_h);
    resize = ResizeState{r.window_w, r.window_h, 0};
  }
  if (static_cast<int>(display.x) == r.window_w && static_cast<int>(display.y) == r.window_h) {
    r.window_w = r.window_h = 0;
    resize = ResizeState{};
  } else if (++resize.frames > kResizeFrames && app.script.error.empty()) {
    app.script.error = app.script.path + ": the window did not become " + std::to_string(r.window_w) + "x" +
                       std::to_string(r.window_h) + " (it is " + std::to_string(static_cast<int>(display.x)) + "x" +
                       std::to_string(static_cast<int>(display.y)) + "; is the screen smaller?)";
    r.window_w = r.window_h = 0;
  }
}

void UpdateTitle(GLFWwindow* window, const App& app, std::string& shown) {
  std::string title = "vitlens";
  if (app.doc.image) title += " - " + std::filesystem::path(app.doc.image->path).filename().string();
  if (app.doc.model) title += " - " + app.doc.model->model.config.name;
  if (title != shown) {
    glfwSetWindowTitle(window, title.c_str());
    shown = title;
  }
}

}  // namespace

// [SECTION] run_viewer

namespace {

// Setup window: a GL 3.0 context (as the imgui example), sized by the settings (at most the
// monitor's work area: a window larger than the screen hides the windows laid out past its edge)
// or, for scripted runs, the fixed automated size.
GLFWwindow* OpenWindow(const App& app, bool automated) {
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  int width = automated ? kAutomatedWidth : app.settings.window_w;
  int height = automated ? kAutomatedHeight : app.settings.window_h;
  if (GLFWmonitor* monitor = automated ? nullptr : glfwGetPrimaryMonitor()) {
    int x = 0, y = 0, area_w = 0, area_h = 0;
    glfwGetMonitorWorkarea(monitor, &x, &y, &area_w, &area_h);
    if (area_w > 0 && area_h > 0) {
      width = std::min(width, area_w);
      height = std::min(height, area_h);
    }
  }
  GLFWwindow* window = glfwCreateWindow(width, height, "vitlens", nullptr, nullptr);
  if (!window) {
    const std::string why = g_glfw_error;
    glfwTerminate();
    throw Error("cannot open an OpenGL 3.0 window (" + why + "); 'vitlens export' writes the heatmaps as files");
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(automated ? 0 : 1);
  return window;
}

// Setup context: Dear ImGui with its GLFW and OpenGL 3 backends. `ini_path` holds the window
// layout's file and must outlive the context.
void SetupImGui(const App& app, GLFWwindow* window, WindowInput& input, std::string& ini_path) {
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  if (!app.settings_file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(app.settings_file).parent_path(), ec);
    ini_path = std::filesystem::path(app.settings_file).parent_path().string() + "/imgui.ini";
    // Dear ImGui opens it with fopen: a pipe there would block the window before its first frame.
    struct stat st {};
    if (::stat(ini_path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) io.IniFilename = ini_path.c_str();
  }
  ImGui::StyleColorsDark();
  // Opaque windows and popups: a window on top never shows the text of the one under it.
  ImGui::GetStyle().Colors[ImGuiCol_WindowBg].w = 1.0f;
  ImGui::GetStyle().Colors[ImGuiCol_PopupBg].w = 1.0f;
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 130");
  install_input_callbacks(window, input);
}

void SetStopSignals(void (*handler)(int)) {
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
  std::signal(SIGHUP, handler);
}

// Poll and handle events. Never spin: while the worker runs, wake often enough to show its
// progress and result promptly, and leave the CPU to it; idle, wait for input.
void WaitForEvents(const App& app, const WindowInput& input, bool automated) {
  const bool working = app.compute_job != 0 || !app.export_jobs.empty() || app.train.session.active();
  if (app.requests.any() || input_pending(app, input) || (automated && !working)) glfwPollEvents();
  else if (automated) glfwWaitEventsTimeout(0.005);
  else glfwWaitEventsTimeout(working ? 1.0 / 60.0 : 0.1);
}

// What the main loop keeps from frame to frame.
struct Frame {
  GLFWwindow* window = nullptr;
  WindowInput input;
  ViewTextures textures;
  std::string title;
  DumpState dump;
  ResizeState resize;
  bool automated = false;
  std::string dump_widgets;  // --dump-widgets FILE, or ""
};

// Work: results in, requests out, derived state and textures up to date. False when the script failed.
bool UpdateState(App& app, Frame& f) {
  poll_worker(app);
  poll_training(app);
  if (f.automated) step_script(app);
  if (!app.script.error.empty()) return false;
  process_requests(app);
  schedule_compute(app);
  set_hover(app, -1, -1);  // the views set it again while the cursor is over a picture
  update_derived(app);
  sync_textures(app.derived, f.textures);
  UpdateTitle(f.window, app, f.title);
  return true;
}

// The Dear ImGui frame: every view drawn, the widgets recorded.
void DrawFrame(App& app, Frame& f) {
  ImGuiIO& io = ImGui::GetIO();
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  feed_imgui_input(f.window, f.input);
  ImGui::NewFrame();
  gui::BeginFrame();
  note_display_size(app.ui.layout_windows, io.DisplaySize.x, io.DisplaySize.y);
  ResizeWindow(app, f.window, io.DisplaySize, f.resize);
  HandleKeys(app);
  DrawViews(app, f.textures);
  app.ui.widgets = gui::EndFrame(io.DisplaySize.x, io.DisplaySize.y);
  DumpWidgets(app, f.dump_widgets, f.dump);
  // The mouse or keys may have moved the query: every head's map follows in this frame.
  update_derived(app);
  sync_textures(app.derived, f.textures);
}

// Rendering, the screenshot when one was asked, and the swap.
void RenderFrame(App& app, Frame& f) {
  ImGui::Render();
  int fb_w = 0, fb_h = 0;
  glfwGetFramebufferSize(f.window, &fb_w, &fb_h);
  glViewport(0, 0, fb_w, fb_h);
  glClearColor(0.09f, 0.09f, 0.10f, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  if (app.requests.screenshot_wait > 0) --app.requests.screenshot_wait;
  else if (!app.requests.screenshot.empty()) CaptureScreenshot(app, fb_w, fb_h);
  glfwSwapBuffers(f.window);
}

void MainLoop(App& app, Frame& f) {
  while (!glfwWindowShouldClose(f.window) && !g_stop_requested) {
    WaitForEvents(app, f.input, f.automated);
    play_synthetic_input(app, f.window, f.input);
    RouteDroppedFiles(app, f.input.dropped);
    if (!UpdateState(app, f)) break;
    DrawFrame(app, f);
    RenderFrame(app, f);
    if (app.requests.quit) break;
  }
}

// Why an automated run failed (the script, nothing shown, a failed export), or "".
std::string RunFailure(const App& app, bool automated) {
  if (!app.script.error.empty() || !automated) return app.script.error;
  // A script stopped by a signal before its last command did not do what it says.
  if (g_stop_requested && app.script.next < app.script.commands.size())
    return "stopped by a signal before the script's end (" + std::to_string(app.script.next) + " of " +
           std::to_string(app.script.commands.size()) + " commands run)";
  if (!app.doc.ready() && !g_stop_requested)
    return "nothing to show: " + (app.last_load_error.empty() ? std::string("no image or model") : app.last_load_error);
  if (app.export_failures > 0)
    return std::to_string(app.export_failures) + " export(s) or screenshot(s) failed; the last: " + app.last_export_failure;
  return "";
}

// Cleanup, in the reverse order of setup.
void Shutdown(Frame& f) {
  destroy_textures(f.textures);
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(f.window);
  glfwTerminate();
}

}  // namespace

int run_viewer(const ViewerArgs& args) {
  const bool automated = !args.script.empty() || !args.screenshot.empty() || args.frames > 0;
  ScriptRunner script;
  if (automated) script = BuildScript(args);  // a malformed script fails before any window opens
  if (!args.dump_widgets.empty()) check_output_path(args.dump_widgets, "--dump-widgets");
  if (!args.screenshot.empty()) {
    try {
      check_output_path(screenshot_path(args.screenshot), "--screenshot");
    } catch (const Error& e) {
      const std::string why = e.what();
      throw Error(why.rfind("--screenshot", 0) == 0 ? why : "--screenshot " + why);
    }
  }

  glfwSetErrorCallback(OnGlfwError);
  if (!glfwInit())
    throw Error("no display available (" + g_glfw_error +
                "): the viewer needs a desktop session; 'vitlens export' writes the same heatmaps as files");
  App app;
  if (!automated) {
    // Scripted and screenshot runs start from the defaults and leave the user's settings alone.
    const std::string folder = settings_folder();
    if (!folder.empty()) app.settings_file = folder + "/settings.json";
    load_app_settings(app);
  }
  Frame f;
  f.automated = automated;
  f.dump_widgets = args.dump_widgets;
  f.window = OpenWindow(app, automated);
  f.input.synthetic_mouse = automated;  // only the script moves things
  std::string ini_path;
  SetupImGui(app, f.window, f.input, ini_path);

  app.script = std::move(script);
  app.load_options.heads = args.heads;
  start_app(app, args.image.empty() ? default_image_path() : args.image,
            args.model.empty() ? default_model_path() : args.model);
  SetStopSignals(OnStopSignal);
  MainLoop(app, f);
  SetStopSignals(SIG_DFL);
  // Exports asked for before the window closed are written whole, and said where they went.
  if (!app.export_jobs.empty()) {
    std::fprintf(stderr, "vitlens: the window closed; finishing %zu export(s) asked for before\n", app.export_jobs.size());
    finish_exports(app, [](const std::string& text, bool) {
      std::fprintf(stderr, "vitlens: %s\n", cli::terminal_text(text).c_str());
    });
  }

  if (const std::string kept = app.train.session.unsaved_temporary(); !kept.empty())
    std::fprintf(stderr, "vitlens: the Train window's weights opened in the main view were saved nowhere else: they stay in %s\n",
                 cli::terminal_text(kept).c_str());
  const std::string failure = RunFailure(app, automated);
  if (!automated) {
    int w = 0, h = 0;
    glfwGetWindowSize(f.window, &w, &h);
    save_app_settings(app, w, h);
  }
  Shutdown(f);
  if (!failure.empty()) throw Error(failure);
  return 0;
}

}  // namespace vitlens::viewer
