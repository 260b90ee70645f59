// Checks for the viewer's ctest entries (tests/CMakeLists.txt, "viewer" block). The viewer runs
// under Xvfb in its own test; this program then reads what it wrote:
//   viewer_check screenshots DIR            heads differ from each other and follow the query
//   viewer_check export VIEWER_DIR CLI_DIR  the viewer's export equals `vitlens export`'s
//   viewer_check bad-file DIR               a bad file leaves the previous image on screen
//   viewer_check png FILE W H               a screenshot of that size that is not blank
//   viewer_check expect-fail TEXT [--no-display] -- CMD...
//                                           CMD fails with one stderr line containing TEXT
//   viewer_check skip REASON                exit 77 (ctest SKIP_RETURN_CODE)
// Exit 0 when every check passes, 1 with one line per failed check otherwise.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
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
    const double change = changed_share(pa, pb);
    std::snprintf(line, sizeof line, "%s's picture changed on screen (%.2f%% of its pixels)", n.c_str(), 100.0 * change);
    check(change > 0.005, line);
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
  size_t lines = 0;
  for (char c : err) lines += c == '\n';
  check(lines == 1, "one line on stderr (" + std::to_string(lines) + ")");
  check(err.rfind("vitlens: ", 0) == 0, "it starts with 'vitlens: '");
  check(err.find(text) != std::string::npos, "it mentions '" + text + "'");
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
               "expect-fail TEXT [--no-display] -- CMD... | skip REASON\n";
  return 2;
}
