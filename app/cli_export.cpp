// `vitlens export`: heatmaps, montage, JSON and optional raw weights for each image. Index:
//   [SECTION] Typed flags     validators and transforms, so a bad value fails in parsing, one line
//   [SECTION] Options         the command's options, in groups
//   [SECTION] Run             checks against the model, then each image
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "core/base/enum_names.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "core/io/json_text.hpp"
#include "core/model/classifier.hpp"
#include "core/render/export_layers.hpp"
#include "models/bundled_models.hpp"
#include "models/model_io.hpp"
#include "models/model_transform.hpp"

namespace vitlens::cli {

namespace {

// [SECTION] Typed flags

// The whole text a finite number, or nothing.
bool whole_float(const std::string& text, float& out) {
  char* end = nullptr;
  out = std::strtof(text.c_str(), &end);
  return !text.empty() && *end == '\0' && std::isfinite(out);
}

// A number from `lo` to `hi` (below `hi` when `hi_open`); unlike CLI::Range, NaN is refused too.
// `range` words it for the message, `shown` for --help.
CLI::Validator number_in(float lo, float hi, const std::string& range, const std::string& shown, bool hi_open = false) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        float v = 0.0f;
        if (whole_float(text, v) && v >= lo && (hi_open ? v < hi : v <= hi)) return "";
        std::string message = "must be a number from " + range + ", got '" + text + "'";
        // Below `hi` as typed, `hi` once a float (0.99999999 is 1.0f): name the largest float allowed.
        char* end = nullptr;
        const double typed = std::strtod(text.c_str(), &end);
        if (hi_open && !text.empty() && *end == '\0' && typed >= lo && typed < hi && v == hi) {
          char words[96];
          std::snprintf(words, sizeof words, ", which rounds to %.9g as a 32-bit float; the largest allowed is %.9g",
                        static_cast<double>(hi), static_cast<double>(std::nextafter(hi, lo)));
          message += words;
        }
        return message;
      },
      shown, "NUMBER");
}

// --threshold: a share of each map's mass, 0 < MASS <= 1.
CLI::Validator threshold_mass() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        float v = 0.0f;
        if (whole_float(text, v) && v > 0.0f && v <= 1.0f) return "";
        return "must be a mass in (0, 1] (the share of each map to keep), got '" + text + "'";
      },
      "", "MASS");
}

// One of an enum's names (core/base/enum_names.hpp), stored as the enum: CLI11 reads an enum
// from its number, so the name becomes that number.
template <typename E, size_t N>
CLI::Validator enum_choice(const EnumName<E> (&table)[N]) {
  std::string names;
  for (const std::string& n : enum_names(table)) names += (names.empty() ? "" : ",") + n;
  return CLI::Validator(
      [&table, names](std::string& text) -> std::string {
        E value{};
        if (!parse_enum(table, text, value)) return text + " not in {" + names + "}";
        text = std::to_string(static_cast<int>(value));
        return "";
      },
      "{" + names + "}", "NAME");
}

// A layer index: digits only, at most 1000000.
bool layer_index(const std::string& text, int& out) {
  if (text.empty() || text.size() > 7) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  out = std::stoi(text);
  return out <= 1000000;
}

// --layer L, A-B or all; throws CLI::ValidationError (a parse error: one line, exit code 2).
LayerChoice parse_layer_choice(const std::string& text) {
  LayerChoice c;
  c.text = text;
  const auto dash = text.find('-', 1);
  bool ok = true;
  if (text == "all") {
    c.kind = LayerChoice::Kind::All;
    c.first = 0;
  } else if (dash != std::string::npos) {
    c.kind = LayerChoice::Kind::Range;
    ok = layer_index(text.substr(0, dash), c.first) && layer_index(text.substr(dash + 1), c.last);
    if (ok && c.last < c.first) throw CLI::ValidationError("--layer " + text + ": the range's end is before its start");
  } else {
    c.kind = LayerChoice::Kind::One;
    ok = layer_index(text, c.first);
  }
  if (!ok) throw CLI::ValidationError("--layer expects a layer index L, a range A-B (0-based) or 'all'; got '" + text + "'");
  return c;
}

// [SECTION] Options

