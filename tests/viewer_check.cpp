// Checks for the viewer's ctest entries (tests/CMakeLists.txt, "viewer" block). The viewer runs
// under Xvfb in its own test; this program then reads what it wrote:
//   viewer_check screenshots DIR            heads differ from each other and follow the query
//   viewer_check export VIEWER_DIR CLI_DIR  the viewer's export equals `vitlens export`'s
//   viewer_check bad-file DIR               a bad file leaves the previous image on screen
//   viewer_check png FILE W H               a screenshot of that size that is not blank
//   viewer_check same-png A B               two screenshots are the same picture
//   viewer_check expect-fail TEXT [--no-display] -- CMD...
//                                           CMD fails with one stderr line containing TEXT
//   viewer_check widget-centre DUMP SPEC [--enabled]
//                                           print "X Y", the middle of the widget SPEC in a
//                                           --dump-widgets file (SPEC: its path's last parts);
//                                           --enabled: fail while it is disabled
//   viewer_check widget-point DUMP SPEC FX FY
//                                           print "X Y" at fractions FX, FY of the widget's frame
//   viewer_check window-point DUMP WINDOW FX FY (FY < 0: its title bar)
//   viewer_check below-menu DUMP WINDOW     the window starts below the main menu bar
//   viewer_check widget-value DUMP SPEC     print what the field SPEC shows
//   viewer_check train-step MODEL           print the step a training checkpoint was saved at
//   viewer_check train-record MODEL [/KEY=VALUE ...]
//                                           a checkpoint's training record: one finite, positive
//                                           loss per step run, and each KEY (a JSON pointer) as given
//   viewer_check json FILE [/KEY=VALUE ...]
//                                           each KEY (a JSON pointer) of the JSON file as given
//   viewer_check xdotool DIR                what the xdotool run (viewer_xdotool.sh) left in DIR
//   viewer_check layout DUMP W H            the --dump-widgets / `widgets` file of a W x H window:
//                                           no two windows overlap, each inside the display, every
//                                           widget and text inside its window or scrolled to, no text
//                                           cut off (wider than the room it had)
//   viewer_check layout DUMP W H --only WINDOW
//                                           the same for one window's contents (no overlap check)
//   viewer_check labels-before DUMP WINDOW  each field of WINDOW has its label to its left or above
//   viewer_check text DUMP WINDOW TEXT      a text of WINDOW in the dump holds TEXT
//   viewer_check text-number DUMP WINDOW PREFIX
//                                           print the number after PREFIX in a text of WINDOW
//   viewer_check same-size DUMP             the Controls window's size line and the status bar name
//                                           the same pixels and tokens
//   viewer_check tooltip-clear DUMP MENU    the open tooltip covers no entry of MENU
//   viewer_check skip REASON                exit 77 (ctest SKIP_RETURN_CODE)
// Exit 0 when every check passes, 1 with one line per failed check otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok    " : "FAIL  ") << what << "\n";
  if (!ok) ++g_failures;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

json read_json(const std::string& path) { return json::parse(read_file(path)); }

cv::Mat read_png(const std::string& path) {
  cv::Mat m = cv::imread(path, cv::IMREAD_COLOR);
  if (m.empty()) throw std::runtime_error(path + ": cannot read the PNG");
  return m;
}

// The region of a picture the viewer drew (state JSON "panels": [x, y, w, h] in framebuffer px),
// shrunk by 2 px so outlines on its border do not count.
cv::Mat crop(const cv::Mat& shot, const json& state, const std::string& panel) {
  if (!state["panels"].contains(panel)) throw std::runtime_error("no panel '" + panel + "' in the state file");
  const auto& r = state["panels"][panel];
  cv::Rect rect(static_cast<int>(r[0].get<double>()) + 2, static_cast<int>(r[1].get<double>()) + 2,
                static_cast<int>(r[2].get<double>()) - 4, static_cast<int>(r[3].get<double>()) - 4);
  rect &= cv::Rect(0, 0, shot.cols, shot.rows);
  if (rect.width < 16 || rect.height < 16) throw std::runtime_error("panel '" + panel + "' is not on screen");
  return shot(rect);
}

double mean_abs_diff(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size()) return 1e9;
  cv::Mat d;
  cv::absdiff(a, b, d);
  const cv::Scalar m = cv::mean(d);
  return (m[0] + m[1] + m[2]) / 3.0;
}

// Share of pixels where some channel differs by more than 32 of 255: maps that peak in different
// places differ there, however small the peaks are.
double changed_share(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size()) return 1.0;
  cv::Mat d, per_pixel;
  cv::absdiff(a, b, d);
  cv::Mat channels[3];
  cv::split(d, channels);
  per_pixel = cv::max(channels[0], cv::max(channels[1], channels[2]));
  return static_cast<double>(cv::countNonZero(per_pixel > 32)) / static_cast<double>(per_pixel.total());
}

