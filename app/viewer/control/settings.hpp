#pragma once
// What the viewer remembers between runs: recent files, the look of the maps and the window size,
// as JSON in $XDG_CONFIG_HOME/vitlens/settings.json (else ~/.config/vitlens/settings.json).
#include <string>
#include <vector>

namespace vitlens::viewer {

struct Settings {
  std::vector<std::string> recent_images, recent_models;  // most recent first
  std::string colormap = "viridis";
  float alpha = 0.6f;
  std::string normalize = "robust"; // robust, head, shared, log (as `vitlens export`)
  std::string upsample = "nearest"; // nearest, bilinear
  bool show_grid = false;
  std::string precision;            // fp32, bf16, auto (as `vitlens export`); empty: the viewer's default
  int window_w = 1440, window_h = 900;
  std::string last_folder;          // where the file browser last was
  std::string export_folder;
};

constexpr size_t kMaxRecent = 10;

// The settings folder: $XDG_CONFIG_HOME/vitlens, else $HOME/.config/vitlens; empty when neither
// variable is set.
std::string settings_folder();

// A missing file gives the defaults silently; an unreadable or malformed one gives the defaults
// and a one-line `warning` (the viewer then never saves over that file: a hand edit that is not
// valid JSON is not lost). Unknown keys are ignored and bad values fall back one by one (those are
// saved over). A link whose target does not exist yet counts as missing.
Settings load_settings(const std::string& path, std::string* warning);

// Creates the folder when needed; writes atomically. Throws vitlens::Error naming the path.
void save_settings(const std::string& path, const Settings& settings);

// Moves (or inserts) `path` to the front and keeps at most kMaxRecent entries.
void remember_recent(std::vector<std::string>& list, const std::string& path);

}  // namespace vitlens::viewer
