#pragma once
// The viewer's scripted mode (`vitlens view --script FILE`): one command per line; a '#' at the
// start of a line or as a word of its own starts a comment ('#' inside a word, as in the widget
// ID "##mass", is text). Each command goes through the same functions the mouse, keys and menus
// call (controller.hpp), and the next command waits until the previous one's work is on screen.
//
//   open PATH | model PATH          load an image / a model (a bad file keeps the current one)
//   pin ROW COL | key left|right|up|down | hover ROW COL
//   mode query|cls|received|pool|rollout layer N
//   token patch|cls|dist|regK       the query: the pinned patch or a prefix token
//   head N|all                      open one head large in the Heads window, or show them all
//   rollout on|off | rollout fusion mean|max|min | rollout discard R | rollout layers A B |
//   rollout from cls|query          rollout mode's settings (rollout.hpp)
//   colormap NAME | alpha A | normalize robust|head|shared|log | upsample nearest|bilinear
//   threshold off|T | grid on|off
//   mask none|padding|causal|painted | paint ROW COL | erase ROW COL | clear-paint
//   scale default|none|temperature T | size default|N
//   preprocess whole|model          the whole image, or the checkpoint's own transform (refused, one
//                                   line, for a model that publishes none)
//   precision fp32|bf16|auto        the Linear layers' arithmetic (`vitlens export --precision`)
//   show image|heads|controls|inspector|stats|example|train|layers on|off
//   example q|k|v ROW COL VALUE | example scaled on|off | example reset
//   browse image|model|export|screenshot (opens the file browser, as the menus do)
//   export DIR [raw] | screenshot FILE | state FILE | frames N | quit
//   window W H                      resize the window (the next command runs once the display has
//                                   that size and the windows are laid out for it)
//   train start fashion-mnist|DIR [key=value ...] | train pause|resume|stop | train wait STEPS |
//   train save FILE | train open | model-menu NAME   (train_panel.hpp)
// Real input (the window plays it into Dear ImGui's input, one step per frame):
//   click LABEL [at FX FY]          move the mouse onto the widget, press and release the left
//                                   button (FX, FY: where in it, fractions; default the middle)
//   drag LABEL to T                 press on a slider's track, move to T (0 left .. 1 right), release
//   key left|right|up|down|escape|enter|tab   press and release within one frame
//   drop PATH                       a file dropped on the window (the GLFW drop callback)
// LABEL is the widget's text, or WINDOW > SECTION > LABEL when the text alone names several
// (`widgets FILE` lists them all). Checks, which fail the script with a message:
//   expect KEY VALUE | expect-contains KEY TEXT   a value of the state file (KEY: normalize, show/heads)
//   expect-file PATH | widgets FILE (write the widget list)
#include <initializer_list>
#include <string>
#include <vector>

namespace vitlens::viewer {

struct App;

struct ScriptCommand {
  int line = 0;
  std::string verb;
  std::vector<std::string> args;  // a PATH argument is one element, spaces kept
  std::string text;               // the line as written, for messages
};

using ScriptArgs = std::vector<std::string>;

// How the text after a verb becomes its arguments.
enum class ScriptSplit {
  Words,     // split at spaces
  Path,      // one argument, spaces kept
  PathRaw,   // DIR [raw]: the last word is a flag only when it is exactly "raw"
  LabelAt,   // LABEL [at FX FY]: the label keeps its spaces
  LabelTo,   // LABEL to T
  KeyValue,  // KEY, then the value with its spaces
};

// One row of the script's verb table: parsing checks every line with `check` before a window
// opens (ranges that depend on the image wait for `apply`); running a line calls `apply`.
struct ScriptVerb {
  const char* verb;
  const char* usage;  // what "expects: " names when `check` says no and gives no reason
  ScriptSplit split;
  bool (*check)(const ScriptArgs& args, std::string& why);  // false: malformed (why, or the usage)
  std::string (*apply)(App& app, const ScriptArgs& args);  // "" or why it failed
};

// Every verb (script_verbs.cpp), the Train window's among them (training_script_verbs).
const std::vector<ScriptVerb>& script_verbs();
// The row of `verb` in `table`, or null.
const ScriptVerb* find_script_verb(const std::vector<ScriptVerb>& table, const std::string& verb);

// Throws vitlens::Error "<what>:<line>: <reason>" on an unknown verb or malformed arguments.
std::vector<ScriptCommand> parse_script(const std::string& text, const std::string& what);
std::vector<ScriptCommand> load_script(const std::string& path);

// Number parsing shared with the runner: the whole token must be a number.
bool parse_int_arg(const std::string& token, int& out);
bool parse_float_arg(const std::string& token, float& out);
// The argument checks the verb rows share: the whole token a number in [lo, hi], or one of `options`.
bool int_in(const std::string& token, int lo, int hi);
bool float_in(const std::string& token, float lo, float hi);
bool one_of(const std::string& token, std::initializer_list<const char*> options);

}  // namespace vitlens::viewer