double spread(const cv::Mat& a) {
  cv::Scalar mean, stddev;
  cv::meanStdDev(a, mean, stddev);
  return (stddev[0] + stddev[1] + stddev[2]) / 3.0;
}

std::vector<std::string> head_panels(const json& state) {
  std::vector<std::string> names;
  for (int h = 0; h < state["heads"].get<int>(); ++h) names.push_back("head" + std::to_string(h));
  names.push_back("mean");
  return names;
}

// [SECTION] screenshots

int check_screenshots(const std::string& dir) {
  const cv::Mat a = read_png(dir + "/a.png"), b = read_png(dir + "/b.png");
  const json sa = read_json(dir + "/a.json"), sb = read_json(dir + "/b.json");
  check(sa["query"] != sb["query"], "the pinned query moved: " + sa["query"].dump() + " -> " + sb["query"].dump());
  check(sa["panels"] == sb["panels"], "same layout in both screenshots");
  const auto names = head_panels(sa);
  check(names.size() >= 3, std::to_string(names.size() - 1) + " head panels plus the mean");
  check(sa["maps"].size() == names.size() && sb["maps"].size() == names.size(), "the state lists every map");
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const cv::Mat pa = crop(a, sa, n), pb = crop(b, sb, n);
    char line[200];
    std::snprintf(line, sizeof line, "%s is a picture, not a flat fill (spread %.1f)", n.c_str(), spread(pa));
    check(spread(pa) > 5.0, line);
    // The map itself moved (its entropy or its centre of mass), and the screen shows it.
    const json& ma = sa["maps"][i];
    const json& mb = sb["maps"][i];
    const double d_entropy = std::abs(ma["entropy"].get<double>() - mb["entropy"].get<double>());
    const double d_centroid = std::hypot(ma["centroid"][0].get<double>() - mb["centroid"][0].get<double>(),
                                         ma["centroid"][1].get<double>() - mb["centroid"][1].get<double>());
    std::snprintf(line, sizeof line, "%s's map follows the query (entropy %+.3f nats, centre of mass moved %.2f patches)",
                  n.c_str(), mb["entropy"].get<double>() - ma["entropy"].get<double>(), d_centroid);
    check(d_entropy > 0.05 || d_centroid > 1.0, line);
    // At least two patches' worth of the panel: where the map's peak was and where it is now (a
    // local head, such as the designed position head on the demo's flat areas, moves only that).
    const double change = changed_share(pa, pb);
    const double patch_share = 1.0 / (sa["grid"][0].get<double>() * sa["grid"][1].get<double>());
    std::snprintf(line, sizeof line, "%s's picture changed on screen (%.2f%% of its pixels, two patches are %.2f%%)",
                  n.c_str(), 100.0 * change, 200.0 * patch_share);
    check(change > 2.0 * patch_share, line);
  }
  // Head against head (the mean may legitimately look like its most peaked head).
  for (size_t i = 0; i + 1 < names.size(); ++i)
    for (size_t j = i + 1; j + 1 < names.size(); ++j) {
      const double d = changed_share(crop(a, sa, names[i]), crop(a, sa, names[j]));
      char line[160];
      std::snprintf(line, sizeof line, "%s and %s differ (%.2f%% of the pixels)", names[i].c_str(), names[j].c_str(),
                    100.0 * d);
      check(d > 0.005, line);
    }
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] export

json without_timings(const std::string& path) {
  json j = read_json(path);
  j.erase("timings_ms");
  j.erase("set");  // each export's own id
  for (auto& f : j["files"]) f = fs::path(f.get<std::string>()).filename().string();
  return j;
}

int check_export(const std::string& viewer_dir, const std::string& cli_dir) {
  std::set<std::string> viewer_files, cli_files;
  for (const auto& e : fs::directory_iterator(viewer_dir)) viewer_files.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(cli_dir)) cli_files.insert(e.path().filename().string());
  check(!cli_files.empty(), "the CLI wrote " + std::to_string(cli_files.size()) + " files");
  check(viewer_files == cli_files, "the viewer wrote the same file names as the CLI");
  for (const std::string& name : cli_files) {
    if (!viewer_files.count(name)) continue;
    const std::string ext = fs::path(name).extension().string();
    if (ext == ".json") {
      check(without_timings(viewer_dir + "/" + name) == without_timings(cli_dir + "/" + name),
            name + " equal apart from timings_ms and the folder in files");
    } else {
      check(read_file(viewer_dir + "/" + name) == read_file(cli_dir + "/" + name), name + " byte for byte");
    }
  }
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] bad-file

