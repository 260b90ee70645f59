// Persisted viewer settings (see settings.hpp).
#include "control/settings.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/utf8.hpp"
#include "core/io/files.hpp"
#include "core/io/json_text.hpp"

namespace vitlens::viewer {

namespace fs = std::filesystem;

std::string settings_folder() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) return std::string(xdg) + "/vitlens";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.config/vitlens";
  return {};
}

namespace {

constexpr uint64_t kMaxSettingsBytes = 16u << 20;  // a settings file is a few hundred bytes

// A number clamped to [lo, hi] before it becomes an int (1e300 converted to an int would be
// undefined); a value of another type keeps the default.
void read_int(const nlohmann::json& j, const char* key, int& out, int lo, int hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return;
  out = static_cast<int>(std::clamp(it->get<double>(), static_cast<double>(lo), static_cast<double>(hi)));
}

template <typename T>
void read_key(const nlohmann::json& j, const char* key, T& out) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    // a value of the wrong type keeps the default
  }
}

void read_list(const nlohmann::json& j, const char* key, std::vector<std::string>& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return;
  out.clear();
  for (const auto& v : *it)
    if (v.is_string() && !v.get<std::string>().empty() && out.size() < kMaxRecent) out.push_back(v.get<std::string>());
}

}  // namespace

Settings load_settings(const std::string& path, std::string* warning) {
  Settings s;
  struct stat st {};
  if (path.empty() || ::lstat(path.c_str(), &st) != 0) return s;
  // A link to settings kept elsewhere whose target does not exist yet: nothing to read or lose.
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0 && errno == ENOENT) return s;
  // read_whole_file refuses a pipe or a device (which would block or never end) from stat.
  std::string text;
  try {
    text = read_whole_file(path, "a settings file", kMaxSettingsBytes);
  } catch (const Error& e) {
    if (warning) *warning = std::string(e.what()) + "; using the default settings (the file is left as it is)";
    return s;
  }
  nlohmann::json j = parse_json_or_discarded(text);
  if (j.is_discarded() || !j.is_object()) {
    if (warning)
      *warning = path + ": settings are not a JSON object; using the defaults (the file is left as it is: mend or "
                        "remove it to have settings saved again)";
    return s;
  }
  read_list(j, "recent_images", s.recent_images);
  read_list(j, "recent_models", s.recent_models);
  read_key(j, "colormap", s.colormap);
  if (const auto it = j.find("alpha"); it != j.end() && it->is_number()) {  // in [0, 1] as a double first
    const double alpha = it->get<double>();
    if (alpha >= 0.0 && alpha <= 1.0) s.alpha = static_cast<float>(alpha);
  }
  read_key(j, "normalize", s.normalize);
  read_key(j, "upsample", s.upsample);
  read_key(j, "show_grid", s.show_grid);
  read_key(j, "precision", s.precision);
  read_int(j, "window_w", s.window_w, 640, 8192);
  read_int(j, "window_h", s.window_h, 480, 8192);
  read_key(j, "last_folder", s.last_folder);
  read_key(j, "export_folder", s.export_folder);
  // Values a user could have typed into the file are clamped, not trusted.
  if (!(s.alpha >= 0.0f && s.alpha <= 1.0f)) s.alpha = 0.6f;
  return s;
}

void save_settings(const std::string& given, const Settings& s) {
  // A link (dotfiles kept elsewhere) is written through, not replaced by a file; a pipe, a device
  // or a folder at the name is left alone.
  std::string path = given;
  struct stat st {};
  for (int hops = 0; hops < 40 && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++hops) {
    std::error_code link_error;
    const fs::path target = fs::read_symlink(path, link_error);
    if (link_error) break;
    path = (target.is_absolute() ? target : fs::path(path).parent_path() / target).string();
  }
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(path + ": is not a regular file; the settings were not saved");
  const fs::path folder = fs::path(path).parent_path();
  std::error_code ec;
  if (!folder.empty()) fs::create_directories(folder, ec);
  if (ec) throw Error(folder.string() + ": cannot create the settings folder (" + ec.message() + ")");
  // JSON holds UTF-8 only: a path in another encoding is left out (not remembered), never
  // written changed or allowed to stop the save.
  const auto utf8_paths = [](const std::vector<std::string>& list) {
    std::vector<std::string> kept;
    for (const std::string& p : list)
      if (is_valid_utf8(p)) kept.push_back(p);
    return kept;
  };
  const auto utf8_path = [](const std::string& p) { return is_valid_utf8(p) ? p : std::string(); };
  const nlohmann::json j = {
      {"recent_images", utf8_paths(s.recent_images)}, {"recent_models", utf8_paths(s.recent_models)},
      {"colormap", s.colormap},                  {"alpha", s.alpha},
      {"normalize", s.normalize},                {"upsample", s.upsample},
      {"show_grid", s.show_grid},                {"window_w", s.window_w},
      {"window_h", s.window_h},                  {"precision", s.precision},
      {"last_folder", utf8_path(s.last_folder)}, {"export_folder", utf8_path(s.export_folder)},
  };
  write_file_atomic(path, j.dump(2) + "\n");
}

void remember_recent(std::vector<std::string>& list, const std::string& path) {
  if (path.empty()) return;
  list.erase(std::remove(list.begin(), list.end(), path), list.end());
  list.insert(list.begin(), path);
  if (list.size() > kMaxRecent) list.resize(kMaxRecent);
}

}  // namespace vitlens::viewer
