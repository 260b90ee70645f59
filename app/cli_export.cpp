// `vitlens export`: heatmaps, montage, JSON and optional raw weights for each image.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.hpp"
#include "core/base/error.hpp"
#include "core/render/export_layers.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "models/bundled_models.hpp"
#include "models/model_io.hpp"

namespace vitlens::cli {

void add_export_command(CLI::App& app, ExportArgs& args) {
  CLI::App* cmd = app.add_subcommand("export", "Write per-head attention heatmaps, a montage and a JSON sidecar for each image");
  cmd->add_option("IMAGE", args.images, "Image files (PNG, JPEG, BMP, TIFF, WebP, ...)")->required();
  cmd->add_option("--model,-m", args.model, kModelOptionHelp);
  add_heads_option(cmd, args.heads);
  cmd->add_option("--out,-o", args.settings.out_dir,
                  "Folder to write into; created (with its parents) when missing")
      ->capture_default_str();
  auto* query = cmd->add_option("--query", args.query,
                                "Map of the query patch under pixel X,Y of the IMAGE as given (before any resizing)");
  auto* query_processed = cmd->add_option(
      "--query-processed", args.query_processed,
      "Map of the query patch under pixel X,Y of the processed image (resized to --size and padded to whole patches)");
  query->type_name("X,Y");
  query_processed->type_name("X,Y");
  auto* patch = cmd->add_option("--patch", args.patch, "Map of the query patch at ROW,COL of the patch grid");
  auto* cls = cmd->add_flag("--cls", args.cls, "Map of the class token's attention (models with a class token)");
  auto* received = cmd->add_flag("--received", args.received,
                                 "Attention received: mean over queries of each patch's column (the default)");
  auto* token = cmd->add_option("--token", args.token,
                                "Map of a prefix token's attention row: cls (class token), dist (distillation token, "
                                "distilled DeiT) or regK (register K of DINOv2 with registers, K from 0)");
  token->type_name("NAME");
  query->excludes(query_processed)->excludes(patch)->excludes(cls)->excludes(received)->excludes(token);
  query_processed->excludes(patch)->excludes(cls)->excludes(received)->excludes(token);
  patch->excludes(cls)->excludes(received)->excludes(token);
  cls->excludes(received)->excludes(token);
  received->excludes(token);
  cmd->add_option("--layer", args.layer,
                  "Layer (block) index L, 0-based (default: the last); a range A-B or 'all' writes every layer's files "
                  "(<stem>_layer<L>_*) and a layers x heads montage (<stem>_layers_montage.png, recorded in <stem>_layers.json)");
  cmd->add_flag("--rollout", args.rollout,
                "Attention rollout (Abnar & Zuidema) from the class token, or from the --patch / --query patch: "
                "<stem>_rollout.png and .json; with --layer A-B over those layers");
  cmd->add_option("--fusion", args.fusion, "Rollout: how each layer's heads are fused")
      ->check(CLI::IsMember({"mean", "max", "min"}))
      ->capture_default_str();
  cmd->add_option("--discard", args.discard,
                  "Rollout: fraction of each layer's lowest fused weights set to zero (never the class token's own), 0 to below 1")
      ->check(CLI::Range(0.0f, 0.999999f))
      ->capture_default_str();
  cmd->add_option("--mask", args.mask, "Attention mask applied before the softmax (padding patches are always masked)")
      ->check(CLI::IsMember({"none", "causal"}))
      ->capture_default_str();
  cmd->add_option("--colormap", args.settings.style.colormap, "Colour map")
      ->check(CLI::IsMember(colormap_names()))
      ->capture_default_str();
  cmd->add_option("--alpha", args.settings.style.alpha, "Heatmap opacity over the image, 0 to 1")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--upsample", args.upsample, "Patch map to pixels")
      ->check(CLI::IsMember({"nearest", "bilinear"}))
      ->capture_default_str();
  cmd->add_option("--mask-image", args.settings.mask_image,
                  "Painted key mask: an image of the IMAGE's aspect ratio, white = key allowed, black = forbidden; "
                  "stretched over the image, a patch is forbidden when the mask's mean over it is below 50% grey "
                  "(padding patches are always masked)")
      ->type_name("FILE");
  cmd->add_option("--temperature", args.settings.temperature,
                  "Softmax temperature T: scores are q.k / (sqrt(d) T); T > 1 flattens, T < 1 sharpens; " +
                      std::string("0.05 to 20"))
      ->type_name("T")
      ->capture_default_str();
  cmd->add_option("--precision", args.precision,
                  "The Linear layers' arithmetic: fp32 (exact, as PyTorch), bf16 (bfloat16 operands, float32 sums; "
                  "softmax, LayerNorm and the residual stay float32) or auto (bf16 for models of 20 M parameters "
                  "or more on a CPU with bfloat16 dot products, else fp32); recorded in the caption and the JSON")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}))
      ->capture_default_str();
  cmd->add_option("--threshold", args.threshold,
                  "Keep only the largest patches that hold this share of each map's mass, 0 < MASS <= 1 (DINO's "
                  "--threshold); ties are kept together, a map with no structure is shown whole")
      ->type_name("MASS");
  cmd->add_option("--normalize", args.normalize,
                  "robust: each head from 0 to its 99th percentile, raised so at most 10% of its weight saturates (the default); head: each "
                  "head to its own maximum; shared: one scale for all heads; log: each head on a 3-decade log scale")
      ->check(CLI::IsMember({"robust", "head", "shared", "log"}))
      ->capture_default_str();
  cmd->add_option("--size", args.settings.max_side,
                  "Working size: images with a longer side are downscaled to it (aspect kept); 0 = native size (at most 2048); "
                  "default: the model's img_size long side. An image of exactly the model's img_size is never resampled")
      ->check(CLI::Range(0, 2048));
  cmd->add_flag("--raw", args.settings.raw,
                "Also write <stem>_attn.npy: float32 (layers, heads, tokens, tokens), class token first; at most " +
                    std::to_string(kMaxRawTokens) + " tokens");
  cmd->add_flag("--force", args.settings.force,
                "Replace files with the outputs' names that vitlens did not write (without it such a file stops "
                "that image's export and is named; vitlens replaces its own earlier outputs either way)");
  cmd->add_flag("--quiet,-q", args.quiet, "Print nothing but errors");
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