int check_bad_file(const std::string& dir) {
  const json before = read_json(dir + "/before.json"), after = read_json(dir + "/after.json");
  const json after_model = read_json(dir + "/after_model.json");
  check(before["ready"] == true, "an image was on screen before");
  check(after["image"] == before["image"], "the image is still " + before["image"].dump());
  check(after["message"]["error"] == true, "the bad image is reported: " + after["message"]["text"].dump());
  check(after["message"]["text"].get<std::string>().find("bad.png") != std::string::npos, "the message names the file");
  check(after_model["model"] == before["model"], "the model is still " + before["model"].dump());
  check(after_model["message"]["error"] == true, "the bad model is reported: " + after_model["message"]["text"].dump());
  const cv::Mat a = read_png(dir + "/before.png"), b = read_png(dir + "/after.png");
  for (const std::string& n : std::vector<std::string>{"image", "head0", "mean"}) {
    const double d = mean_abs_diff(crop(a, before, n), crop(b, after, n));
    char line[160];
    std::snprintf(line, sizeof line, "%s unchanged on screen (mean |diff| %.3f)", n.c_str(), d);
    check(d == 0.0, line);
  }
  check(spread(crop(b, after, "image")) > 5.0, "the image panel still shows a picture");
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] png

int check_png(const std::string& path, int w, int h) {
  const cv::Mat m = read_png(path);
  check(m.cols == w && m.rows == h,
        path + " is " + std::to_string(m.cols) + "x" + std::to_string(m.rows) + " (want " + std::to_string(w) + "x" +
            std::to_string(h) + ")");
  check(spread(m) > 5.0, path + " is not blank");
  return g_failures == 0 ? 0 : 1;
}

// Two screenshots of one window state are the same picture: nothing drawn over either (a dialog,
// the dimming behind it) that the other does not have. A timing in the text (Head statistics'
// "frame 28.7 ms") may change from frame to frame: a few digits, about 0.001 to 0.004 % of the
// pixels (three runs), under the 0.1 % allowed; a dialog covers a third of the window and dims the
// rest.
int check_same_png(const std::string& a_path, const std::string& b_path) {
  const cv::Mat a = read_png(a_path), b = read_png(b_path);
  check(a.size() == b.size(), "both screenshots have one size");
  const double changed = changed_share(a, b);
  char line[600];
  std::snprintf(line, sizeof line, "%s and %s are the same picture (%.3f%% of the pixels differ, at most 0.1%%)",
                a_path.c_str(), b_path.c_str(), 100.0 * changed);
  check(changed < 0.001, line);
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] widgets

// The one visible widget whose path ("WINDOW > SECTION > LABEL") is SPEC or ends with " > SPEC";
// the path may name the widget by its ID label instead ("Train > ##train_save_path": a field
// without a visible label).
const json& find_widget(const json& dump, const std::string& spec) {
  auto names = [&spec](const std::string& path) {
    return path == spec ||
           (path.size() > spec.size() + 3 && path.compare(path.size() - spec.size() - 3, std::string::npos, " > " + spec) == 0);
  };
  const json* found = nullptr;
  int count = 0;
  for (const json& w : dump["widgets"]) {
    std::string id_path = w["window"].get<std::string>();
    for (const json& s : w["sections"]) id_path += " > " + s.get<std::string>();
    id_path += " > " + w["id_label"].get<std::string>();
    if (w["visible"] == true && (names(w["path"].get<std::string>()) || names(id_path))) {
      found = &w;
      ++count;
    }
  }
  if (count != 1) throw std::runtime_error("'" + spec + "' names " + std::to_string(count) + " visible widgets in the dump");
  return *found;
}

// `enabled_only`: the widget must also take input (a test waits for a button to come alive).
int print_widget_centre(const std::string& dump_path, const std::string& spec, bool enabled_only) {
  const json dump = read_json(dump_path);
  const json& w = find_widget(dump, spec);
  if (enabled_only && w["enabled"] != true) throw std::runtime_error("'" + spec + "' is disabled");
  std::cout << static_cast<int>(w["centre"][0].get<double>()) << " " << static_cast<int>(w["centre"][1].get<double>()) << "\n";
  return 0;
}

