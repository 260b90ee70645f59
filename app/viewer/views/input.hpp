#pragma once
// The window's input, between GLFW and Dear ImGui:
//   - key events are queued by our GLFW key callback and handed to ImGui's at most one change
//     per key per frame, so a tap shorter than a frame (press and release polled together) is
//     still seen as a press in one frame and a release in the next. Dear ImGui 1.86 keeps only
//     io.KeysDown[], the state at NewFrame, so a press and release between two frames vanished.
//   - dropped files are collected for the frame to route;
//   - the script's synthetic input (App::input: mouse moves and buttons, keys, drops) is played
//     one step per frame into the same paths: io.MousePos / io.MouseDown, which the GLFW backend
//     writes for a real mouse, the key queue above, and the GLFW drop callback.
#include <deque>
#include <string>
#include <vector>

struct GLFWwindow;

namespace vitlens::viewer {

struct App;

struct WindowInput {
  std::vector<std::string> dropped;  // files dropped since the last frame
  struct KeyEvent {
    int key = 0, scancode = 0, action = 0, mods = 0;
  };
  std::deque<KeyEvent> keys;         // not yet handed to Dear ImGui
  // Scripted runs: only the script moves the mouse (the real pointer is ignored).
  bool synthetic_mouse = false;
  float mouse_x = -1e30f, mouse_y = -1e30f;
  bool mouse_down[2] = {false, false};
};

// After ImGui_ImplGlfw_InitForOpenGL(window, true): replaces its key callback by the queue and
// sets the drop callback. `input` must outlive the window.
void install_input_callbacks(GLFWwindow* window, WindowInput& input);

// Once per frame, before routing dropped files: plays the next synthetic step(s) of app.input.
void play_synthetic_input(App& app, GLFWwindow* window, WindowInput& input);

// Once per frame, after ImGui_ImplGlfw_NewFrame and before ImGui::NewFrame.
void feed_imgui_input(GLFWwindow* window, WindowInput& input);

// Whether queued input still waits for a frame (the loop must not sleep then).
bool input_pending(const App& app, const WindowInput& input);

}  // namespace vitlens::viewer