void add_input_options(CLI::App* cmd, ExportArgs& args) {
  cmd->add_option("IMAGE", args.images, "Image files (PNG, JPEG, BMP, TIFF, WebP, ...)")->required();
  cmd->add_option("--model,-m", args.model, kModelOptionHelp);
  add_heads_option(cmd, args.heads);
  cmd->add_option("--out,-o", args.settings.out_dir, "Folder to write into; created (with its parents) when missing")
      ->capture_default_str();
}

// The query: one of these at most (each excludes the others).
void add_query_options(CLI::App* cmd, ExportArgs& args) {
  CLI::Option_group* g = cmd->add_option_group("Query", "Which attention the maps show (at most one)");
  std::vector<CLI::Option*> query = {
      g->add_option("--query", args.query, "Map of the query patch under pixel X,Y of the IMAGE as given (before any resizing)")
          ->type_name("X,Y"),
      g->add_option("--query-processed", args.query_processed,
                    "Map of the query patch under pixel X,Y of the processed image (resized to --size and padded to whole "
                    "patches)")
          ->type_name("X,Y"),
      g->add_option("--patch", args.patch, "Map of the query patch at ROW,COL of the patch grid"),
      g->add_flag("--cls", args.cls, "Map of the class token's attention (models with a class token)"),
      g->add_flag("--received", args.received, "Attention received: mean over queries of each patch's column (the default)"),
      g->add_flag("--pool", args.pool,
                  "Map of the attention pool's latent query over the patch tokens (SigLIP's head, timm global_pool 'map'; "
                  "models with an attention pool): it reads the last layer's output, so --rollout and any --layer but the last do not apply"),
      g->add_option("--token", args.token,
                    "Map of a prefix token's attention row: cls (class token), dist (distillation token, distilled DeiT) "
                    "or regK (register K of DINOv2 with registers, K from 0)")
          ->type_name("NAME")};
  for (size_t i = 0; i < query.size(); ++i)
    for (size_t j = i + 1; j < query.size(); ++j) query[i]->excludes(query[j]);
}

void add_layer_options(CLI::App* cmd, ExportArgs& args) {
  CLI::Option_group* g = cmd->add_option_group("Layers and rollout");
  g->add_option_function<std::string>(
       "--layer", [&args](const std::string& text) { args.layer = parse_layer_choice(text); },
       "Layer (block) index L, 0-based (default: the last); a range A-B or 'all' writes every layer's files "
       "(<stem>_layer<L>_*) and a layers x heads montage (<stem>_layers_montage.png, recorded in <stem>_layers.json)")
      ->type_name("TEXT");
  CLI::Option* rollout = g->add_flag("--rollout", args.rollout,
                                     "Attention rollout (Abnar & Zuidema) from the class token, or from the --patch / "
                                     "--query patch: <stem>_rollout.png and .json; with --layer A-B over those layers");
  // Given without --rollout they would change nothing: refused rather than ignored.
  g->add_option("--fusion", args.fusion, "Rollout: how each layer's heads are fused")
      ->needs(rollout)
      ->transform(enum_choice(kHeadFusionNames))
      ->type_name("TEXT")
      ->default_str(head_fusion_name(args.fusion));
  g->add_option("--discard", args.discard,
                "Rollout: fraction of each layer's lowest fused weights set to zero (never the class token's own), 0 to "
                "below 1")
      ->needs(rollout)
      ->check(number_in(0.0f, 1.0f, "0 to below 1", "FLOAT in [0 - 1)", true))
      ->capture_default_str();
}

void add_look_options(CLI::App* cmd, ExportArgs& args) {
  ExportSettings& s = args.settings;
  CLI::Option_group* g = cmd->add_option_group("Look", "How the maps are drawn");
  g->add_option("--colormap", s.style.colormap, "Colour map")->check(CLI::IsMember(colormap_names()))->capture_default_str();
  g->add_option("--alpha", s.style.alpha, "Heatmap opacity over the image, 0 to 1")
      ->check(number_in(0.0f, 1.0f, "0 to 1", "FLOAT in [0 - 1]"))
      ->capture_default_str();
  g->add_option("--upsample", s.style.upsample, "Patch map to pixels")
      ->transform(enum_choice(kUpsampleNames))
      ->type_name("TEXT")
      ->default_str(upsample_name(s.style.upsample));
  g->add_option("--threshold", s.threshold,
                "Keep only the largest patches that hold this share of each map's mass, 0 < MASS <= 1 (DINO's "
                "--threshold); ties are kept together, a map with no structure is shown whole")
      ->check(threshold_mass())
      ->type_name("MASS");
  g->add_option("--normalize", s.normalize,
                "robust: each head from 0 to its 99th percentile, raised so at most 10% of its weight saturates (the "
                "default); head: each head to its own maximum; shared: one scale for all heads; log: each head on a "
                "3-decade log scale")
      ->transform(enum_choice(kNormalizeNames))
      ->type_name("TEXT")
      ->default_str(normalize_name(s.normalize));
}