// After viewer_xdotool.sh: the dump is complete and clash-free, the export button wrote files,
// every quick key tap moved the query, and the clicked settings were saved.
int check_xdotool(const std::string& dir) {
  const json dump = read_json(dir + "/widgets.json");
  check(dump["clashes"].empty(), "no two widgets share an ID: " + dump["clashes"].dump());
  const int w = dump["display"][0].get<int>(), h = dump["display"][1].get<int>();
  int visible = 0, inside = 0;
  std::set<std::string> kinds;
  for (const json& item : dump["widgets"]) {
    if (item["visible"] != true) continue;
    ++visible;
    kinds.insert(item["kind"].get<std::string>());
    const auto& r = item["rect"];
    inside += r[0].get<double>() >= 0 && r[1].get<double>() >= 0 && r[2].get<double>() > 0 && r[3].get<double>() > 0 &&
              r[0].get<double>() + r[2].get<double>() <= w && r[1].get<double>() + r[3].get<double>() <= h;
  }
  check(visible >= 40, std::to_string(visible) + " visible widgets listed");
  check(inside == visible, std::to_string(inside) + " of them inside the " + std::to_string(w) + "x" + std::to_string(h) + " window");
  for (const char* kind : {"button", "checkbox", "radio", "slider", "combo", "menu", "header", "picture", "drop target"})
    check(kinds.count(kind) == 1, std::string("the dump has a ") + kind);

  const std::string exported = dir + "/exports/vitlens-demo.json";
  check(fs::exists(exported), "the Export button wrote " + exported);
  if (fs::exists(exported)) {
    const json e = read_json(exported);
    // From the centre (28, 28): three 12 ms taps of Right, two back-to-back taps of Down.
    check(e["mode"] == "query", "the arrow keys pinned a query: mode " + e["mode"].dump());
    check(e["query"].is_object() && e["query"]["patch"] == json::array({30, 31}),
          "every tap moved the query: (28, 28) -> " + (e["query"].is_object() ? e["query"]["patch"].dump() : std::string("none")) +
              ", want [30, 31]");
    check(e["normalize"] == "log", "the 'log' radio button was pressed: normalize " + e["normalize"].dump());
    // The second export, after the temperature slider was dragged: a CLI setting like the others.
    check(e["temperature"].is_number() && e["temperature"].get<double>() < 0.9,
          "the dragged temperature was exported: temperature " + e["temperature"].dump());
    check(!fs::exists(dir + "/exports/vitlens-demo_view.json"), "no <stem>_view.json for a temperature");
  }
  const json settings = read_json(dir + "/config/vitlens/settings.json");
  check(settings["show_grid"] == true, "the 'patch grid' checkbox was ticked and saved");
  check(settings["export_folder"] == dir + "/exports", "the export folder is remembered: " + settings["export_folder"].dump());
  return g_failures == 0 ? 0 : 1;
}

// A point in the widget SPEC: FX, FY are fractions of its frame (0.5 0.5: the middle).
int print_widget_point(const std::string& dump_path, const std::string& spec, double fx, double fy) {
  const json dump = read_json(dump_path);
  const json& w = find_widget(dump, spec);
  const auto& f = w["frame"];
  std::cout << static_cast<int>(f[0].get<double>() + fx * f[2].get<double>()) << " "
            << static_cast<int>(f[1].get<double>() + fy * f[3].get<double>()) << "\n";
  return 0;
}

// A window's point: FX, FY of its rectangle, and the title bar's middle for FY < 0 (where a user
// grabs it to drag the window).
int print_window_point(const std::string& dump_path, const std::string& name, double fx, double fy) {
  const json dump = read_json(dump_path);
  for (const json& w : dump["windows"])
    if (w["name"] == name) {
      const auto& r = w["rect"];
      const double y = fy < 0.0 ? r[1].get<double>() + 9.0 : r[1].get<double>() + fy * r[3].get<double>();
      std::cout << static_cast<int>(r[0].get<double>() + fx * r[2].get<double>()) << " " << static_cast<int>(y) << "\n";
      return 0;
    }
  throw std::runtime_error("no window '" + name + "' in the dump");
}

// Passes when window NAME's rectangle starts below the main menu bar (at or below its height).
int check_below_menu(const std::string& dump_path, const std::string& name) {
  const json dump = read_json(dump_path);
  double menu_bottom = -1.0, top = -1.0;
  for (const json& w : dump["windows"]) {
    if (w["name"] == "##MainMenuBar") menu_bottom = w["rect"][1].get<double>() + w["rect"][3].get<double>();
    if (w["name"] == name) top = w["rect"][1].get<double>();
  }
  if (menu_bottom < 0.0 || top < 0.0) throw std::runtime_error("no menu bar or no window '" + name + "' in the dump");
  if (top < menu_bottom) {
    std::cerr << "viewer_check below-menu: window '" << name << "' starts at y " << top << ", over the menu bar (ends at "
              << menu_bottom << ")\n";
    return 1;
  }
  return 0;
}

// What a text or number field of the dump shows.
int print_widget_value(const std::string& dump_path, const std::string& spec) {
  const json dump = read_json(dump_path);
  const json& w = find_widget(dump, spec);
  if (!w.contains("value")) throw std::runtime_error("'" + spec + "' is not a text or number field");
  std::cout << w["value"].get<std::string>() << "\n";
  return 0;
}

// [SECTION] layout (viewer_layout_*)

struct Box {
  double x = 0, y = 0, w = 0, h = 0;
};

Box box_of(const json& r) { return Box{r[0].get<double>(), r[1].get<double>(), r[2].get<double>(), r[3].get<double>()}; }

double overlap_area(const Box& a, const Box& b) {
  const double w = std::min(a.x + a.w, b.x + b.w) - std::max(a.x, b.x);
  const double h = std::min(a.y + a.h, b.y + b.h) - std::max(a.y, b.y);
  return w > 0 && h > 0 ? w * h : 0.0;
}

std::string box_text(const Box& b) {
  char t[96];
  std::snprintf(t, sizeof t, "[%.0f, %.0f, %.0f x %.0f]", b.x, b.y, b.w, b.h);
  return t;
}

