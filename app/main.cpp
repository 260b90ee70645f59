// vitlens: see, per head, where a Vision Transformer looks in an image.
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "vitlens/error.hpp"

namespace vitlens::cli {

void report_error(const std::string& message) { std::cerr << "vitlens: " << message << std::endl; }

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

}  // namespace vitlens::cli

int main(int argc, char** argv) {
  using namespace vitlens::cli;
  CLI::App app{"vitlens " VITLENS_VERSION ": see, per head, where a Vision Transformer looks in an image.\n"
               "Computes a ViT's attention on your images and draws each head's map as a heatmap."};
  app.set_version_flag("--version", std::string("vitlens ") + VITLENS_VERSION);
  app.require_subcommand(0, 1);
  ExportArgs export_args;
  InfoArgs info_args;
  add_export_command(app, export_args);
  add_info_command(app, info_args);
  app.footer("Run 'vitlens COMMAND --help' for a command's options.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    report_error(std::string(e.what()) + " (see 'vitlens --help')");
    return kExitUsage;
  }

  try {
    if (app.got_subcommand("export")) return run_export(export_args);
    if (app.got_subcommand("info")) return run_info(info_args);
    std::cout << app.help();
    return kExitOk;
  } catch (const UsageError& e) {
    report_error(std::string(e.what()) + " (see 'vitlens --help')");
    return kExitUsage;
  } catch (const vitlens::Error& e) {
    report_error(e.what());
    return kExitFailed;
  } catch (const std::exception& e) {
    report_error(std::string("unexpected error: ") + e.what());
    return kExitFailed;
  }
}