void add_pass_options(CLI::App* cmd, ExportArgs& args) {
  ExportSettings& s = args.settings;
  CLI::Option_group* g = cmd->add_option_group("Forward pass");
  g->add_option("--mask", args.mask, "Attention mask applied before the softmax (padding patches are always masked)")
      ->check(CLI::IsMember({"none", "causal"}))
      ->capture_default_str();
  g->add_option("--mask-image", s.mask_image,
                "Painted key mask: an image of the IMAGE's aspect ratio, white = key allowed, black = forbidden; "
                "stretched over the image, a patch is forbidden when the mask's mean over it is below 50% grey "
                "(padding patches are always masked)")
      ->type_name("FILE");
  g->add_option("--temperature", s.temperature,
                "Softmax temperature T: scores are q.k / (sqrt(d) T); T > 1 flattens, T < 1 sharpens; 0.05 to 20")
      ->check(number_in(kMinTemperature, kMaxTemperature, "0.05 to 20", ""))
      ->type_name("T")
      ->capture_default_str();
  g->add_option("--size", s.max_side,
                "Working size: images with a longer side are downscaled to it (aspect kept); 0 = native size (at most "
                "2048); default: the model's img_size long side. An image of exactly the model's img_size is never "
                "resampled")
      ->check(CLI::Range(0, 2048));
  g->add_option("--preprocess", args.preprocess,
                "whole: the whole image, aspect kept, resized to --size and padded to whole patches (padding masked); "
                "model: the transform the checkpoint publishes (timm pretrained_cfg, Hugging Face "
                "preprocessor_config.json), pixel for pixel as its library computes it, so the maps are a notebook's")
      ->check(CLI::IsMember({"whole", "model"}))
      ->capture_default_str();
  g->add_option("--precision", args.precision,
                "The products' arithmetic (Linear layers, attention scores and mix): fp32 (exact, as PyTorch), "
                "bf16 (bfloat16 operands, float32 sums; softmax, LayerNorm, the residual and an attention pool stay float32) or auto (bf16 for models of 20 M parameters "
                "or more on a CPU with bfloat16 dot products, else fp32); recorded in the caption and the JSON")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}))
      ->capture_default_str();
}

void add_output_flags(CLI::App* cmd, ExportArgs& args) {
  ExportSettings& s = args.settings;
  cmd->add_flag("--raw", s.raw,
                "Also write <stem>_attn.npy: float32 (layers, heads, tokens, tokens), class token first; at most " +
                    std::to_string(kMaxRawTokens) + " tokens. With an attention pool also <stem>_pool_attn.npy: float32 "
                    "(heads, tokens), the pool's weights (0 for prefix tokens)");
  cmd->add_flag("--force", s.force,
                "Replace files with the outputs' names that vitlens did not write (without it such a file stops "
                "that image's export and is named; vitlens replaces its own earlier outputs either way)");
  cmd->add_flag("--quiet,-q", args.quiet, "Print nothing but errors");
}

}  // namespace

void add_export_command(CLI::App& app, ExportArgs& args) {
  CLI::App* cmd = app.add_subcommand("export", "Write per-head attention heatmaps, a montage and a JSON sidecar for each image");
  add_input_options(cmd, args);
  add_query_options(cmd, args);
  add_layer_options(cmd, args);
  add_look_options(cmd, args);
  add_pass_options(cmd, args);
  add_output_flags(cmd, args);
}

