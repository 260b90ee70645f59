// vitlens: see, per head, where a Vision Transformer looks in an image.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <new>

#include <unistd.h>

#include "cli.hpp"
#include "models/bundled_models.hpp"
#include "core/base/error.hpp"
#include "core/base/utf8.hpp"
#include "core/io/files.hpp"
#include "core/base/memory.hpp"
#ifdef VITLENS_HAS_VIEWER
#include "viewer/views/viewer.hpp"
#endif

namespace vitlens::cli {

std::string terminal_text(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  char escape[8];
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t len = utf8_char_length(text, i);
    // Kept: printable ASCII and whole UTF-8 characters other than the C1 controls U+0080 to
    // U+009F (C2 80 to C2 9F), which some terminals obey like ESC sequences.
    const bool c1 = len == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0;
    if ((len == 1 && c >= 0x20 && c != 0x7F) || (len > 1 && !c1)) {
      out.append(text, i, len);
      i += len;
    } else {
      std::snprintf(escape, sizeof escape, "\\x%02x", c);
      out += escape;
      ++i;
    }
  }
  return out;
}

void report_error(const std::string& message) {
  // One line, whatever the message holds (a model name with a newline or an escape sequence, an
  // OpenCV message), and not a page: a message quoting a file's text is cut.
  constexpr size_t kMaxLine = 2000;
  std::string line = message;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  while (!line.empty() && line.back() == ' ') line.pop_back();
  if (line.size() > kMaxLine) line = line.substr(0, kMaxLine) + "...";
  std::cerr << "vitlens: " << terminal_text(line) << std::endl;
}

namespace {

void write_stderr(const char* text) { (void)!::write(STDERR_FILENO, text, std::strlen(text)); }

// Reached when an exception cannot be caught where it was thrown: out of a destructor (noexcept),
// or out of a thread's function. An allocation failure there is reported as one line like any
// other, with exit code 1, instead of std::terminate's abort and core dump. Temporaries of this
// process are left for the next run's tidy (files.hpp), as after a kill.
[[noreturn]] void terminate_with_one_line() {
  try {
    if (const std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
    write_stderr("vitlens: internal error: terminated without an exception\n");
  } catch (const std::bad_alloc&) {
    // Nothing allocated here: the heap is what failed.
    write_stderr("vitlens: ");
    write_stderr(kOutOfMemory);
    write_stderr("\n");
  } catch (const std::exception& e) {
    report_error(std::string("unexpected error: ") + e.what());
  } catch (...) {
    write_stderr("vitlens: unexpected error of an unknown type\n");
  }
  std::_Exit(kExitFailed);
}

}  // namespace

void parse_pair(const std::string& text, const char* flag, int& first, int& second) {
  const auto comma = text.find(',');
  auto parse_int = [&](const std::string& part, int& out) {
    size_t used = 0;
    try {
      const long v = std::stol(part, &used);
      if (used != part.size() || v < -1000000 || v > 1000000) throw std::invalid_argument(part);
      out = static_cast<int>(v);
    } catch (const std::exception&) {
      throw UsageError(std::string(flag) + " expects two integers as A,B; got '" + text + "'");
    }
  };
  if (comma == std::string::npos) throw UsageError(std::string(flag) + " expects two integers as A,B; got '" + text + "'");
  parse_int(text.substr(0, comma), first);
  parse_int(text.substr(comma + 1), second);
}

// An option or argument given an empty value (`--model ''`, often a script's unset variable) is
// refused in one line instead of being taken as not given: it would have meant the default model,
// a new run for `--resume`, the default query for `--patch`. Walks option groups and subcommands.
void refuse_empty_values(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0)
      for (const std::string& value : opt->results())
        if (value.empty()) throw UsageError(opt->get_name() + ": an empty value was given");
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>{})) refuse_empty_values(*sub);
}

void make_missing_folder(const std::string& folder, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(folder, ec) && !std::filesystem::is_symlink(folder, ec)) {
    std::filesystem::create_directories(folder, ec);
    if (ec) throw Error(folder + ": cannot create " + what + " (" + ec.message() + ")");
  }
}

// Where a usage error points: the chosen command's own --help, or the program's.
std::string help_hint(const CLI::App& app) {
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  return " (see 'vitlens " + (chosen.empty() ? std::string() : chosen.front()->get_name() + " ") + "--help')";
}

// `vitlens view`: the desktop viewer; `vitlens` with no arguments runs it on the bundled files.
struct ViewArgs {
  std::string image, model, screenshot, script, dump_widgets;
  int frames = -1;
  int heads = 0;
};

