#pragma once
// `vitlens view`: the desktop viewer (Dear ImGui + GLFW + OpenGL 3).
#include <string>

namespace vitlens::viewer {

struct ViewerArgs {
  std::string image;       // empty: the bundled demo image
  std::string model;       // empty: the bundled designed model
  std::string screenshot;  // write the window as PNG once everything is drawn, then exit
  std::string script;      // run these commands (script.hpp), then exit
  int frames = -1;         // with --screenshot or alone: frames to draw before capturing / exiting
  int heads = 0;           // --heads for a timm checkpoint without config.json
  std::string dump_widgets;  // write the widget list (JSON) once the first image is on screen, again on changes
};

// Runs the window until it is closed (or, scripted, until the script is done). Returns the exit
// code; throws vitlens::Error with a one-line message when no window can be opened (no display)
// or the script is malformed.
int run_viewer(const ViewerArgs& args);

}  // namespace vitlens::viewer
