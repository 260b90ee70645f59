#pragma once
// The command-line front end: each subcommand registers its options on the CLI11 app and runs
// after parsing. All the work is done by core/ and models/.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "vitlens/error.hpp"
#include "vitlens/export.hpp"

namespace vitlens::cli {

// Exit codes: 0 success, 1 some work failed (each failure reported on stderr), 2 bad usage.
constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;

struct ExportArgs {
  std::vector<std::string> images;
  std::string model;  // empty: the bundled designed model
  int heads = 0;      // --heads for a checkpoint that does not say it
  std::string query, query_processed, patch;
  bool cls = false, received = false;
  std::string mask = "none";
  std::string upsample = "nearest";
  std::string normalize = normalize_name(kDefaultNormalize);
  bool quiet = false;
  std::string threshold;         // --threshold MASS as typed; empty: off
  std::string layer;            // "", "L", "A-B" or "all"
  bool rollout = false;         // --rollout
  std::string fusion = "mean";  // --fusion
  float discard = 0.0f;         // --discard
  ExportSettings settings;
};
void add_export_command(CLI::App& app, ExportArgs& args);
int run_export(ExportArgs& args);

struct InfoArgs {
  std::string model;
  int heads = 0;
};

// --heads: the attention head count of a timm checkpoint without a config.json.
void add_heads_option(CLI::App* cmd, int& heads);
void add_info_command(CLI::App& app, InfoArgs& args);
int run_info(const InfoArgs& args);

// A flag value the parser accepted but the command cannot use: exits with kExitUsage.
struct UsageError : Error {
  using Error::Error;
};

// "X,Y" -> two integers, or throws UsageError naming the flag.
void parse_pair(const std::string& text, const char* flag, int& first, int& second);

// One line on stderr: "vitlens: <message>".
void report_error(const std::string& message);

}  // namespace vitlens::cli
