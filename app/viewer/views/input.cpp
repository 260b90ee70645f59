// The window's input (see input.hpp).
#include "views/input.hpp"

#include <algorithm>

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>

#include "control/controller.hpp"

namespace vitlens::viewer {

namespace {

WindowInput& InputOf(GLFWwindow* window) { return *static_cast<WindowInput*>(glfwGetWindowUserPointer(window)); }

void OnKey(GLFWwindow* window, int key, int scancode, int action, int mods) {
  // Repeats change nothing in io.KeysDown; Dear ImGui makes its own repeats from the held time.
  if (action == GLFW_REPEAT) return;
  InputOf(window).keys.push_back({key, scancode, action, mods});
}

void OnDrop(GLFWwindow* window, int count, const char** paths) {
  WindowInput& input = InputOf(window);
  for (int i = 0; i < count; ++i) input.dropped.emplace_back(paths[i]);
}

int GlfwKey(const std::string& name) {
  if (name == "left") return GLFW_KEY_LEFT;
  if (name == "right") return GLFW_KEY_RIGHT;
  if (name == "up") return GLFW_KEY_UP;
  if (name == "down") return GLFW_KEY_DOWN;
  if (name == "escape") return GLFW_KEY_ESCAPE;
  if (name == "enter") return GLFW_KEY_ENTER;
  if (name == "tab") return GLFW_KEY_TAB;
  return GLFW_KEY_UNKNOWN;
}

void Apply(const InputStep& step, GLFWwindow* window, WindowInput& input) {
  switch (step.type) {
    case InputStep::Type::MouseMove:
      input.mouse_x = step.x;
      input.mouse_y = step.y;
      break;
    case InputStep::Type::MouseDown:
    case InputStep::Type::MouseUp:
      input.mouse_down[step.button == 1 ? 1 : 0] = step.type == InputStep::Type::MouseDown;
      break;
    case InputStep::Type::KeyDown:
    case InputStep::Type::KeyUp: {
      // As GLFW would call the key callback for a real key.
      const int key = GlfwKey(step.key);
      OnKey(window, key, key == GLFW_KEY_UNKNOWN ? 0 : glfwGetKeyScancode(key),
            step.type == InputStep::Type::KeyDown ? GLFW_PRESS : GLFW_RELEASE, 0);
      break;
    }
    case InputStep::Type::Drop: {
      const char* path = step.path.c_str();
      OnDrop(window, 1, &path);
      break;
    }
    case InputStep::Type::Wait: break;
  }
}

}  // namespace

void install_input_callbacks(GLFWwindow* window, WindowInput& input) {
  glfwSetWindowUserPointer(window, &input);
  glfwSetKeyCallback(window, OnKey);  // ImGui_ImplGlfw_KeyCallback now gets the keys from the queue
  glfwSetDropCallback(window, OnDrop);
}

void play_synthetic_input(App& app, GLFWwindow* window, WindowInput& input) {
  if (app.input.empty()) return;
  Apply(app.input.front(), window, input);
  app.input.pop_front();
  while (!app.input.empty() && app.input.front().same_frame) {
    Apply(app.input.front(), window, input);
    app.input.pop_front();
  }
}

void feed_imgui_input(GLFWwindow* window, WindowInput& input) {
  ImGuiIO& io = ImGui::GetIO();
  if (input.synthetic_mouse) {
    // Written over what the GLFW backend just polled from the real pointer.
    io.MousePos = ImVec2(input.mouse_x, input.mouse_y);
    for (int i = 0; i < IM_ARRAYSIZE(io.MouseDown); ++i) io.MouseDown[i] = i < 2 && input.mouse_down[i];
  }
  // Hand the queued key events over in order; a key that already changed this frame stops the
  // hand-over, so its next change (and everything after it) waits for the next frame.
  std::vector<int> changed;
  while (!input.keys.empty()) {
    const WindowInput::KeyEvent e = input.keys.front();
    if (std::find(changed.begin(), changed.end(), e.key) != changed.end()) break;
    changed.push_back(e.key);
    input.keys.pop_front();
    ImGui_ImplGlfw_KeyCallback(window, e.key, e.scancode, e.action, e.mods);
  }
}

bool input_pending(const App& app, const WindowInput& input) { return !app.input.empty() || !input.keys.empty(); }

}  // namespace vitlens::viewer
