// Script parsing (see script.hpp). Values are checked here so a bad script fails before a window
// opens; ranges that depend on the image (grid, layers) are checked when the command runs.
#include "control/script.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/base/error.hpp"
#include "core/render/heatmap.hpp"
#include "training/train_panel.hpp"

namespace vitlens::viewer {

bool parse_int_arg(const std::string& token, int& out) {
  if (token.empty()) return false;
  char* end = nullptr;
  const long v = std::strtol(token.c_str(), &end, 10);
  if (*end != '\0' || v < -1000000 || v > 1000000) return false;
  out = static_cast<int>(v);
  return true;
}

bool parse_float_arg(const std::string& token, float& out) {
  if (token.empty()) return false;
  char* end = nullptr;
  const float v = std::strtof(token.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  out = v;
  return true;
}

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return true;
  return false;
}

// A comment is a '#' that starts the line or stands alone as a word ("pin 3 4  # why"); a '#'
// inside a word is text, as in the widget IDs "##mass" and "...##export".
size_t comment_start(const std::string& line) {
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '#') continue;
    const bool word_start = i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t';
    const bool word_end = i + 1 == line.size() || line[i + 1] == ' ' || line[i + 1] == '\t';
    if ((word_start && word_end) || line.find_first_not_of(" \t") == i) return i;
  }
  return line.size();
}

// "LABEL at 0.2 0.3" -> {LABEL, 0.2, 0.3}; "LABEL to 1" -> {LABEL, 1}; otherwise {LABEL}.
std::vector<std::string> split_tail(const std::string& rest, const std::string& marker) {
  const auto at = rest.rfind(marker);
  if (at == std::string::npos) return {rest};
  std::vector<std::string> out = {trim(rest.substr(0, at))};
  std::istringstream numbers(rest.substr(at + marker.size()));
  std::string w;
  float f = 0.0f;
  while (numbers >> w) {
    if (!parse_float_arg(w, f)) return {rest};  // " at " inside a label, not numbers after it
    out.push_back(w);
  }
  return out;
}

