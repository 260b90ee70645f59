// Every layer of a range, and attention rollout, written the way export.cpp writes one layer.
#include "core/render/export_layers.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <numeric>
#include <set>
#include <utility>

#include <sys/stat.h>

#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/io/files.hpp"

namespace vitlens {

double layers_montage_scale(double tiles, double tile_pixels) {
  const double pixels = tiles * tile_pixels;
  return pixels > kMaxLayersMontagePixels ? std::sqrt(kMaxLayersMontagePixels / pixels) : 1.0;
}

std::vector<std::string> export_layers(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                                       int first, int last) {
  const int depth = model.config.depth;
  if (first < 0 || first > last || last >= depth)
    throw Error("--layer " + std::to_string(first) + "-" + std::to_string(last) + " is out of range: model '" +
                model.config.name + "' has " + std::to_string(depth) + " layer(s), 0 to " + std::to_string(depth - 1));
  require_writable_dir(settings.out_dir);
  ExportSettings per_layer = settings;
  per_layer.layer = first;
  ImageAnalysis a = analyse_image(model, image_path, per_layer);  // one forward pass for every layer
  const std::string stem = settings.stem.empty() ? output_stem(image_path) : settings.stem;
  // Every layer's files and record, the layers montage and the weights are one set: all of them
  // appear, or none (files.hpp: OutputSet); <stem>_layers.json, the set's record, comes last.
  OutputSet set(settings.out_dir, settings.force);
  std::vector<cv::Mat> tiles;
  std::vector<std::string> labels;
  const double tile_count = static_cast<double>(last - first + 1) * (model.config.num_heads + 1);
  const auto keep_tile = [&](const cv::Mat& tile) {  // at the montage's scale (every tile has one size)
    const double scale = layers_montage_scale(tile_count, static_cast<double>(tile.total()));
    if (scale >= 1.0) {
      tiles.push_back(tile);
      return;
    }
    cv::Mat small;
    cv::resize(tile, small, cv::Size(std::max(1, static_cast<int>(tile.cols * scale)), std::max(1, static_cast<int>(tile.rows * scale))),
               0, 0, cv::INTER_AREA);
    tiles.push_back(small);
  };
  for (int l = first; l <= last; ++l) {
    a.request.layer = l;
    if (l != first) {
      a.maps = attention_maps(model, a.forward, a.request);
      if (settings.threshold > 0.0f) a.kept = apply_threshold(a.maps, settings.threshold);  // as analyse_image
    }
    per_layer.layer = l;
    per_layer.stem = layer_stem(stem, l);
    per_layer.raw = false;  // the (L, H, N, N) weights hold every layer: written once below
    const MapsOutputNames layer_names = maps_output_names(per_layer.stem, model.config.num_heads, false, false);
    const size_t first_file = set.size();
    set.add_record(layer_names.record, add_export_files(set, model, a, per_layer, layer_names), first_file);
    const ExportImages images = render_export_images(model, a, settings.style, settings.normalize);
    const std::vector<float> scales = map_scales(a.maps, settings.normalize);
    const std::string layer = "L" + std::to_string(l) + " ";
    for (size_t h = 0; h < images.heads.size(); ++h) {
      keep_tile(images.heads[h]);
      labels.push_back(tile_label(layer + head_label(model.config, l, static_cast<int>(h)), a.maps.heads[h], scales[h],
                                  settings.normalize));
    }
    keep_tile(images.mean);
    labels.push_back(tile_label(layer + "mean", a.maps.mean, scales.back(), settings.normalize));
  }
  const LayersOutputNames names = layers_output_names(stem, settings.raw);
  // The head montage's legend: each layer has its own shared scale, so the bar is relative then.
  const ColourBarSpec bar = montage_colour_bar(settings.style, settings.normalize, 0.0f);
  a.request.layer = first;  // the caption names the range first .. last
  set.add_png(names.montage, montage(tiles, labels, model.config.num_heads + 1, &bar,
                                     montage_caption(model, a, settings.normalize, last)));
  if (!names.raw.empty()) add_attention_npy(set, names.raw, a.forward, model.config.num_heads, image_path);
  nlohmann::json record;
  record["image"] = image_path;
  record["model"] = {{"name", model.config.name}, {"file", model.source}, {"depth", depth},
                     {"num_heads", model.config.num_heads}};
  record["layers"] = {first, last};
  add_pass_record(record, a.transform, a.forward.precision);
  nlohmann::json layer_records = nlohmann::json::array();
  for (int l = first; l <= last; ++l) layer_records.push_back(maps_output_names(layer_stem(stem, l), 0, false, false).record);
  record["layer_records"] = layer_records;
  add_predictions(record, model, a.forward, a.predictions);
  return set.commit(names.record, std::move(record));
}

std::vector<std::string> export_rollout(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                                        const RolloutOptions& rollout) {
  require_writable_dir(settings.out_dir);
  if (settings.select == QuerySelect::Received && !model.config.class_token)
    throw Error("--rollout: model '" + model.config.name + "' has no class token; choose a query with --patch or --query");
  ExportSettings keep = settings;
  keep.raw = true;  // rollout multiplies the full (N, N) weights; analyse_image checks their size
  const auto t0 = std::chrono::steady_clock::now();
  const ImageAnalysis a = analyse_image(model, image_path, keep, "--rollout multiplies every layer's (N, N) weights");
  const int query = rollout_query(model, a.request);
  const MatRM matrix = attention_rollout(a.forward, rollout);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return write_rollout(model, image_path, a.image, a.forward, matrix, query, rollout, settings, ms);
}

int rollout_query(const VitModel& model, const MapRequest& request) {
  if (request.mode == MapMode::Query) return request.query_token;
  if (!model.config.class_token)
    throw Error("--rollout: model '" + model.config.name + "' has no class token; choose a query with --patch or --query");
  return model.config.class_index();
}

namespace {

// The rollout keeps its maximum (or log) scale whatever the maps' default: its rows are products
// of whole layers, with no hot patch to saturate.
Normalize rollout_normalize(const ExportSettings& settings) {
  return settings.normalize == Normalize::Log ? Normalize::Log : Normalize::PerHead;
}

}  // namespace

cv::Mat rollout_picture(const VitModel& model, const PreparedImage& image, const MatRM& map, const ExportSettings& settings) {
  const Normalize normalize = rollout_normalize(settings);
  return heatmap_overlay(image.rgb, display_values(map, map.maxCoeff(), normalize), model.config.patch_size, 1.0f,
                         settings.style);
}

cv::Mat rollout_figure(const VitModel& model, const PreparedImage& image, const ForwardResult& forward, const MatRM& map,
                       int query, const RolloutOptions& rollout, const ExportSettings& settings) {
  const Normalize normalize = rollout_normalize(settings);
  cv::Mat base;
  image.rgb.convertTo(base, CV_8UC3, 255.0);
  const std::string from = token_name(model.config, forward.grid_w, query);
  const std::vector<cv::Mat> tiles = {base, rollout_picture(model, image, map, settings)};
  const std::vector<std::string> labels = {"image " + std::to_string(image.padded_w) + "x" + std::to_string(image.padded_h),
                                           tile_label("rollout of the " + from, map, map.maxCoeff(), normalize)};
  const int last = rollout.last_layer < 0 ? model.config.depth - 1 : rollout.last_layer;
  std::vector<std::string> caption = {
      "model " + model.config.name + ", rollout of layers " + std::to_string(rollout.first_layer) + " to " +
          std::to_string(last) + " of depth " + std::to_string(model.config.depth) + ", " + std::to_string(forward.tokens) +
          " tokens",
      "heads fused by " + std::string(head_fusion_name(rollout.fusion)) + ", lowest " +
          std::to_string(static_cast<int>(std::lround(rollout.discard_ratio * 100.0f))) +
          "% discarded, identity added, rows renormalised, layers multiplied",
      "the " + from + "'s row: how much of each patch reaches its output", scale_phrase(normalize)};
  for (std::string& phrase : forward_caption(model, forward, settings.mask_image)) caption.push_back(std::move(phrase));
  const ColourBarSpec bar = montage_colour_bar(settings.style, normalize, map.maxCoeff());
  return montage(tiles, labels, 2, &bar, caption);
}

std::vector<std::string> write_rollout(const VitModel& model, const std::string& image_path, const PreparedImage& image,
                                       const ForwardResult& forward, const MatRM& matrix, int query,
                                       const RolloutOptions& rollout, const ExportSettings& settings, double ms) {
  const MatRM map = rollout_map(matrix, forward, query);
  const RolloutOutputNames names = rollout_output_names(settings.stem.empty() ? output_stem(image_path) : settings.stem,
                                                        !settings.view_notes.is_null());
  require_writable_dir(settings.out_dir);
  const float top = map.maxCoeff();
  // The picture and the record appear together or not at all (files.hpp: OutputSet).
  OutputSet set(settings.out_dir, settings.force);
  set.add_png(names.picture, rollout_figure(model, image, forward, map, query, rollout, settings));
  if (!names.view_notes.empty()) set.add(names.view_notes, settings.view_notes.dump(2) + "\n");

  nlohmann::json j;
  j["image"] = image_path;
  j["model"] = {{"name", model.config.name}, {"file", model.source}, {"depth", model.config.depth},
                {"num_heads", model.config.num_heads}};
  j["grid"] = {forward.grid_h, forward.grid_w};
  j["tokens"] = forward.tokens;
  j["query"] = {{"token", query}, {"name", token_name(model.config, forward.grid_w, query)}};
  const int last = rollout.last_layer < 0 ? model.config.depth - 1 : rollout.last_layer;
  j["rollout"] = {{"head_fusion", head_fusion_name(rollout.fusion)},
                  {"discard_ratio", std::round(static_cast<double>(rollout.discard_ratio) * 1e6) / 1e6},
                  {"layers", {rollout.first_layer, last}}};
  j["map"] = {{"min", map_min(map, image_patches(forward))}, {"max", top}, {"sum", map.sum()}, {"entropy", map_entropy(map)}};
  // The rest of the query's row: how much of its output comes from the prefix tokens.
  nlohmann::json prefix = nlohmann::json::array();
  for (int t = 0; t < forward.prefix; ++t) prefix.push_back(matrix(query, t));
  j["prefix_weights"] = prefix;
  add_pass_record(j, settings.transform, forward.precision);
  add_predictions(j, model, forward, predict(model, forward));
  j["timings_ms"] = {{"forward_and_rollout", ms}};
  return set.commit(names.record, std::move(j));
}

// [SECTION] Output names

std::string layer_stem(const std::string& stem, int layer) { return stem + "_layer" + std::to_string(layer); }

LayersOutputNames layers_output_names(const std::string& stem, bool raw) {
  LayersOutputNames names;
  names.montage = stem + "_layers_montage.png";
  if (raw) names.raw = stem + "_layers_attn.npy";  // not the maps' _attn.npy: each set names its own files
  names.record = stem + "_layers.json";
  return names;
}

RolloutOutputNames rollout_output_names(const std::string& stem, bool view_notes) {
  RolloutOutputNames names;
  names.picture = stem + "_rollout.png";
  if (view_notes) names.view_notes = stem + "_rollout_view.json";
  names.record = stem + "_rollout.json";
  return names;
}

std::vector<std::string> export_output_names(const std::string& stem, const ExportPlan& plan) {
  std::vector<std::string> all;
  auto add = [&](std::initializer_list<std::string> names) {
    for (const std::string& name : names)
      if (!name.empty()) all.push_back(name);
  };
  auto add_maps = [&](const MapsOutputNames& maps) {
    all.insert(all.end(), maps.heads.begin(), maps.heads.end());
    add({maps.mean, maps.montage, maps.raw, maps.pool_raw, maps.view_notes, maps.record});
  };
  switch (plan.kind) {
    case ExportPlan::Kind::Maps: add_maps(maps_output_names(stem, plan.heads, plan.raw, plan.view_notes, plan.pool)); break;
    case ExportPlan::Kind::Layers: {
      for (int l = plan.first_layer; l <= plan.last_layer; ++l)
        add_maps(maps_output_names(layer_stem(stem, l), plan.heads, false, false));
      const LayersOutputNames layers = layers_output_names(stem, plan.raw);
      add({layers.montage, layers.raw, layers.record});
      break;
    }
    case ExportPlan::Kind::Rollout: {
      const RolloutOutputNames rollout = rollout_output_names(stem, plan.view_notes);
      add({rollout.picture, rollout.view_notes, rollout.record});
      break;
    }
  }
  return all;
}

namespace {

// (device, inode) of a path, following links; {0, 0} when it cannot be read.
std::pair<dev_t, ino_t> file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

}  // namespace

StemChooser::StemChooser(const std::string& out_dir, const ExportPlan& plan, const std::vector<std::string>& inputs)
    : out_dir_(out_dir), plan_(plan) {
  for (const std::string& file : inputs)
    if (const auto id = file_identity(file); id.second != 0) inputs_.insert(id);
  // Nor may a set's removal of its previous files take one the run has still to read.
  OutputSet::keep_inputs(inputs);
}

std::string StemChooser::choose(const std::string& image) {
  std::string stem = output_stem(image);
  for (int k = 2; used_.count(stem) || replaces_input(stem); ++k) stem = output_stem(image) + "_" + std::to_string(k);
  used_.insert(stem);
  return stem;
}

bool StemChooser::replaces_input(const std::string& stem) const {
  for (const std::string& name : export_output_names(stem, plan_))
    if (inputs_.count(file_identity(out_dir_ + "/" + name))) return true;
  return false;
}

}  // namespace vitlens