namespace {

// The written files' names, short and exact: names that differ only in numbers that cover whole
// ranges are folded as the shell writes them ("photo_head{0..3}.png"); any other name is listed.
std::string describe_files(const std::vector<std::string>& paths) {
  struct Group {
    std::vector<std::string> parts;              // the text between the numbers (numbers + 1 parts)
    std::vector<std::vector<std::string>> runs;  // per name, its numbers
  };
  std::vector<std::string> order;
  std::map<std::string, Group> groups;
  for (const std::string& path : paths) {
    const std::string name = std::filesystem::path(path).filename().string();
    std::vector<std::string> parts(1), numbers;
    for (size_t i = 0; i < name.size();) {
      if (std::isdigit(static_cast<unsigned char>(name[i]))) {
        size_t j = i;
        while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
        numbers.push_back(name.substr(i, j - i));
        parts.emplace_back();
        i = j;
      } else {
        parts.back() += name[i++];
      }
    }
    std::string shape;
    for (const std::string& part : parts) shape += part + '\0';
    if (!groups.count(shape)) order.push_back(shape);
    groups[shape].parts = parts;
    groups[shape].runs.push_back(numbers);
  }
  std::string out;
  auto emit = [&](const std::string& text) { out += (out.empty() ? "" : ", ") + text; };
  for (const std::string& shape : order) {
    const Group& g = groups[shape];
    const size_t runs = g.parts.size() - 1;
    // Foldable when each number that varies takes every value of a range (written without
    // leading zeros) and the names are exactly all their combinations; a number the names share
    // is kept as written ("img001_head{0..3}.png").
    std::vector<bool> constant(runs, true);
    for (const auto& numbers : g.runs)
      for (size_t k = 0; k < runs; ++k) constant[k] = constant[k] && numbers[k] == g.runs[0][k];
    std::vector<std::set<long>> values(runs);
    bool foldable = g.runs.size() > 1;
    std::set<std::vector<std::string>> distinct(g.runs.begin(), g.runs.end());
    for (const auto& numbers : g.runs)
      for (size_t k = 0; k < runs; ++k) {
        const std::string& n = numbers[k];
        if (constant[k]) continue;
        if (n.size() > 9 || (n.size() > 1 && n[0] == '0')) foldable = false;
        else values[k].insert(std::stol(n));
      }
    size_t combinations = 1;
    for (size_t k = 0; k < runs; ++k) {
      const auto& v = values[k];
      if (!v.empty() && static_cast<size_t>(*v.rbegin() - *v.begin() + 1) != v.size()) foldable = false;
      if (!constant[k]) combinations *= v.size();
    }
    if (!foldable || distinct.size() != g.runs.size() || combinations != g.runs.size()) {
      for (const auto& numbers : g.runs) {
        std::string name = g.parts[0];
        for (size_t k = 0; k < runs; ++k) name += numbers[k] + g.parts[k + 1];
        emit(name);
      }
      continue;
    }
    std::string name = g.parts[0];
    for (size_t k = 0; k < runs; ++k) {
      const auto& v = values[k];
      name += (constant[k] ? g.runs[0][k] : "{" + std::to_string(*v.begin()) + ".." + std::to_string(*v.rbegin()) + "}") +
              g.parts[k + 1];
    }
    emit(name);
  }
  return out;
}

// [SECTION] Run

// The query the flags chose (they exclude each other).
void select_query(const ExportArgs& args, ExportSettings& s) {
  if (!args.query.empty()) {
    s.select = QuerySelect::SourcePixel;
    parse_pair(args.query, "--query", s.query_x, s.query_y);
  } else if (!args.query_processed.empty()) {
    s.select = QuerySelect::Pixel;
    parse_pair(args.query_processed, "--query-processed", s.query_x, s.query_y);
  } else if (!args.patch.empty()) {
    s.select = QuerySelect::Patch;
    parse_pair(args.patch, "--patch", s.patch_row, s.patch_col);
  } else if (!args.token.empty()) {
    s.select = QuerySelect::Token;
    s.token = args.token;
  } else if (args.pool) {
    s.select = QuerySelect::Pool;
  } else {
    s.select = args.cls ? QuerySelect::ClassToken : QuerySelect::Received;
  }
}

// What the export writes: one layer's maps, every layer of a range, or the rollout.
struct ExportWork {
  bool rollout = false;
  bool layer_range = false;  // --layer A-B or all (not with --rollout all: that is the default)
  int first_layer = -1, last_layer = -1;
  RolloutOptions rollout_options;
};

// The flags checked against each other and against the model, before any image is read.
ExportWork plan_work(const ExportArgs& args, const VitModel& model) {
  const LayerChoice& layer = args.layer;
  const int depth = model.config.depth;
  ExportWork w;
  w.rollout = args.rollout;
  w.layer_range = layer.kind == LayerChoice::Kind::Range || (layer.kind == LayerChoice::Kind::All && !args.rollout);
  if (w.layer_range) {
    w.first_layer = layer.first;
    w.last_layer = layer.kind == LayerChoice::Kind::All ? depth - 1 : layer.last;
  }
  if (w.layer_range && w.last_layer >= depth)
    throw UsageError("--layer " + layer.text + " is out of range: model '" + model.config.name + "' has " +
                     std::to_string(depth) + " layer(s), 0 to " + std::to_string(depth - 1));
  w.rollout_options.fusion = args.fusion;
  w.rollout_options.discard_ratio = args.discard;
  if (args.rollout && w.layer_range) {
    w.rollout_options.first_layer = w.first_layer;
    w.rollout_options.last_layer = w.last_layer;
  } else if (args.rollout && layer.kind == LayerChoice::Kind::One) {
    w.rollout_options.last_layer = layer.first;  // --rollout --layer L: layers 0 to L
  }
  if (args.settings.select == QuerySelect::Pool && (args.rollout || w.layer_range))
    throw UsageError(std::string("--pool shows the attention pool, which reads the last layer's output; ") +
                     (args.rollout ? "--rollout follows" : "--layer " + layer.text + " covers") + " the blocks' attention");
  if (args.rollout && args.settings.select == QuerySelect::Received && !model.config.class_token)
    throw UsageError("--rollout: model '" + model.config.name + "' has no class token; choose a query with --patch or --query");
  return w;
}

// --preprocess model: the checkpoint's own transform, refused with the flags that name pixels of
// the original file (the transform crops or resizes it) and for a model that publishes none.
void choose_preprocess(const ExportArgs& args, const std::string& model_path, const VitModel& model, ExportSettings& s) {
  if (args.preprocess != "model") return;
  if (s.max_side >= 0) throw UsageError("--size sets the whole-image mode's working size; --preprocess model takes the model's own");
  if (!args.query.empty())
    throw UsageError("--query names a pixel of the file, which --preprocess model crops or resizes; use --query-processed or --patch");
  if (!s.mask_image.empty())
    throw UsageError("--mask-image covers the whole file, which --preprocess model crops or resizes; use --preprocess whole");
  s.transform = read_model_transform(model_path, model.format);
  if (!s.transform.present())
    throw UsageError("--preprocess model: " + model_path + " " + missing_transform_reason(model.format) +
                     "; use --preprocess whole");
}

// Settings that cannot fit this model are usage errors; a mask that cannot be read is a file's error.
void check_against_model(const VitModel& model, const ExportSettings& s) {
  try {
    check_settings(model, s);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (s.mask_image.empty()) return;
  try {
    load_image_rgb(s.mask_image);  // a mask that cannot be read is a bad file (exit 1), found before any image
  } catch (const Error& e) {
    throw Error(std::string("--mask-image: ") + e.what());
  }
}

// The run's stem chooser (StemChooser, export_layers.hpp): every file the run reads, the mask too,
// is an input no output may replace.
StemChooser stem_chooser(const ExportArgs& args, const VitModel& model, const ExportWork& work) {
  ExportPlan plan;
  plan.kind = work.rollout ? ExportPlan::Kind::Rollout : work.layer_range ? ExportPlan::Kind::Layers : ExportPlan::Kind::Maps;
  plan.heads = model.config.num_heads;
  plan.raw = args.settings.raw;
  plan.pool = model.config.attention_pool;
  plan.first_layer = work.first_layer;
  plan.last_layer = work.last_layer;
  std::vector<std::string> inputs = args.images;
  if (!args.settings.mask_image.empty()) inputs.push_back(args.settings.mask_image);
  return StemChooser(args.settings.out_dir, plan, inputs);
}

// One image's files, as the work asks.
std::vector<std::string> export_image(const VitModel& model, const std::string& image, const ExportSettings& settings,
                                      const ExportWork& work) {
  if (work.rollout) return export_rollout(model, image, settings, work.rollout_options);
  if (work.layer_range) return export_layers(model, image, settings, work.first_layer, work.last_layer);
  return write_export(model, analyse_image(model, image, settings), settings);
}

// The failure of one image, in one line naming it (the batch goes on).
std::string failure_line(const std::string& image, const std::exception& e) {
  const std::string what = e.what();
  std::string line = what.rfind(image, 0) == 0 ? what : image + ": " + what;
  if (const auto* conflict = dynamic_cast<const OutputConflict*>(&e); conflict && conflict->forcible)
    line += "; move it away, or --force replaces it";
  return line;
}

// The progress line on a terminal: "[i/total] name", then the forward pass's percentage.
struct Progress {
  bool shown = false;
  int index = 0, total = 0;
  std::string name;
  void start(int i, const std::string& shown_name) {
    index = i;
    name = shown_name;
    if (shown) std::fprintf(stderr, "\r[%d/%d] %s\033[K", index + 1, total, name.c_str());
  }
  std::function<bool(float)> percent() {
    return [this, last = -1](float done) mutable {
      const int p = static_cast<int>(done * 100.0f);
      if (p != last) {
        last = p;
        std::fprintf(stderr, "\r[%d/%d] %s %3d%%\033[K", index + 1, total, name.c_str(), p);
      }
      return true;
    };
  }
  void clear() const {
    if (shown) std::fprintf(stderr, "\r\033[K");
  }
};

// The record's top classes under the image's line, one a line ("  1.  87.31 %  tabby cat"): read
// back from the record just written, so the terminal says what the file says. Nothing for a
// model without a classifier (its record says so).
void print_predictions(const std::vector<std::string>& files) {
  if (files.empty() || std::filesystem::path(files.back()).extension() != ".json") return;
  std::ifstream in(files.back(), std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json record = parse_json_or_discarded(text);
  if (!record.is_object() || !record.contains("predictions") || !record["predictions"].is_array()) return;
  for (const nlohmann::json& p : record["predictions"])
    std::printf("  %s\n", terminal_text(prediction_line(p.at("rank").get<int>(), p.at("probability").get<double>(),
                                                         p.at("label").get<std::string>())).c_str());
}

// Exports one image and prints its line, then its top classes; false when it failed (reported on stderr).
bool run_one(const VitModel& model, const std::string& image, ExportSettings settings, const ExportWork& work,
             Progress& progress, bool quiet) {
  if (progress.shown) settings.progress = progress.percent();  // a long forward pass shows its percentage
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> files = export_image(model, image, settings, work);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) {
      progress.clear();
      std::printf("%s: %zu files in %s (%s), %.0f ms\n", progress.name.c_str(), files.size(),
                  terminal_text(settings.out_dir).c_str(), terminal_text(describe_files(files)).c_str(), ms);
      print_predictions(files);
      std::fflush(stdout);
    }
    return true;
  } catch (const std::bad_alloc&) {
    progress.clear();
    report_error(image + ": " + kOutOfMemory);
  } catch (const std::exception& e) {
    // Any failure of one image (a vitlens::Error, an output conflict, an allocation or OpenCV
    // error) is reported in one line naming the image, and the batch goes on.
    progress.clear();
    report_error(failure_line(image, e));
  }
  return false;
}

}  // namespace