// What a window's contents can show: its visible part, stretched by how far it scrolls; the main
// menu bar's menus sit in the bar itself.
Box reachable(const json& window) {
  if (window["kind"] == "menu bar") return box_of(window["rect"]);
  Box v = box_of(window["visible"]);
  const double sx = window["scroll"][0].get<double>(), sy = window["scroll"][1].get<double>();
  const double mx = window["scroll_max"][0].get<double>(), my = window["scroll_max"][1].get<double>();
  return Box{v.x - sx, v.y - sy, v.w + mx, v.h + my};
}

bool inside(const Box& inner, const Box& outer, double slack = 1.0) {
  return inner.x >= outer.x - slack && inner.y >= outer.y - slack && inner.x + inner.w <= outer.x + outer.w + slack &&
         inner.y + inner.h <= outer.y + outer.h + slack;
}

// `only`: check that window alone (an on-demand window such as Train, which opens over others).
int check_layout(const std::string& dump_path, int want_w, int want_h, const std::string& only) {
  const json dump = read_json(dump_path);
  const int w = dump["display"][0].get<int>(), h = dump["display"][1].get<int>();
  check(w == want_w && h == want_h, "the window is " + std::to_string(w) + "x" + std::to_string(h) + " (want " +
                                        std::to_string(want_w) + "x" + std::to_string(want_h) + ")");
  check(dump["clashes"].empty(), "no two widgets share an ID: " + dump["clashes"].dump());
  std::map<std::string, const json*> windows;
  std::vector<const json*> tiled;  // the windows side by side (not menus, popups, tooltips or child windows)
  for (const json& win : dump["windows"]) {
    windows[win["name"].get<std::string>()] = &win;
    const std::string kind = win["kind"].get<std::string>();
    if (kind == "window" && (only.empty() || win["name"] == only)) tiled.push_back(&win);
  }
  check(tiled.size() >= (only.empty() ? 5u : 1u), std::to_string(tiled.size()) + " windows side by side");
  // Whether an item of window `name` is checked: all, or those of `only` and its child windows.
  auto counted = [&only](const std::string& name) { return only.empty() || name == only || name.rfind(only + "/", 0) == 0; };
  const Box display{0, 0, static_cast<double>(w), static_cast<double>(h)};
  for (size_t i = 0; i < tiled.size(); ++i) {
    const std::string name = (*tiled[i])["name"].get<std::string>();
    const Box a = box_of((*tiled[i])["rect"]);
    check(inside(a, display, 0.0), name + " " + box_text(a) + " is inside the display");
    for (size_t j = i + 1; j < tiled.size(); ++j) {
      const Box b = box_of((*tiled[j])["rect"]);
      const double area = overlap_area(a, b);
      check(area == 0.0, name + " and " + (*tiled[j])["name"].get<std::string>() + " do not overlap (" +
                             std::to_string(static_cast<long>(area)) + " px^2 in common)");
    }
  }
  // A child window (a table that scrolls) must itself be reachable in its parent.
  int children = 0, children_ok = 0;
  for (const auto& [name, win] : windows) {
    const std::string parent = (*win)["parent"].get<std::string>();
    if (parent.empty() || !windows.count(parent)) continue;
    ++children;
    const bool ok = inside(box_of((*win)["rect"]), reachable(*windows[parent]));
    children_ok += ok;
    if (!ok) check(false, "child window " + name + " " + box_text(box_of((*win)["rect"])) + " is outside " + parent);
  }
  check(children == children_ok, std::to_string(children_ok) + " of " + std::to_string(children) + " child windows inside their window");
  int widgets = 0, widgets_ok = 0;
  for (const json& item : dump["widgets"]) {
    const std::string window = item["window"].get<std::string>();
    if (!windows.count(window) || !counted(window)) continue;  // the drop target (the whole window)
    ++widgets;
    const Box r = box_of(item["rect"]);
    const bool ok = inside(r, reachable(*windows[window]));
    widgets_ok += ok;
    if (!ok) check(false, item["path"].get<std::string>() + " " + box_text(r) + " is outside what " + window + " shows or scrolls to");
  }
  check(widgets >= (only.empty() ? 40 : 5) && widgets == widgets_ok,
        std::to_string(widgets_ok) + " of " + std::to_string(widgets) + " widgets inside their window or scrolled to");
  int texts = 0, texts_ok = 0;
  for (const json& t : dump["texts"]) {
    const std::string window = t["window"].get<std::string>();
    if (!windows.count(window) || !counted(window)) continue;
    ++texts;
    const Box r = box_of(t["rect"]);
    const double width = t["width"].get<double>(), room = t["room"].get<double>();
    const bool fits = width <= room + 1.0;
    const bool reached = inside(r, reachable(*windows[window]));
    texts_ok += fits && reached;
    char line[160];
    std::snprintf(line, sizeof line, " needs %.0f px, has %.0f", width, room);
    if (!fits) check(false, window + ": text cut off: '" + t["text"].get<std::string>() + "'" + line);
    if (!reached) check(false, window + ": text outside what the window shows or scrolls to: '" + t["text"].get<std::string>() + "'");
  }
  check(texts >= (only.empty() ? 20 : 3) && texts == texts_ok, std::to_string(texts_ok) + " of " + std::to_string(texts) + " texts whole and reachable");
  return g_failures == 0 ? 0 : 1;
}

