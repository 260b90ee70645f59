// Script parsing (see script.hpp): each line split and checked by its verb's row (script_verbs.cpp),
// so a bad script fails before a window opens; ranges that depend on the image (grid, layers) are
// checked when the command runs.
#include "control/script.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/base/error.hpp"

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

// The arguments of `rest` (the line after its verb), as the verb's row splits them.
std::vector<std::string> split_arguments(const std::string& rest, ScriptSplit split) {
  std::vector<std::string> args;
  switch (split) {
    case ScriptSplit::Path:
      if (!rest.empty()) args.push_back(rest);  // a path: keep its spaces
      return args;
    case ScriptSplit::LabelAt: return split_tail(rest, " at ");  // numbers after the label
    case ScriptSplit::LabelTo: return split_tail(rest, " to ");
    case ScriptSplit::KeyValue: {
      const auto key_end = rest.find_first_of(" \t");
      args.push_back(rest.substr(0, key_end));
      if (key_end != std::string::npos) args.push_back(trim(rest.substr(key_end)));
      return args;
    }
    case ScriptSplit::PathRaw: {
      const auto last_space = rest.find_last_of(" \t");
      if (last_space != std::string::npos && rest.substr(last_space + 1) == "raw") {
        args.push_back(trim(rest.substr(0, last_space)));
        args.push_back("raw");
      } else if (!rest.empty()) {
        args.push_back(rest);
      }
      return args;
    }
    case ScriptSplit::Words: break;
  }
  std::istringstream words(rest);
  std::string w;
  while (words >> w) args.push_back(w);
  return args;
}

std::string unknown_verb(const std::string& verb) {
  std::string known;
  for (const ScriptVerb& row : script_verbs()) known += (known.empty() ? "" : ", ") + std::string(row.verb);
  return "unknown command '" + verb + "' (known: " + known + ")";
}

// "" when the command is well formed, else the reason.
std::string check(const ScriptVerb& row, const ScriptArgs& args) {
  std::string why;
  if (row.check(args, why)) return "";
  return why.empty() ? "expects: " + std::string(row.usage) : why;
}

// One line without its comment, or nothing for a blank line.
std::optional<ScriptCommand> parse_line(const std::string& raw, int line, const std::string& what) {
  const std::string body = trim(raw.substr(0, comment_start(raw)));
  if (body.empty()) return std::nullopt;
  ScriptCommand c;
  c.line = line;
  c.text = body;
  const auto space = body.find_first_of(" \t");
  c.verb = body.substr(0, space);
  const std::string rest = space == std::string::npos ? "" : trim(body.substr(space));
  const ScriptVerb* row = find_script_verb(script_verbs(), c.verb);
  std::string problem = unknown_verb(c.verb);
  if (row) {
    c.args = split_arguments(rest, row->split);
    problem = check(*row, c.args);
  }
  if (!problem.empty()) throw Error(what + ":" + std::to_string(line) + ": '" + body + "': " + problem);
  return c;
}

}  // namespace

bool int_in(const std::string& token, int lo, int hi) {
  int v = 0;
  return parse_int_arg(token, v) && v >= lo && v <= hi;
}

bool float_in(const std::string& token, float lo, float hi) {
  float v = 0.0f;
  return parse_float_arg(token, v) && v >= lo && v <= hi;
}

bool one_of(const std::string& token, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (token == o) return true;
  return false;
}

const ScriptVerb* find_script_verb(const std::vector<ScriptVerb>& table, const std::string& verb) {
  for (const ScriptVerb& row : table)
    if (verb == row.verb) return &row;
  return nullptr;
}

std::vector<ScriptCommand> parse_script(const std::string& text, const std::string& what) {
  std::vector<ScriptCommand> commands;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw))
    if (auto c = parse_line(raw, ++line, what)) commands.push_back(std::move(*c));
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