int run_export(ExportArgs& args) {
  ExportSettings& s = args.settings;
  if (s.threshold > 0.0f && args.rollout) throw UsageError("--threshold applies to attention maps, not to --rollout");
  if (args.layer.kind == LayerChoice::Kind::One) s.layer = args.layer.first;
  s.causal = args.mask == "causal";
  if (!parse_precision(args.precision, s.precision))
    throw UsageError("--precision must be fp32, bf16 or auto, got '" + args.precision + "'");
  select_query(args, s);

  LoadOptions load;
  load.heads = args.heads;
  const std::string model_path = resolve_model(args.model);
  const VitModel model = load_model(model_path, load);
  choose_preprocess(args, model_path, model, s);
  check_against_model(model, s);
  make_missing_folder(s.out_dir, "the output folder");
  const ExportWork work = plan_work(args, model);
  require_writable_dir(s.out_dir);

  StemChooser stems = stem_chooser(args, model, work);
  Progress progress;
  progress.shown = ::isatty(STDERR_FILENO) && !args.quiet;
  progress.total = static_cast<int>(args.images.size());
  int failed = 0;
  for (int i = 0; i < progress.total; ++i) {
    const std::string& image = args.images[static_cast<size_t>(i)];
    progress.start(i, terminal_text(image));  // a file's name may hold escape sequences
    ExportSettings settings = s;
    settings.stem = stems.choose(image);
    if (!run_one(model, image, settings, work, progress, args.quiet)) ++failed;
  }
  progress.clear();
  if (failed > 0) {
    if (progress.total > 1) report_error(std::to_string(failed) + " of " + std::to_string(progress.total) + " image(s) failed");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace vitlens::cli