// Every labelled field of WINDOW: a text equal to its label ends left of the field on the same
// row, or sits just above it ("limit [ 24 ]", not "[ 24 ] limit").
int check_labels_before(const std::string& dump_path, const std::string& window) {
  const json dump = read_json(dump_path);
  int fields = 0;
  for (const json& item : dump["widgets"]) {
    if (item["window"] != window || item["kind"] != "input" || item["label"].get<std::string>().empty()) continue;
    ++fields;
    const Box f = box_of(item["rect"]);
    bool before = false;
    for (const json& t : dump["texts"]) {
      if (t["window"] != window || t["text"] != item["label"]) continue;
      const Box l = box_of(t["rect"]);
      const bool left = l.x + l.w <= f.x + 1.0 && l.y < f.y + f.h && l.y + l.h > f.y;
      const bool above = l.y + l.h <= f.y + 1.0 && f.y - (l.y + l.h) < 8.0 && std::abs(l.x - f.x) < 8.0;
      before = before || left || above;
    }
    check(before, window + ": '" + item["label"].get<std::string>() + "' " + box_text(f) + " has its label before it");
  }
  check(fields >= 5, std::to_string(fields) + " labelled fields in " + window);
  return g_failures == 0 ? 0 : 1;
}

// The texts of WINDOW in the dump, one per line.
std::vector<std::string> texts_of(const json& dump, const std::string& window) {
  std::vector<std::string> out;
  for (const json& t : dump["texts"])
    if (t["window"] == window) out.push_back(t["text"].get<std::string>());
  return out;
}

int check_text(const std::string& dump_path, const std::string& window, const std::string& text) {
  const json dump = read_json(dump_path);
  bool found = false;
  std::string all;
  for (const std::string& t : texts_of(dump, window)) {
    found = found || t.find(text) != std::string::npos;
    all += "\n      " + t;
  }
  check(found, window + " shows '" + text + "'" + (found ? std::string() : "; it shows:" + all));
  return g_failures == 0 ? 0 : 1;
}

// The whole number after PREFIX in the first text of WINDOW holding PREFIX ("step " in "running:
// step 12 of 400"); fails when there is none.
int print_text_number(const std::string& dump_path, const std::string& window, const std::string& prefix) {
  const json dump = read_json(dump_path);
  for (const std::string& t : texts_of(dump, window)) {
    const auto at = t.find(prefix);
    if (at == std::string::npos) continue;
    const std::string rest = t.substr(at + prefix.size());
    const size_t digits = rest.find_first_not_of("0123456789");
    if (digits == 0) continue;
    std::cout << rest.substr(0, digits) << "\n";
    return 0;
  }
  throw std::runtime_error(window + " shows no '" + prefix + "N'");
}

// "W x H px" and "N tokens" of a line ("... 28x20 px, grid 5x7, 36 tokens").
// "N tokens" of a line, and the "WxH" before " px" when it names one ("28x20 px, grid 5x7, 36 tokens").
bool size_and_tokens(const std::string& line, std::string& px, std::string& tokens) {
  const auto t = line.find(" tokens");
  if (t == std::string::npos) return false;
  const auto t0 = line.rfind(' ', t - 1);
  tokens = line.substr(t0 == std::string::npos ? 0 : t0 + 1, t - (t0 == std::string::npos ? 0 : t0 + 1));
  const auto p = line.find(" px");
  if (p == std::string::npos) return true;
  const auto p0 = line.rfind(' ', p - 1);
  px = line.substr(p0 == std::string::npos ? 0 : p0 + 1, p - (p0 == std::string::npos ? 0 : p0 + 1));
  return true;
}

int check_same_size(const std::string& dump_path) {
  const json dump = read_json(dump_path);
  std::string status_px, status_tokens, controls_px, controls_tokens, status_line, controls_line;
  for (const std::string& t : texts_of(dump, "##status"))
    if (status_line.empty() && size_and_tokens(t, status_px, status_tokens)) status_line = t;
  for (const std::string& t : texts_of(dump, "Controls"))
    if (controls_line.empty() && size_and_tokens(t, controls_px, controls_tokens))
      controls_line = t;
  check(!status_line.empty(), "the status bar names the size and tokens: '" + status_line + "'");
  check(!controls_line.empty(), "the Controls window names the size and tokens: '" + controls_line + "'");
  check(status_tokens == controls_tokens && (controls_px.empty() || status_px == controls_px),
        "both say the same: Controls '" + controls_line + "', status bar '" + status_line + "'");
  return g_failures == 0 ? 0 : 1;
}

