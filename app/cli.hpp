#pragma once
// The command-line front end: each subcommand registers its options on the CLI11 app and runs
// after parsing. All the work is done by core/ and models/.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/base/error.hpp"
#include "core/model/rollout.hpp"
#include "core/render/export.hpp"

namespace vitlens::cli {

// Exit codes: 0 success, 1 some work failed (each failure reported on stderr), 2 bad usage.
constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;

// --layer: the last layer (not given), one layer, a range A-B, or every layer.
struct LayerChoice {
  enum class Kind { Last, One, Range, All };
  Kind kind = Kind::Last;
  int first = -1, last = -1;  // One: first; Range: both; All: known once the model is
  std::string text;           // as typed, for messages
};

// Every option of `vitlens export`, typed by CLI11 as it parses (cli_export.cpp).
struct ExportArgs {
  std::vector<std::string> images;
  std::string model;  // empty: the bundled designed model
  int heads = 0;      // --heads for a checkpoint that does not say it
  std::string query, query_processed, patch;  // "X,Y" / "ROW,COL" as typed (parse_pair)
  std::string token;  // --token cls|dist|regK: a prefix token as the query
  bool cls = false, received = false, pool = false;
  std::string mask = "none";
  bool quiet = false;
  LayerChoice layer;
  bool rollout = false;                   // --rollout
  HeadFusion fusion = HeadFusion::Mean;   // --fusion
  float discard = 0.0f;                   // --discard
  std::string preprocess = "whole";       // --preprocess whole|model
  std::string precision = "fp32";         // --precision fp32|bf16|auto
  ExportSettings settings;                // the rest: --out, --colormap, --alpha, --upsample, --normalize, --threshold, ...
};
void add_export_command(CLI::App& app, ExportArgs& args);
int run_export(ExportArgs& args);

// --model's help, the same for every command that takes a model: a file or a bundled model's name.
constexpr const char* kModelOptionHelp =
    "Model: a bundled model's name (designed, random, fashion-mnist, mae-photos: 'vitlens models' lists them) or a "
    ".safetensors file (vitlens, timm or Hugging Face layout); a path with '/' or an existing file wins over a name; "
    "default: designed";

struct InfoArgs {
  std::string model;
  int heads = 0;
};

// --heads: the attention head count of a timm checkpoint without a config.json.
void add_heads_option(CLI::App* cmd, int& heads);
void add_info_command(CLI::App& app, InfoArgs& args);
int run_info(const InfoArgs& args);
// `vitlens models`: the bundled models, one line each.
CLI::App* add_models_command(CLI::App& app);
int run_models();

// `vitlens train` (cli_train.cpp). Defaults are the documented default recipe (README).
struct TrainArgs {
  std::string data, out, resume, grad_dump;
  std::string name = "vitlens-trained", description;  // the model's config name / description
  std::string pool = "cls";  // the classifier's input: the class token, or the mean of the patch tokens
  int depth = 4, embed_dim = 48, heads = 4, patch = 4;
  double mlp_ratio = 2.0;
  int batch = 128, epochs = 24;
  double lr = 2e-3, weight_decay = 0.05, warmup = 0.5, label_smoothing = 0.1, val_split = 0.1, drop_path = 0.0;
  uint64_t seed = 0;
  int threads = 0, img_size = 32, limit = 0, stop_after = 0, crop_pad = 1, shards = 4;
  bool augment = true, quiet = false;
  // Masked patch prediction (--data photos[:DIR]).
  double mask_ratio = 0.75;
  int decoder_dim = 32, decoder_depth = 1, decoder_heads = 4, crops_per_photo = 16;
  CLI::App* command = nullptr;  // to ask which flags were given
};
void add_train_command(CLI::App& app, TrainArgs& args);
int run_train(TrainArgs& args);

// A flag value the parser accepted but the command cannot use: exits with kExitUsage.
struct UsageError : Error {
  using Error::Error;
};

// "X,Y" -> two integers, or throws UsageError naming the flag.
void parse_pair(const std::string& text, const char* flag, int& first, int& second);

// A missing folder is made, with its parents, as `mkdir -p` would (`what` names it in the error:
// "the output folder"); a path that exists and is not a folder is left to require_writable_dir.
void make_missing_folder(const std::string& folder, const std::string& what);

// The message for std::bad_alloc, wherever it is caught.
constexpr const char* kOutOfMemory =
    "out of memory: this needs more memory than the system (or `ulimit -v`) allows; try a smaller image, model "
    "or --batch";

// One line on stderr: "vitlens: <message>", control characters escaped (terminal_text).
void report_error(const std::string& message);

// `text` safe to print on a terminal: control characters (C0, DEL, the C1 range) and bytes that
// are not UTF-8 shown as \xNN, so a name read from a file cannot move the cursor, retitle the
// window or hide what follows. Everything printed that comes from a file goes through it.
std::string terminal_text(const std::string& text);

}  // namespace vitlens::cli