// Checks one command; returns an empty string when fine, else the reason.
std::string check(const ScriptCommand& c) {
  const auto& a = c.args;
  const size_t n = a.size();
  int i = 0;
  float f = 0.0f;
  const std::string& v = c.verb;
  if (v == "open" || v == "model" || v == "screenshot" || v == "state" || v == "drop" || v == "widgets" || v == "expect-file")
    return n == 1 && !a[0].empty() ? "" : "expects a path: " + v + " PATH";
  if (v == "export") {
    if (n == 1 || (n == 2 && a[1] == "raw")) return "";
    return "expects: export DIR [raw]";
  }
  if (v == "pin" || v == "hover" || v == "paint" || v == "erase")
    return n == 2 && parse_int_arg(a[0], i) && parse_int_arg(a[1], i) ? "" : "expects: " + v + " ROW COL";
  if (v == "key")
    return n == 1 && one_of(a[0], {"left", "right", "up", "down", "escape", "enter", "tab"})
               ? ""
               : "expects: key left|right|up|down|escape|enter|tab";
  if (v == "click") {
    float fy = 0.0f;
    if (n == 1 && !a[0].empty()) return "";
    if (n == 3 && parse_float_arg(a[1], f) && parse_float_arg(a[2], fy) && f >= 0.0f && f <= 1.0f && fy >= 0.0f && fy <= 1.0f)
      return "";
    return "expects: click LABEL [at FX FY] (LABEL may be WINDOW > SECTION > LABEL; FX, FY from 0 to 1)";
  }
  if (v == "drag")
    return n == 2 && parse_float_arg(a[1], f) && f >= 0.0f && f <= 1.0f ? "" : "expects: drag LABEL to T (T from 0 to 1)";
  if (v == "expect" || v == "expect-contains")
    return n == 2 && !a[0].empty() ? "" : "expects: " + v + " KEY VALUE (KEY as in the state file, e.g. normalize or show/heads)";
  if (v == "mode")
    return n == 1 && one_of(a[0], {"query", "cls", "received", "rollout"}) ? "" : "expects: mode query|cls|received|rollout";
  if (v == "layer") return n == 1 && parse_int_arg(a[0], i) && i >= 0 ? "" : "expects: layer N (N >= 0)";
  if (v == "token") {
    const bool reg = a.size() == 1 && a[0].size() > 3 && a[0].compare(0, 3, "reg") == 0 && parse_int_arg(a[0].substr(3), i) && i >= 0;
    return n == 1 && (one_of(a[0], {"patch", "cls", "dist"}) || reg) ? "" : "expects: token patch|cls|dist|regK";
  }
  if (v == "head") return n == 1 && (a[0] == "all" || (parse_int_arg(a[0], i) && i >= 0)) ? "" : "expects: head N|all";
  if (v == "rollout") {
    int j = 0;
    if (n == 1 && one_of(a[0], {"on", "off"})) return "";
    if (n == 2 && a[0] == "fusion" && one_of(a[1], {"mean", "max", "min"})) return "";
    if (n == 2 && a[0] == "from" && one_of(a[1], {"cls", "query"})) return "";
    if (n == 2 && a[0] == "discard" && parse_float_arg(a[1], f) && f >= 0.0f && f < 1.0f) return "";
    if (n == 3 && a[0] == "layers" && parse_int_arg(a[1], i) && parse_int_arg(a[2], j) && i >= 0 && j >= i) return "";
    return "expects: rollout on|off | rollout fusion mean|max|min | rollout discard R (0 <= R < 1) | "
           "rollout layers A B (0 <= A <= B) | rollout from cls|query";
  }
  if (v == "colormap") {
    if (n == 1 && is_colormap(a[0])) return "";
    std::string known;
    for (const auto& name : colormap_names()) known += (known.empty() ? "" : ", ") + name;
    return "expects: colormap NAME (" + known + ")";
  }
  if (v == "alpha") return n == 1 && parse_float_arg(a[0], f) && f >= 0.0f && f <= 1.0f ? "" : "expects: alpha A (0 to 1)";
  if (v == "normalize")
    return n == 1 && one_of(a[0], {"robust", "head", "shared", "log"}) ? "" : "expects: normalize robust|head|shared|log";
  if (v == "upsample") return n == 1 && one_of(a[0], {"nearest", "bilinear"}) ? "" : "expects: upsample nearest|bilinear";
  if (v == "threshold")
    return n == 1 && (a[0] == "off" || (parse_float_arg(a[0], f) && f > 0.0f && f <= 1.0f)) ? ""
                                                                                            : "expects: threshold off|T (0 < T <= 1)";
  if (v == "grid") return n == 1 && one_of(a[0], {"on", "off"}) ? "" : "expects: grid on|off";
  if (v == "mask")
    return n == 1 && one_of(a[0], {"none", "padding", "causal", "painted"}) ? "" : "expects: mask none|padding|causal|painted";
  if (v == "clear-paint" || v == "quit") return n == 0 ? "" : "takes no arguments";
  if (v == "scale") {
    if (n == 1 && one_of(a[0], {"default", "none"})) return "";
    if (n == 2 && a[0] == "temperature" && parse_float_arg(a[1], f) && f >= 0.05f && f <= 20.0f) return "";
    return "expects: scale default|none|temperature T (0.05 to 20)";
  }
  if (v == "size")
    return n == 1 && (a[0] == "default" || (parse_int_arg(a[0], i) && i >= 64 && i <= 512)) ? ""
                                                                                            : "expects: size default|N (64 to 512)";
  if (v == "show")
    return n == 2 && one_of(a[0], {"image", "heads", "controls", "inspector", "stats", "example", "train", "layers"}) &&
                   one_of(a[1], {"on", "off"})
               ? ""
               : "expects: show image|heads|controls|inspector|stats|example|train|layers on|off";
  if (v == "example") {
    if (n == 1 && a[0] == "reset") return "";
    if (n == 2 && a[0] == "scaled" && one_of(a[1], {"on", "off"})) return "";
    int r = 0, col = 0;
    if (n == 4 && one_of(a[0], {"q", "k", "v"}) && parse_int_arg(a[1], r) && parse_int_arg(a[2], col) &&
        parse_float_arg(a[3], f) && r >= 0 && col >= 0 && col < 2 && r < (a[0] == "q" ? 2 : 3))
      return "";
    return "expects: example q|k|v ROW COL VALUE (q: 2x2, k and v: 3x2) | example scaled on|off | example reset";
  }
  if (v == "browse")
    return n == 1 && one_of(a[0], {"image", "model", "export", "screenshot"}) ? ""
                                                                              : "expects: browse image|model|export|screenshot";
  if (v == "train" || v == "model-menu") return check_train_command(c);
  if (v == "window")
    return n == 2 && parse_int_arg(a[0], i) && i >= 320 && i <= 8192 && parse_int_arg(a[1], i) && i >= 240 && i <= 8192
               ? ""
               : "expects: window W H (pixels, 320x240 to 8192x8192)";
  if (v == "frames") return n == 1 && parse_int_arg(a[0], i) && i >= 1 && i <= 10000 ? "" : "expects: frames N (1 to 10000)";
  return "unknown command '" + v +
         "' (known: open, model, pin, key, hover, mode, layer, token, head, rollout, colormap, alpha, normalize, upsample, threshold, grid, "
         "mask, paint, erase, clear-paint, scale, size, show, example, browse, export, screenshot, state, train, model-menu, "
         "window, frames, quit, click, drag, drop, widgets, expect, expect-contains, expect-file)";
}

}  // namespace