// The tooltip shown while an entry of MENU is hovered covers none of the menu's entries.
int check_tooltip_clear(const std::string& dump_path, const std::string& menu) {
  const json dump = read_json(dump_path);
  std::vector<Box> tips;
  for (const json& win : dump["windows"])
    if (win["kind"] == "tooltip") tips.push_back(box_of(win["rect"]));
  check(tips.size() == 1, std::to_string(tips.size()) + " tooltip open");
  int entries = 0;
  for (const json& item : dump["widgets"]) {
    const auto& sections = item["sections"];
    if (sections.empty() || sections.back() != menu || item["kind"] != "menu item") continue;
    ++entries;
    for (const Box& tip : tips)
      check(overlap_area(tip, box_of(item["rect"])) == 0.0,
            "the tooltip " + box_text(tip) + " leaves '" + item["label"].get<std::string>() + "' " + box_text(box_of(item["rect"])) + " clear");
  }
  check(entries >= 2, std::to_string(entries) + " entries in the " + menu + " menu");
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] training checkpoints (viewer_xdotool.sh train-mae)

// A checkpoint's __metadata__["training"] record: the safetensors header is 8 bytes of
// little-endian length, then JSON; the record is a JSON string inside it.
json read_training_record(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char size_bytes[8] = {};
  if (!in.read(reinterpret_cast<char*>(size_bytes), 8)) throw std::runtime_error(path + ": cannot read a safetensors header");
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | size_bytes[i];
  if (size == 0 || size > (1u << 26)) throw std::runtime_error(path + ": not a safetensors file");
  std::string header(size, '\0');
  if (!in.read(&header[0], static_cast<std::streamsize>(size))) throw std::runtime_error(path + ": truncated header");
  const json h = json::parse(header);
  if (!h.contains("__metadata__") || !h["__metadata__"].contains("training"))
    throw std::runtime_error(path + ": no training record in __metadata__");
  return json::parse(h["__metadata__"]["training"].get<std::string>());
}

int print_train_step(const std::string& path) {
  std::cout << read_training_record(path).at("step").get<long long>() << "\n";
  return 0;
}

// Each "/KEY=VALUE": `r` at that JSON pointer equals VALUE (numbers within 1e-9 relative,
// anything else exactly; VALUE is read as JSON, else as a string). `what` names r in the lines.
void check_keys(const json& r, const std::vector<std::string>& expected, const std::string& what) {
  for (const std::string& e : expected) {
    const auto eq = e.find('=');
    if (e.empty() || e[0] != '/' || eq == std::string::npos) throw std::runtime_error("'" + e + "' is not /KEY=VALUE");
    const json::json_pointer pointer(e.substr(0, eq));
    const std::string text = e.substr(eq + 1);
    json want = json::parse(text, nullptr, false);
    if (want.is_discarded()) want = text;
    if (!r.contains(pointer)) {
      check(false, e.substr(0, eq) + " is in " + what);
      continue;
    }
    const json& got = r.at(pointer);
    bool same = got == want;
    if (got.is_number() && want.is_number()) {
      const double g = got.get<double>(), w = want.get<double>();
      same = std::fabs(g - w) <= 1e-9 * std::max(1.0, std::fabs(w));
    }
    check(same, e.substr(0, eq) + " is " + got.dump() + " (typed: " + want.dump() + ")");
  }
}

int check_train_record(const std::string& path, const std::vector<std::string>& expected) {
  const json r = read_training_record(path);
  const long long step = r.at("step").get<long long>();
  check(step >= 1, path + " was saved after " + std::to_string(step) + " step(s)");
  const json& loss = r.contains("train_loss") ? r["train_loss"] : json::array();
  // A long run keeps only its latest losses, from train_loss_first_step on (train_session.hpp).
  const long long first = r.contains("train_loss_first_step") ? r["train_loss_first_step"].get<long long>() : 1;
  check(loss.is_array() && static_cast<long long>(loss.size()) == step - first + 1,
        "one training loss per step: " + std::to_string(loss.size()) + " for steps " + std::to_string(first) +
            " to " + std::to_string(step));
  int good = 0;
  for (const json& v : loss) good += v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0.0;
  check(good == static_cast<int>(loss.size()), std::to_string(good) + " of the losses are finite and positive");
  check_keys(r, expected, "the training record");
  return g_failures == 0 ? 0 : 1;
}

// A JSON file (an export's record, a `state` file) with each KEY as given.
int check_json_file(const std::string& path, const std::vector<std::string>& expected) {
  check_keys(read_json(path), expected, path);
  return g_failures == 0 ? 0 : 1;
}

// [SECTION] expect-fail