void add_view_command(CLI::App& app, ViewArgs& args) {
  CLI::App* cmd = app.add_subcommand("view", "Open the desktop viewer: every head's attention map over an image, live");
  cmd->add_option("IMAGE", args.image, "Image file; default: the bundled demo image");
  cmd->add_option("--model,-m", args.model, kModelOptionHelp);
  add_heads_option(cmd, args.heads);
  cmd->add_option("--screenshot", args.screenshot,
                  "Write the window as PNG once everything is drawn, then exit (settings are not read or saved); a FILE "
                  "that exists is refused, never replaced");
  cmd->add_option("--frames", args.frames, "Frames to draw before the screenshot (default 3), or before exiting")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--script", args.script,
                  "Run the commands in FILE (pin R C, mode received, colormap inferno, mask causal, export DIR, "
                  "screenshot FILE, ...), then exit")
      ->check(CLI::ExistingFile);
  cmd->add_option("--dump-widgets", args.dump_widgets,
                  "Once the first image is drawn, write every widget's label, ID, window and rectangle as JSON to "
                  "FILE (for tools that click the real window, such as xdotool), and again whenever the widgets "
                  "change (a window or menu opened); the viewer keeps running");
}

int run_view(const ViewArgs& args) {
#ifdef VITLENS_HAS_VIEWER
  vitlens::viewer::ViewerArgs viewer;
  viewer.image = args.image;
  viewer.model = resolve_model(args.model);
  viewer.screenshot = args.screenshot;
  viewer.script = args.script;
  viewer.frames = args.frames;
  viewer.heads = args.heads;
  viewer.dump_widgets = args.dump_widgets;
  return vitlens::viewer::run_viewer(viewer);
#else
  (void)args;
  throw Error("this vitlens was built without the viewer (VITLENS_BUILD_VIEWER=OFF); 'vitlens export' writes the heatmaps as files");
#endif
}

}  // namespace vitlens::cli

int main(int argc, char** argv) {
  using namespace vitlens::cli;
  std::set_terminate(terminate_with_one_line);
  // The viewer runs a forward for every image and setting; the pages of the last one are reused.
  vitlens::keep_freed_memory();
  CLI::App app{"vitlens " VITLENS_VERSION ": see, per head, where a Vision Transformer looks in an image.\n"
               "Computes a ViT's attention on your images and draws each head's map as a heatmap.",
               "vitlens"};  // named, so --help says "vitlens" whatever path it was run by (the README quotes it)
  app.set_version_flag("--version", std::string("vitlens ") + VITLENS_VERSION);
  app.require_subcommand(0, 1);
  ExportArgs export_args;
  InfoArgs info_args;
  ViewArgs view_args;
  TrainArgs train_args;
  add_export_command(app, export_args);
  add_info_command(app, info_args);
  add_view_command(app, view_args);
  add_train_command(app, train_args);
  const CLI::App* models_command = add_models_command(app);
#ifdef VITLENS_HAS_VIEWER
  app.footer("Run 'vitlens COMMAND --help' for a command's options; 'vitlens' alone opens the viewer on the bundled "
             "demo image and model.");
#else
  app.footer("Run 'vitlens COMMAND --help' for a command's options.");
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    report_error(e.what() + help_hint(app));
    return kExitUsage;
  }

  // Ctrl-C or SIGTERM during a write removes the temporaries first (vitlens/files.hpp).
  vitlens::install_cleanup_handlers();
  try {
    refuse_empty_values(app);
    if (app.got_subcommand("export")) return run_export(export_args);
    if (app.got_subcommand("info")) return run_info(info_args);
    if (app.got_subcommand("view")) return run_view(view_args);
    if (app.got_subcommand("train")) return run_train(train_args);
    if (models_command->parsed()) return run_models();
#ifdef VITLENS_HAS_VIEWER
    if (argc == 1) return run_view(view_args);  // plain `vitlens`: the viewer on the bundled files
#endif
    std::cout << app.help();
    return kExitOk;
  } catch (const UsageError& e) {
    report_error(e.what() + help_hint(app));
    return kExitUsage;
  } catch (const vitlens::Error& e) {
    report_error(e.what());
    return kExitFailed;
  } catch (const std::bad_alloc&) {
    report_error(kOutOfMemory);
    return kExitFailed;
  } catch (const std::exception& e) {
    report_error(std::string("unexpected error: ") + e.what());
    return kExitFailed;
  }
}