std::vector<ScriptCommand> parse_script(const std::string& text, const std::string& what) {
  std::vector<ScriptCommand> commands;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    const std::string body = trim(raw.substr(0, comment_start(raw)));
    if (body.empty()) continue;
    ScriptCommand c;
    c.line = line;
    c.text = body;
    const auto space = body.find_first_of(" \t");
    c.verb = body.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : trim(body.substr(space));
    if (c.verb == "open" || c.verb == "model" || c.verb == "screenshot" || c.verb == "state" || c.verb == "drop" ||
        c.verb == "widgets" || c.verb == "expect-file") {
      if (!rest.empty()) c.args.push_back(rest);  // a path: keep its spaces
    } else if (c.verb == "click" || c.verb == "drag") {
      // A label keeps its spaces; "at FX FY" (click) or "to T" (drag) at the end are the numbers.
      c.args = split_tail(rest, c.verb == "click" ? " at " : " to ");
    } else if (c.verb == "expect" || c.verb == "expect-contains") {
      const auto key_end = rest.find_first_of(" \t");  // KEY, then the value with its spaces
      c.args.push_back(rest.substr(0, key_end));
      if (key_end != std::string::npos) c.args.push_back(trim(rest.substr(key_end)));
    } else if (c.verb == "export") {
      // export DIR [raw]: the last word is the flag only when it is exactly "raw"
      const auto last_space = rest.find_last_of(" \t");
      if (last_space != std::string::npos && rest.substr(last_space + 1) == "raw") {
        c.args.push_back(trim(rest.substr(0, last_space)));
        c.args.push_back("raw");
      } else if (!rest.empty()) {
        c.args.push_back(rest);
      }
    } else {
      std::istringstream words(rest);
      std::string w;
      while (words >> w) c.args.push_back(w);
    }
    const std::string problem = check(c);
    if (!problem.empty()) throw Error(what + ":" + std::to_string(line) + ": '" + body + "': " + problem);
    commands.push_back(std::move(c));
  }
  return commands;
}

std::vector<ScriptCommand> load_script(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the script (no such file or not readable)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_script(text.str(), path);
}

}  // namespace vitlens::viewer