int expect_fail(const std::string& text, bool no_display, const std::vector<std::string>& command) {
  const std::string err_path = fs::temp_directory_path().string() + "/viewer_check_" + std::to_string(::getpid()) + ".err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (no_display) {
      ::unsetenv("DISPLAY");
      ::unsetenv("WAYLAND_DISPLAY");
    }
    if (!std::freopen(err_path.c_str(), "w", stderr)) std::_Exit(126);
    std::vector<char*> argv;
    for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string err = read_file(err_path);
  fs::remove(err_path);
  std::cout << "stderr: " << err;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  check(code != 0 && code != 127, "exits non-zero (" + std::to_string(code) + ")");
  // xvfb-run's own complaints (say "problem while cleaning up temporary directory" when two test
  // displays end together) are the harness's, not vitlens' output: left out of the count.
  std::string own;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("xvfb-run: ", 0) != 0) own += line + "\n";
  size_t lines = 0;
  for (char c : own) lines += c == '\n';
  check(lines == 1, "one line on stderr (" + std::to_string(lines) + ")");
  check(own.rfind("vitlens: ", 0) == 0, "it starts with 'vitlens: '");
  check(own.find(text) != std::string::npos, "it mentions '" + text + "'");
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "screenshots") return check_screenshots(args[1]);
    if (args.size() == 3 && args[0] == "export") return check_export(args[1], args[2]);
    if (args.size() == 2 && args[0] == "bad-file") return check_bad_file(args[1]);
    if (args.size() == 4 && args[0] == "png") return check_png(args[1], std::atoi(args[2].c_str()), std::atoi(args[3].c_str()));
    if (args.size() == 3 && args[0] == "same-png") return check_same_png(args[1], args[2]);
    if (args.size() == 3 && args[0] == "widget-centre") return print_widget_centre(args[1], args[2], false);
    if (args.size() == 4 && args[0] == "widget-centre" && args[3] == "--enabled")
      return print_widget_centre(args[1], args[2], true);
    if (args.size() == 5 && args[0] == "widget-point")
      return print_widget_point(args[1], args[2], std::atof(args[3].c_str()), std::atof(args[4].c_str()));
    if (args.size() == 3 && args[0] == "widget-value") return print_widget_value(args[1], args[2]);
    if (args.size() == 5 && args[0] == "window-point")
      return print_window_point(args[1], args[2], std::atof(args[3].c_str()), std::atof(args[4].c_str()));
    if (args.size() == 3 && args[0] == "below-menu") return check_below_menu(args[1], args[2]);
    if (args.size() == 2 && args[0] == "train-step") return print_train_step(args[1]);
    if (args.size() >= 2 && args[0] == "train-record")
      return check_train_record(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
    if (args.size() >= 2 && args[0] == "json")
      return check_json_file(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
    if (args.size() == 2 && args[0] == "xdotool") return check_xdotool(args[1]);
    if (args.size() == 4 && args[0] == "layout")
      return check_layout(args[1], std::atoi(args[2].c_str()), std::atoi(args[3].c_str()), "");
    if (args.size() == 6 && args[0] == "layout" && args[4] == "--only")
      return check_layout(args[1], std::atoi(args[2].c_str()), std::atoi(args[3].c_str()), args[5]);
    if (args.size() == 3 && args[0] == "labels-before") return check_labels_before(args[1], args[2]);
    if (args.size() == 4 && args[0] == "text") return check_text(args[1], args[2], args[3]);
    if (args.size() == 2 && args[0] == "same-size") return check_same_size(args[1]);
    if (args.size() == 4 && args[0] == "text-number") return print_text_number(args[1], args[2], args[3]);
    if (args.size() == 3 && args[0] == "tooltip-clear") return check_tooltip_clear(args[1], args[2]);
    if (args.size() >= 2 && args[0] == "skip") {
      std::cout << "skipped: " << args[1] << "\n";
      return 77;
    }
    if (args.size() >= 4 && args[0] == "expect-fail") {
      size_t i = 2;
      bool no_display = false;
      if (args[i] == "--no-display") {
        no_display = true;
        ++i;
      }
      if (i < args.size() && args[i] == "--") ++i;
      return expect_fail(args[1], no_display, std::vector<std::string>(args.begin() + static_cast<long>(i), args.end()));
    }
  } catch (const std::exception& e) {
    std::cout << "FAIL  " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: viewer_check screenshots DIR | export VIEWER_DIR CLI_DIR | bad-file DIR | png FILE W H | "
               "widget-centre DUMP SPEC [--enabled] | widget-point DUMP SPEC FX FY | widget-value DUMP SPEC | "
               "window-point DUMP WINDOW FX FY | below-menu DUMP WINDOW | layout DUMP W H | text DUMP WINDOW TEXT | "
               "layout DUMP W H --only WINDOW | labels-before DUMP WINDOW | same-size DUMP | text-number DUMP WINDOW PREFIX | tooltip-clear DUMP MENU | train-step MODEL | train-record MODEL [/KEY=VALUE ...] | json FILE [/KEY=VALUE ...] | xdotool DIR | expect-fail TEXT [--no-display] -- CMD... | skip REASON\n";
  return 2;
}