// (device, inode) of a path, following links; {0, 0} when it cannot be read.
std::pair<dev_t, ino_t> file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

}  // namespace

int run_export(ExportArgs& args) {
  ExportSettings& s = args.settings;
  // CLI::Range lets NaN through (every comparison with NaN is false).
  if (!(s.style.alpha >= 0.0f && s.style.alpha <= 1.0f))
    throw UsageError("--alpha must be a number from 0 to 1, got " + std::to_string(s.style.alpha));
  // CLI::Range lets NaN through too; these are checked here, with the flag's name.
  if (!(s.temperature >= kMinTemperature && s.temperature <= kMaxTemperature))
    throw UsageError("--temperature must be a number from 0.05 to 20, got " + std::to_string(s.temperature));
  if (!parse_precision(args.precision, s.precision))
    throw UsageError("--precision must be fp32, bf16 or auto, got '" + args.precision + "'");
  if (!args.threshold.empty()) {
    size_t used = 0;
    float mass = 0.0f;
    try {
      mass = std::stof(args.threshold, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != args.threshold.size() || !(mass > 0.0f && mass <= 1.0f))
      throw UsageError("--threshold must be a mass in (0, 1] (the share of each map to keep), got '" + args.threshold + "'");
    s.threshold = mass;
  }
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
  } else if (args.cls) {
    s.select = QuerySelect::ClassToken;
  } else {
    s.select = QuerySelect::Received;
  }
  // --layer: one index, a range A-B, or all (the range is checked against the model below).
  int first_layer = -1, last_layer = -1;
  bool layer_range = false;
  if (!args.layer.empty()) {
    auto parse_index = [&](const std::string& text) {
      size_t used = 0;
      long v = -1;
      try {
        v = std::stol(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (text.empty() || used != text.size() || v < 0 || v > 1000000 || text[0] == '-' || text[0] == '+')
        throw UsageError("--layer expects a layer index L, a range A-B (0-based) or 'all'; got '" + args.layer + "'");
      return static_cast<int>(v);
    };
    const auto dash = args.layer.find('-', 1);
    if (args.layer == "all") {
      layer_range = true;
      first_layer = 0;
    } else if (dash != std::string::npos && args.layer[0] != '-') {
      layer_range = true;
      first_layer = parse_index(args.layer.substr(0, dash));
      last_layer = parse_index(args.layer.substr(dash + 1));
      if (last_layer < first_layer)
        throw UsageError("--layer " + args.layer + ": the range's end is before its start");
    } else {
      s.layer = parse_index(args.layer);
    }
  }
  if (s.threshold > 0.0f && args.rollout)
    throw UsageError("--threshold applies to attention maps, not to --rollout");
  if (!(args.discard >= 0.0f && args.discard < 1.0f))
    throw UsageError("--discard must be a number from 0 to below 1");
  if (args.rollout && layer_range && args.layer == "all") layer_range = false;  // rollout over all layers: the default
  s.causal = args.mask == "causal";
  s.style.upsample = args.upsample == "bilinear" ? Upsample::Bilinear : Upsample::Nearest;
  if (!parse_normalize_name(args.normalize, s.normalize)) throw UsageError("unknown --normalize " + args.normalize);

  const std::string model_path = resolve_model(args.model);
  LoadOptions load;
  load.heads = args.heads;
  const VitModel model = load_model(model_path, load);
  try {
    check_settings(model, s);  // flags that cannot fit this model are usage errors, found before any work
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (!s.mask_image.empty()) {
    try {
      load_image_rgb(s.mask_image);  // a mask that cannot be read is a bad flag, found before any image
    } catch (const Error& e) {
      throw UsageError(std::string("--mask-image: ") + e.what());
    }
  }
  // A missing output folder is made, with its parents, as `mkdir -p` would; a path that exists
  // and is not a folder is refused by require_writable_dir.
  std::error_code ec;
  if (!std::filesystem::exists(s.out_dir, ec) && !std::filesystem::is_symlink(s.out_dir, ec)) {
    std::filesystem::create_directories(s.out_dir, ec);
    if (ec) throw Error(s.out_dir + ": cannot create the output folder (" + ec.message() + ")");
  }
  if (layer_range && last_layer < 0) last_layer = model.config.depth - 1;
  if (layer_range && last_layer >= model.config.depth)
    throw UsageError("--layer " + args.layer + " is out of range: model '" + model.config.name + "' has " +
                     std::to_string(model.config.depth) + " layer(s), 0 to " + std::to_string(model.config.depth - 1));
  RolloutOptions rollout;
  rollout.fusion = args.fusion == "max" ? HeadFusion::Max : args.fusion == "min" ? HeadFusion::Min : HeadFusion::Mean;
  rollout.discard_ratio = args.discard;
  if (args.rollout && layer_range) {
    rollout.first_layer = first_layer;
    rollout.last_layer = last_layer;
  } else if (args.rollout && s.layer >= 0) {
    rollout.last_layer = s.layer;  // --rollout --layer L: layers 0 to L
  }
  if (args.rollout && s.select == QuerySelect::Received && !model.config.class_token)
    throw UsageError("--rollout: model '" + model.config.name + "' has no class token; choose a query with --patch or --query");
  require_writable_dir(s.out_dir);

  const bool show_progress = ::isatty(STDERR_FILENO) && !args.quiet;
  // Outputs must never replace an input, even one vitlens wrote (exporting "a.png a_mean.png" or
  // "a.png a_rollout.png --rollout" into their own folder would otherwise overwrite the second
  // before reading it): a stem any of whose outputs is an input (the same file, by device and
  // inode, whatever the path) is taken.
  ExportPlan plan;
  plan.kind = args.rollout ? ExportPlan::Kind::Rollout : layer_range ? ExportPlan::Kind::Layers : ExportPlan::Kind::Maps;
  plan.heads = model.config.num_heads;
  plan.raw = s.raw;
  plan.first_layer = first_layer;
  plan.last_layer = last_layer;
  std::set<std::pair<dev_t, ino_t>> inputs;
  std::vector<std::string> input_files = args.images;  // every file the run reads, the mask too
  if (!s.mask_image.empty()) input_files.push_back(s.mask_image);
  for (const std::string& file : input_files)
    if (const auto id = file_identity(file); id.second != 0) inputs.insert(id);
  auto clobbers_input = [&](const std::string& stem) {
    for (const std::string& name : export_output_names(stem, plan))
      if (inputs.count(file_identity(s.out_dir + "/" + name))) return true;
    return false;
  };
  std::set<std::string> stems_used;
  int failed = 0;
  const int total = static_cast<int>(args.images.size());
  for (int i = 0; i < total; ++i) {
    const std::string& image = args.images[static_cast<size_t>(i)];
    const std::string shown = terminal_text(image);  // a file's name may hold escape sequences
    if (show_progress) std::fprintf(stderr, "\r[%d/%d] %s\033[K", i + 1, total, shown.c_str());
    // Two inputs must not overwrite each other's outputs: a stem already taken (by an input of
    // the same name, or by a generated "x_2") gets the next free suffix.
    ExportSettings settings = s;
    settings.stem = output_stem(image);
    for (int k = 2; stems_used.count(settings.stem) || clobbers_input(settings.stem); ++k)
      settings.stem = output_stem(image) + "_" + std::to_string(k);
    stems_used.insert(settings.stem);
    // On a terminal, a long forward pass shows its percentage on the progress line.
    if (show_progress) {
      settings.progress = [&, last = -1](float done) mutable {
        const int percent = static_cast<int>(done * 100.0f);
        if (percent != last) {
          last = percent;
          std::fprintf(stderr, "\r[%d/%d] %s %3d%%\033[K", i + 1, total, shown.c_str(), percent);
        }
        return true;
      };
    }
    try {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::string> files =
          args.rollout  ? export_rollout(model, image, settings, rollout)
          : layer_range ? export_layers(model, image, settings, first_layer, last_layer)
                        : std::vector<std::string>{};
      if (!args.rollout && !layer_range) {
        const ImageAnalysis analysis = analyse_image(model, image, settings);
        files = write_export(model, analysis, settings);
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!args.quiet) {
        if (show_progress) std::fprintf(stderr, "\r\033[K");
        std::printf("%s: %zu files in %s (%s), %.0f ms\n", shown.c_str(), files.size(),
                    terminal_text(s.out_dir).c_str(), terminal_text(describe_files(files)).c_str(), ms);
        std::fflush(stdout);
      }
    } catch (const std::bad_alloc&) {
      if (show_progress) std::fprintf(stderr, "\r\033[K");
      report_error(image + ": " + kOutOfMemory);
      ++failed;
    } catch (const OutputConflict& e) {
      if (show_progress) std::fprintf(stderr, "\r\033[K");
      const std::string what = e.what();
      report_error((what.rfind(image, 0) == 0 ? what : image + ": " + what) +
                   (e.forcible ? "; move it away, or --force replaces it" : ""));
      ++failed;
    } catch (const std::exception& e) {
      // Any failure of one image (a vitlens::Error, or an allocation or OpenCV error) is reported
      // in one line naming the image, and the batch goes on.
      if (show_progress) std::fprintf(stderr, "\r\033[K");
      const std::string what = e.what();
      report_error(what.rfind(image, 0) == 0 ? what : image + ": " + what);
      ++failed;
    }
  }
  if (show_progress) std::fprintf(stderr, "\r\033[K");
  if (failed > 0) {
    if (total > 1) report_error(std::to_string(failed) + " of " + std::to_string(total) + " image(s) failed");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace vitlens::cli
