// Export of one image's attention maps: the single path behind `vitlens export` and the viewer's
// export action.
#include "core/render/export.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <opencv2/imgproc.hpp>
#include <cmath>

#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/paths.hpp"
#include "core/render/head_roles.hpp"

namespace vitlens {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string format_weight(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(v));
  return buf;
}

// A two-pixel box around the query patch, white inside black, visible on any colour map.
void draw_query_marker(cv::Mat& rgb8, const ForwardResult& f, int query_token, int patch_size) {
  const int patch = query_token - f.prefix;
  if (patch < 0) return;
  const int x = (patch % f.grid_w) * patch_size, y = (patch / f.grid_w) * patch_size;
  cv::rectangle(rgb8, cv::Rect(x - 3, y - 3, patch_size + 6, patch_size + 6), cv::Scalar(0, 0, 0), 1);
  cv::rectangle(rgb8, cv::Rect(x - 2, y - 2, patch_size + 4, patch_size + 4), cv::Scalar(255, 255, 255), 1);
}

}  // namespace

const char* normalize_name(Normalize normalize) { return enum_name(kNormalizeNames, normalize); }
bool parse_normalize_name(const std::string& name, Normalize& normalize) { return parse_enum(kNormalizeNames, name, normalize); }

MatRM log_scaled_map(const MatRM& map, float max_value) {
  MatRM out = MatRM::Zero(map.rows(), map.cols());
  if (!(max_value > 0.0f)) return out;
  for (Eigen::Index i = 0; i < map.size(); ++i) {
    const float v = map.data()[i];
    if (v > 0.0f) out.data()[i] = std::clamp(1.0f + std::log10(v / max_value) / kLogDecades, 0.0f, 1.0f);
  }
  return out;
}

ForwardOptions forward_options_for(const VitModel& model, const ExportSettings& settings) {
  ForwardOptions options;
  options.causal = settings.causal;
  options.mask_padding = true;
  options.precision = settings.precision;
  // The viewer's temperature: scores times 1 / (sqrt(d) T), the same expression, so both agree bit for bit.
  if (settings.temperature != 1.0f)
    options.score_scale = 1.0f / (std::sqrt(static_cast<float>(model.config.head_dim())) * settings.temperature);
  return options;
}

void check_settings(const VitModel& model, const ExportSettings& settings) {
  const int layers = model.config.depth;
  if (settings.layer >= layers)
    throw Error("--layer " + std::to_string(settings.layer) + " is out of range: model '" + model.config.name +
                "' has " + std::to_string(layers) + " layer(s), 0 to " + std::to_string(layers - 1));
  if (settings.select == QuerySelect::ClassToken && !model.config.class_token)
    throw Error("--cls: model '" + model.config.name + "' has no class token; use --query, --patch or --received");
  if (settings.select == QuerySelect::Token) prefix_token_index(model.config, settings.token);  // throws naming --token
  if (settings.select == QuerySelect::Pool && !model.config.attention_pool)
    throw Error("--pool: model '" + model.config.name + "' has no attention pool (SigLIP's head, timm global_pool 'map'); "
                "use --query, --patch, --cls or --received");
  if (settings.select == QuerySelect::Pool && settings.layer >= 0 && settings.layer != layers - 1)
    throw Error("--pool: the attention pool reads the output of the last layer (" + std::to_string(layers - 1) +
                "); --layer " + std::to_string(settings.layer) + " does not apply to it");
  if (!(settings.style.alpha >= 0.0f && settings.style.alpha <= 1.0f)) throw Error("--alpha must be in [0, 1]");
  if (!is_colormap(settings.style.colormap)) throw Error("unknown colormap '" + settings.style.colormap + "'");
  if (!(settings.temperature >= kMinTemperature && settings.temperature <= kMaxTemperature))
    throw Error("--temperature must be from " + format_weight(kMinTemperature) + " to " + format_weight(kMaxTemperature) +
                ", got " + format_weight(settings.temperature));
  if (!(settings.threshold >= 0.0f && settings.threshold <= 1.0f))
    throw Error("--threshold must be a mass in (0, 1] (the share of each map to keep), got " + format_weight(settings.threshold));
}

MapRequest resolve_request(const VitModel& model, int grid_h, int grid_w, const ExportSettings& settings) {
  check_settings(model, settings);
  MapRequest request;
  request.layer = settings.layer < 0 ? model.config.depth - 1 : settings.layer;
  switch (settings.select) {
    case QuerySelect::Received: request.mode = MapMode::Received; break;
    case QuerySelect::ClassToken: request.mode = MapMode::ClassToken; break;
    case QuerySelect::SourcePixel:
      throw Error("internal: a query in source pixels needs the image (analyse_image resolves it)");
    case QuerySelect::Pixel:
      request.mode = MapMode::Query;
      request.query_token = token_at_pixel(model.config, grid_h, grid_w, settings.query_x, settings.query_y);
      break;
    case QuerySelect::Patch:
      request.mode = MapMode::Query;
      request.query_token = token_at_patch(model.config, grid_h, grid_w, settings.patch_row, settings.patch_col);
      break;
    case QuerySelect::Token:
      request.mode = MapMode::Query;
      request.query_token = prefix_token_index(model.config, settings.token);
      break;
    case QuerySelect::Pool: request.mode = MapMode::Pool; break;  // after the last layer, request.layer's
  }
  return request;
}

ImageAnalysis analyse_image(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                            const std::string& weights_for) {
  ImageAnalysis a;
  a.image_path = image_path;
  a.transform = settings.transform;
  if (settings.transform.present()) {
    // The model's transform crops and squashes: a pixel of the file or a mask over it has no
    // place in the processed image vitlens could name exactly, so those are refused.
    if (settings.select == QuerySelect::SourcePixel)
      throw Error(image_path + ": --query names a pixel of the file, which --preprocess model crops or resizes; "
                  "use --query-processed (a pixel of the processed image) or --patch");
    if (!settings.mask_image.empty())
      throw Error(image_path + ": --mask-image covers the whole image, which --preprocess model crops or resizes; "
                  "use --preprocess whole with a mask");
    a.image = prepare_image_transformed(load_image(image_path), model.config, settings.transform, image_path);
  } else {
    const int max_side = settings.max_side < 0 ? default_max_side(model.config) : settings.max_side;
    a.image = prepare_image(load_image(image_path), model.config, max_side, image_path);
  }
  const int tokens = model.config.prefix_tokens() + a.image.grid.grid_h * a.image.grid.grid_w;
  if (tokens > kMaxTokens)
    throw Error(image_path + ": " + std::to_string(tokens) + " tokens at working size " + std::to_string(a.image.content_w) +
                "x" + std::to_string(a.image.content_h) + " is more than vitlens takes (" + std::to_string(kMaxTokens) +
                "); use a smaller --size");
  if (settings.raw && tokens > kMaxRawTokens)
    throw Error(image_path + ": " + weights_for + " and is limited to " +
                std::to_string(kMaxRawTokens) + " tokens; this image has " + std::to_string(tokens) +
                " at its working size; use a smaller --size");
  const double raw_bytes = 4.0 * model.config.depth * model.config.num_heads * static_cast<double>(tokens) * tokens;
  if (settings.raw && raw_bytes > kMaxRawBytes)
    throw Error(image_path + ": " + weights_for.substr(0, weights_for.find(' ')) + " would need " + std::to_string(static_cast<long long>(raw_bytes / (1 << 20))) +
                " MiB for (" + std::to_string(model.config.depth) + ", " + std::to_string(model.config.num_heads) + ", " +
                std::to_string(tokens) + ", " + std::to_string(tokens) + ") floats, above the " +
                std::to_string(static_cast<long long>(kMaxRawBytes / (1 << 20))) + " MiB limit; use a smaller --size");
  // The query is checked against this image's grid before the forward pass, not after it.
  ExportSettings resolved = settings;
  if (settings.select == QuerySelect::SourcePixel) {
    resolved.select = QuerySelect::Pixel;
    source_to_processed_pixel(a.image, settings.query_x, settings.query_y, resolved.query_x, resolved.query_y);
    a.requested_pixel = {settings.query_x, settings.query_y};
  }
  a.request = resolve_request(model, a.image.grid.grid_h, a.image.grid.grid_w, resolved);
  ForwardOptions options = forward_options_for(model, settings);
  if (!settings.mask_image.empty()) {
    options.forbidden_patches = key_mask_from_image(load_image_rgb(settings.mask_image), a.image, model.config,
                                                    settings.mask_image);
    a.mask_image = settings.mask_image;
  }
  options.keep_probs = settings.raw;
  options.progress = settings.progress;
  auto t0 = std::chrono::steady_clock::now();
  a.forward = forward(model, a.image.grid, options);
  a.forward_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  a.maps = attention_maps(model, a.forward, a.request);
  if (settings.threshold > 0.0f) {
    a.kept = apply_threshold(a.maps, settings.threshold);
    a.threshold = settings.threshold;
  }
  a.maps_ms = ms_since(t0);
  a.predictions = predict(model, a.forward);
  return a;
}

float map_scale(const MatRM& map, Normalize normalize, const PatchSelection& patches) {
  return normalize == Normalize::Robust ? robust_scale_top(map, patches) : map.maxCoeff();
}

std::vector<float> map_scales(const HeadMaps& maps, Normalize normalize) {
  std::vector<float> scales;
  for (size_t h = 0; h < maps.heads.size(); ++h) scales.push_back(map_scale(maps.heads[h], normalize, shown_patches(maps, h)));
  scales.push_back(map_scale(maps.mean, normalize, shown_patches(maps, maps.heads.size())));
  if (normalize == Normalize::Shared) {
    // The largest over the heads (the mean never exceeds it).
    const float shared = maps.heads.empty() ? scales.back() : *std::max_element(scales.begin(), scales.end() - 1);
    scales.assign(scales.size(), shared);
  }
  return scales;
}

std::string head_label(const VitConfig& config, int layer, int head) {
  std::string label = "head " + std::to_string(head);
  if (layer >= 0 && layer < static_cast<int>(config.head_descriptions.size())) {
    const std::string& text = config.head_descriptions[static_cast<size_t>(layer)][static_cast<size_t>(head)];
    std::string shortname = text.substr(0, text.find(':'));
    // A long description is cut at a word (the montage wraps labels; the viewer shows the whole
    // text on hover).
    if (shortname.size() > 24) {
      const size_t space = shortname.rfind(' ', 21);
      shortname = shortname.substr(0, space == std::string::npos || space < 8 ? 21 : space) + "...";
    }
    if (!shortname.empty()) label += " " + shortname;
  }
  return label;
}

namespace {

// The model's own 1/sqrt(d) or the factor used, with the temperature it amounts to.
std::string softmax_phrase(const VitModel& model, const ForwardResult& f) {
  const int d = model.config.head_dim();
  const float model_scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (f.score_scale == model_scale) return "softmax(q.k / sqrt(" + std::to_string(d) + "))";
  return "softmax(q.k x " + format_weight(f.score_scale) + "), temperature " + format_weight(model_scale / f.score_scale);
}

// "1 patch", "3 patches".
std::string patch_count(int count) { return std::to_string(count) + (count == 1 ? " patch" : " patches"); }

// The patches of a pass: padded ones, padded ones no query may attend to (all of them unless the
// mask leaves padding open), and others a painted mask forbids.
struct MaskedPatches {
  int padded = 0, padding_masked = 0, painted = 0;
};

MaskedPatches masked_patches(const ForwardResult& f) {
  const auto& allowed = f.mask.key_allowed;
  MaskedPatches m;
  for (size_t p = 0; p < f.patch_is_padding.size(); ++p) {
    const size_t token = static_cast<size_t>(f.prefix) + p;
    const bool masked = token < allowed.size() && !allowed[token];
    if (f.patch_is_padding[p]) {
      ++m.padded;
      m.padding_masked += masked;
    } else {
      m.painted += masked;
    }
  }
  return m;
}

}  // namespace

std::vector<std::string> forward_caption(const VitModel& model, const ForwardResult& f, const std::string& mask_image) {
  // Read from the mask the pass used, so the caption says what the maps are: padding left open
  // (the viewer's mask "none") and patches painted in the viewer are named too.
  const MaskedPatches m = masked_patches(f);
  std::string mask = m.padded > 0 && m.padding_masked == 0
                         ? "mask: none, padding attended (" + patch_count(m.padded) + ")"
                         : "mask: padding (" + patch_count(m.padded) + ")";
  if (f.mask.causal) mask += ", causal";
  if (!mask_image.empty() || m.painted > 0)
    mask += ", painted" + (mask_image.empty() ? std::string() : " " + mask_image) + " (" + patch_count(m.painted) + ")";
  std::vector<std::string> phrases{mask, softmax_phrase(model, f)};
  // Only a reduced-precision picture says so: a float32 caption (and its pixels) is as before.
  if (f.precision == Precision::Bf16) phrases.push_back("bf16 products (float32 sums)");
  return phrases;
}

std::string scale_phrase(Normalize normalize) {
  switch (normalize) {
    case Normalize::PerHead: return "scale: each tile 0 to its maximum";
    case Normalize::Shared: return "scale: one for every tile, 0 to the largest value";
    case Normalize::Log: return "scale: log, " + format_weight(kLogDecades) + " decades below each tile's maximum";
    case Normalize::Robust:
      return "scale: each tile 0 to its top, the " + format_weight(kRobustPercentile) +
             "th percentile of its patches, raised so that at most " + format_weight(kMaxSaturatedMass * 100.0f) +
             "% of its weight saturates";
  }
  return "?";
}

std::string tile_label(const std::string& name, const MatRM& map, float scale, Normalize normalize) {
  std::string label = name + "\nmax " + format_weight(map.maxCoeff());  // the numbers on a line of their own
  if (normalize == Normalize::Robust) label += " top " + format_weight(scale);
  return label;
}

std::vector<std::string> montage_caption(const VitModel& model, const ImageAnalysis& a, Normalize normalize, int last_layer) {
  std::vector<std::string> caption;
  const std::string layers = last_layer >= 0 ? "layers " + std::to_string(a.request.layer) + " to " + std::to_string(last_layer)
                             : a.request.mode == MapMode::Pool ? "attention pool after layer " + std::to_string(a.request.layer)
                                                               : "layer " + std::to_string(a.request.layer);
  caption.push_back("model " + model.config.name + ", " + layers + " of depth " + std::to_string(model.config.depth) + ", " +
                    std::to_string(a.forward.tokens) + " tokens");
  switch (a.request.mode) {
    case MapMode::Received:
      caption.push_back("attention received: each patch's mean weight over " + std::to_string(a.forward.received_queries) +
                        " queries");
      break;
    case MapMode::ClassToken: caption.push_back("the class token's attention row"); break;
    case MapMode::Pool: caption.push_back("the attention pool's latent query over the patch tokens"); break;
    case MapMode::Query: {
      const int patch = a.request.query_token - a.forward.prefix;
      if (patch < 0) {  // a prefix token as the query (--token): no patch to box
        caption.push_back("query: " + token_name(model.config, a.forward.grid_w, a.request.query_token) + ", its attention row");
        break;
      }
      std::string q = "query patch (" + std::to_string(patch / a.forward.grid_w) + ", " +
                      std::to_string(patch % a.forward.grid_w) + ") (boxed)";
      if (a.requested_pixel[0] >= 0)
        q += " under image pixel (" + std::to_string(a.requested_pixel[0]) + ", " + std::to_string(a.requested_pixel[1]) + ")";
      caption.push_back(q);
      break;
    }
  }
  caption.push_back(last_layer >= 0 && normalize == Normalize::Shared ? "scale: one for every tile of a layer, 0 to its largest value"
                                                                       : scale_phrase(normalize));
  for (std::string& phrase : forward_caption(model, a.forward, a.mask_image)) caption.push_back(std::move(phrase));
  if (a.transform.present())  // the whole-image mode, the default, says nothing (its captions are unchanged)
    caption.push_back("preprocess: the model's own, " + a.transform.library + ": " + a.transform.describe());
  if (a.threshold > 0.0f) {
    int flat = 0;
    for (const ThresholdResult& t : a.kept) flat += t.no_structure;
    std::string t = "threshold: top " + format_weight(a.threshold * 100.0f) + "% of each map's mass kept";
    if (flat > 0) t += "; " + std::to_string(flat) + " map(s) with no structure shown whole";
    caption.push_back(t);
  }
  return caption;
}

ColourBarSpec montage_colour_bar(const HeatmapStyle& style, Normalize normalize, float shared_scale) {
  ColourBarSpec bar;
  bar.colormap = style.colormap;
  switch (normalize) {
    case Normalize::Shared:
      if (shared_scale > 0.0f) {
        bar.title = "colour: attention weight (every tile)";
        bar.ticks = {{0.0f, "0"}, {0.5f, format_weight(shared_scale * 0.5f)}, {1.0f, format_weight(shared_scale)}};
      } else {
        bar.title = "colour: weight relative to the largest of the tile's row";
        bar.ticks = {{0.0f, "0"}, {0.5f, "max/2"}, {1.0f, "max"}};
      }
      break;
    case Normalize::Log:
      bar.title = "colour: weight relative to the tile's max (log)";
      for (int k = 0; k <= static_cast<int>(kLogDecades); ++k) {
        const int below = static_cast<int>(kLogDecades) - k;
        bar.ticks.emplace_back(static_cast<float>(k) / kLogDecades,
                               below == 0 ? std::string("max") : "max/" + std::to_string(static_cast<int>(std::pow(10, below))));
      }
      break;
    case Normalize::PerHead:
      bar.title = "colour: weight relative to the tile's max";
      bar.ticks = {{0.0f, "0"}, {0.5f, "max/2"}, {1.0f, "max"}};
      break;
    case Normalize::Robust:
      bar.title = "colour: weight relative to the tile's top";
      bar.ticks = {{0.0f, "0"}, {0.5f, "top/2"}, {1.0f, "top+"}};
      break;
  }
  return bar;
}

namespace {

// What every picture of one analysis carries beside its tiles: the labels (image, heads, mean), the
// colour bar and the caption. The montage has them all; each head's own PNG its label and the rest.
struct Legend {
  std::vector<std::string> labels;  // (1 + H + 1) image, heads, mean
  ColourBarSpec bar;
  std::vector<std::string> caption;
};

Legend export_legend(const VitModel& model, const ImageAnalysis& analysis, const std::vector<float>& scales,
                     const HeatmapStyle& style, Normalize normalize) {
  const HeadMaps& maps = analysis.maps;
  Legend legend;
  legend.labels.push_back("image " + std::to_string(analysis.image.padded_w) + "x" + std::to_string(analysis.image.padded_h));
  const bool pool = analysis.request.mode == MapMode::Pool;  // the pool's heads: the blocks' descriptions are not theirs
  for (size_t h = 0; h < maps.heads.size(); ++h)
    legend.labels.push_back(tile_label(pool ? "pool head " + std::to_string(h)
                                            : head_label(model.config, analysis.request.layer, static_cast<int>(h)),
                                       maps.heads[h], scales[h], normalize));
  legend.labels.push_back(tile_label("mean of heads", maps.mean, scales.back(), normalize));
  legend.bar = montage_colour_bar(style, normalize, scales.empty() ? 0.0f : scales.front());
  legend.caption = montage_caption(model, analysis, normalize);
  return legend;
}

}  // namespace

ExportImages render_export_images(const VitModel& model, const ImageAnalysis& analysis, const HeatmapStyle& style,
                                  Normalize normalize) {
  const int p = model.config.patch_size;
  const HeadMaps& maps = analysis.maps;
  const std::vector<float> scales = map_scales(maps, normalize);
  ExportImages images;
  std::vector<cv::Mat> tiles;
  cv::Mat base;
  analysis.image.rgb.convertTo(base, CV_8UC3, 255.0);
  tiles.push_back(base);
  // The map is mapped to its colour positions in [0, 1] first, then drawn with a maximum of 1.
  auto overlay = [&](const MatRM& map, float scale) {
    cv::Mat out = heatmap_overlay(analysis.image.rgb, display_values(map, scale, normalize), p, 1.0f, style);
    if (analysis.request.mode == MapMode::Query) draw_query_marker(out, analysis.forward, analysis.request.query_token, p);
    return out;
  };
  for (size_t h = 0; h < maps.heads.size(); ++h) {
    images.heads.push_back(overlay(maps.heads[h], scales[h]));
    tiles.push_back(images.heads.back());
  }
  images.mean = overlay(maps.mean, scales.back());
  tiles.push_back(images.mean);
  const int columns = static_cast<int>(tiles.size()) <= 6 ? 3 : 4;
  const Legend legend = export_legend(model, analysis, scales, style, normalize);
  images.montage = montage(tiles, legend.labels, columns, &legend.bar, legend.caption);
  return images;
}

namespace {

// The sidecar's "query": the query token (a prefix token, or a patch and how it was asked for),
// null outside query mode.
nlohmann::json sidecar_query(const VitConfig& cfg, const ImageAnalysis& a, const ExportSettings& settings) {
  using nlohmann::json;
  if (a.request.mode == MapMode::Query && a.request.query_token < a.forward.prefix) {
    // A prefix token as the query (--token): its index, name and the flag's short name.
    return {{"token", a.request.query_token}, {"name", token_name(cfg, a.forward.grid_w, a.request.query_token)},
            {"prefix", prefix_token_short_name(cfg, a.request.query_token)}};
  }
  if (a.request.mode == MapMode::Query) {
    const int patch = a.request.query_token - a.forward.prefix;
    const int row = patch / a.forward.grid_w, col = patch % a.forward.grid_w;
    json q = {{"token", a.request.query_token}, {"patch", {row, col}},
              {"pixel_center", {col * cfg.patch_size + cfg.patch_size / 2, row * cfg.patch_size + cfg.patch_size / 2}},
              {"is_padding", a.image.grid.patch_is_padding[static_cast<size_t>(patch)] != 0}};
    // How it was asked for: a pixel of the source image (--query), of the processed image
    // (--query-processed) or a patch (--patch).
    if (a.requested_pixel[0] >= 0)
      q["source_pixel"] = {a.requested_pixel[0], a.requested_pixel[1]};
    else if (settings.select == QuerySelect::Pixel)
      q["processed_pixel"] = {settings.query_x, settings.query_y};
    return q;
  }
  if (a.request.mode == MapMode::Pool)  // the pool's learned query: no token of the input
    return {{"name", "attention pool"}, {"keys", "patch tokens"}, {"after_layer", a.request.layer}};
  return nullptr;
}

// The sidecar's "heads": each head's map statistics, prefix-token weights, description and
// head-role lifts (`roles`, of the exported layer).
nlohmann::json sidecar_heads(const VitConfig& cfg, const ImageAnalysis& a, const HeadRoleScores& roles) {
  using nlohmann::json;
  json heads = json::array();
  for (size_t h = 0; h < a.maps.heads.size(); ++h) {
    const MatRM& m = a.maps.heads[h];
    json head = {{"head", h}, {"min", map_min(m, a.maps.in_image)}, {"max", m.maxCoeff()}, {"sum", m.sum()},
                 {"entropy", map_entropy(m)}};
    head["class_token_weight"] = a.forward.has_class_token ? json(a.maps.cls_weight[h]) : json(nullptr);
    if (a.forward.prefix > 1) {  // distillation and register tokens: their weights, in token order
      json prefix = json::array();
      for (int t = 0; t < a.forward.prefix; ++t) prefix.push_back(a.maps.prefix_weight(static_cast<Eigen::Index>(h), t));
      head["prefix_weights"] = prefix;
    }
    const auto layer = static_cast<size_t>(a.request.layer);
    if (layer < cfg.head_descriptions.size() && a.request.mode != MapMode::Pool) head["description"] = cfg.head_descriptions[layer][h];
    if (a.request.mode == MapMode::Pool) {  // the roles are the blocks' heads', not the pool's
      head["head_roles"] = nullptr;
    } else {
      json lifts;
      for (int role = 0; role < kHeadRoles; ++role)
        lifts[head_role_name(role)] = std::round(roles.lift[layer][h][static_cast<size_t>(role)] * 1e6) / 1e6;
      head["head_roles"] = lifts;
    }
    heads.push_back(head);
  }
  return heads;
}

}  // namespace

void add_predictions(nlohmann::json& record, const VitModel& model, const ForwardResult& forward, const Predictions& p) {
  using nlohmann::json;
  json top = json::array();
  if (!p.has_classifier) {
    record["classifier"] = classifier_summary(model);
    record["predictions"] = top;
    return;
  }
  json c = {{"classes", model.w.num_classes},
            {"names", model.class_names.empty() ? json(nullptr) : json(model.class_names_source)},
            {"head", classifier_summary(model)}};
  if (p.pooled_patches > 0)
    c["pool"] = "over the " + std::to_string(p.pooled_patches) + " patches of the image" +
                (p.padding_patches ? ", the " + std::to_string(p.padding_patches) +
                                         " padding patches left out (the library never sees padding)"
                                   : std::string());
  // The head reads this forward's tokens: a causal mask, a temperature, a painted mask or bf16
  // products change them, and then the predictions are not the model's own.
  std::vector<std::string> changed;
  if (forward.mask.causal) changed.push_back("a causal mask");
  const float model_scale = 1.0f / std::sqrt(static_cast<float>(model.config.head_dim()));
  if (std::abs(forward.score_scale - model_scale) > 1e-6f * model_scale) changed.push_back("a softmax temperature");
  if (masked_patches(forward).painted > 0) changed.push_back("a painted mask");
  if (forward.precision == Precision::Bf16) changed.push_back("bf16 products");
  std::string forward_text = "the model's own";
  for (size_t i = 0; i < changed.size(); ++i)
    forward_text = (i == 0 ? "changed by " : forward_text + (i + 1 == changed.size() ? " and " : ", ")) + changed[i];
  c["forward"] = forward_text;
  record["classifier"] = c;
  for (size_t i = 0; i < p.top.size(); ++i)
    top.push_back({{"rank", i + 1}, {"index", p.top[i].index}, {"label", p.labels[i]},
                   {"probability", p.top[i].probability}, {"logit", p.top[i].logit}});
  record["predictions"] = top;
}

void add_pass_record(nlohmann::json& record, const ImageTransform& transform, Precision precision) {
  record["preprocess"] = transform.present() ? "model" : "whole";
  if (transform.present())
    record["transform"] = {{"library", transform.library}, {"from", transform.origin}, {"steps", transform.describe()}};
  record["precision"] = precision_name(precision);
}

nlohmann::json export_sidecar(const VitModel& model, const ImageAnalysis& a, const ExportSettings& settings) {
  using nlohmann::json;
  const VitConfig& cfg = model.config;
  json j;
  j["image"] = a.image_path;
  j["model"] = {{"name", cfg.name}, {"file", model.source}, {"patch_size", cfg.patch_size},
                {"embed_dim", cfg.embed_dim}, {"num_heads", cfg.num_heads}, {"depth", cfg.depth}};
  j["source_size"] = {a.image.source_w, a.image.source_h};
  j["content_size"] = {a.image.content_w, a.image.content_h};
  j["processed_size"] = {a.image.padded_w, a.image.padded_h};
  j["resized"] = a.image.resized;
  add_pass_record(j, a.transform, a.forward.precision);
  j["grid"] = {a.forward.grid_h, a.forward.grid_w};
  j["tokens"] = a.forward.tokens;
  j["class_token"] = a.forward.has_class_token;
  j["prefix_tokens"] = a.forward.prefix;
  j["mode"] = map_mode_name(a.request.mode);
  j["query"] = sidecar_query(cfg, a, settings);
  j["layer"] = a.request.layer;
  const MaskedPatches masked = masked_patches(a.forward);
  j["mask"] = {{"causal", settings.causal}, {"padding_patches", masked.padded},
               {"image", a.mask_image.empty() ? json(nullptr) : json(a.mask_image)},
               {"painted_patches", masked.painted}};
  j["score_scale"] = a.forward.score_scale;
  // The temperature the scale amounts to: 1 for the model's 1/sqrt(d).
  const float model_scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()));
  j["temperature"] = std::round(static_cast<double>(model_scale / a.forward.score_scale) * 1e6) / 1e6;
  j["colormap"] = settings.style.colormap;
  j["alpha"] = std::round(static_cast<double>(settings.style.alpha) * 1e6) / 1e6;  // 0.6, not 0.6000000238
  j["upsample"] = upsample_name(settings.style.upsample);
  j["normalize"] = normalize_name(settings.normalize);
  if (settings.normalize == Normalize::Robust) {
    j["robust_percentile"] = kRobustPercentile;
    j["robust_max_saturated_mass"] = std::round(static_cast<double>(kMaxSaturatedMass) * 1e6) / 1e6;
  }
  // The value drawn at the top of the colour map, heads then mean (Log: the top of its decades).
  j["colour_scale_top"] = map_scales(a.maps, settings.normalize);
  if (a.threshold > 0.0f) {
    json kept = json::array();
    for (const ThresholdResult& t : a.kept)
      kept.push_back({{"kept_patches", t.kept_patches}, {"total_patches", t.total_patches},
                      {"kept_mass", t.kept_mass}, {"no_structure", t.no_structure}});
    j["threshold"] = {{"mass", std::round(static_cast<double>(a.threshold) * 1e6) / 1e6}, {"heads_then_mean", kept}};
  } else {
    j["threshold"] = nullptr;
  }
  // Head-role lifts of the exported layer (head_roles.hpp, README "Head roles").
  HeadRoleOptions role_options;
  role_options.layer = a.request.layer;
  const HeadRoleScores roles = head_role_scores(model, a.image.grid, a.forward, role_options);
  j["head_roles"] = {{"top_fraction", roles.top_fraction}, {"queries", roles.queries}};
  j["heads"] = sidecar_heads(cfg, a, roles);
  j["mean"] = {{"min", map_min(a.maps.mean, a.maps.in_image)}, {"max", a.maps.mean.maxCoeff()}, {"entropy", map_entropy(a.maps.mean)}};
  add_predictions(j, model, a.forward, a.predictions);
  j["timings_ms"] = {{"forward", a.forward_ms}, {"maps", a.maps_ms}};
  return j;
}

MapsOutputNames maps_output_names(const std::string& stem, int heads, bool raw, bool view_notes, bool pool) {
  MapsOutputNames names;
  for (int h = 0; h < heads; ++h) names.heads.push_back(stem + "_head" + std::to_string(h) + ".png");
  names.mean = stem + "_mean.png";
  names.montage = stem + "_montage.png";
  if (raw) names.raw = stem + "_attn.npy";
  if (raw && pool) names.pool_raw = stem + "_pool_attn.npy";
  if (view_notes) names.view_notes = stem + "_view.json";
  names.record = stem + ".json";
  return names;
}

void add_attention_npy(OutputSet& set, const std::string& name, const ForwardResult& f, int heads,
                       const std::string& image_path) {
  const size_t n = static_cast<size_t>(f.tokens), h = static_cast<size_t>(heads);
  for (const LayerState& layer : f.layers)
    if (layer.probs.size() != h)
      throw Error(image_path + ": raw export needs the full weights; analyse with settings.raw set");
  // The header, then each (layer, head) block straight from the forward's buffers (no copy).
  const std::string header = npy_bytes_f32({f.layers.size(), h, n, n}, nullptr);
  set.add_stream(name, [&](FileSink& sink) {
    sink.write(header.data(), header.size());
    for (const LayerState& layer : f.layers)
      for (const MatRM& probs : layer.probs) sink.write(probs.data(), static_cast<size_t>(probs.size()) * sizeof(float));
  });
}

nlohmann::json add_export_files(OutputSet& set, const VitModel& model, const ImageAnalysis& analysis,
                                const ExportSettings& settings, const MapsOutputNames& names) {
  const auto t0 = std::chrono::steady_clock::now();
  const ExportImages images = render_export_images(model, analysis, settings.style, settings.normalize);
  const double render_ms = ms_since(t0);
  if (images.heads.size() != names.heads.size())
    throw Error(analysis.image_path + ": internal: the maps have " + std::to_string(images.heads.size()) +
                " heads, the names " + std::to_string(names.heads.size()));
  // Each head's picture and the mean's: its tile with the montage's label, colour bar and caption.
  const Legend legend =
      export_legend(model, analysis, map_scales(analysis.maps, settings.normalize), settings.style, settings.normalize);
  auto figure = [&](const cv::Mat& tile, size_t label) { return montage({tile}, {legend.labels[label]}, 1, &legend.bar, legend.caption); };
  for (size_t h = 0; h < images.heads.size(); ++h) set.add_png(names.heads[h], figure(images.heads[h], h + 1));
  set.add_png(names.mean, figure(images.mean, images.heads.size() + 1));
  set.add_png(names.montage, images.montage);
  if (!names.raw.empty()) add_attention_npy(set, names.raw, analysis.forward, model.config.num_heads, analysis.image_path);
  if (!names.pool_raw.empty()) {
    const MatRM& p = analysis.forward.pool_probs;  // (H, N), the prefix columns 0
    if (p.rows() != model.config.num_heads || p.cols() != analysis.forward.tokens)
      throw Error(analysis.image_path + ": internal: the attention pool's weights are " + std::to_string(p.rows()) + "x" +
                  std::to_string(p.cols()) + ", not heads x tokens");
    set.add(names.pool_raw, npy_bytes_f32({static_cast<size_t>(p.rows()), static_cast<size_t>(p.cols())}, p.data()));
  }
  if (!names.view_notes.empty()) set.add(names.view_notes, settings.view_notes.dump(2) + "\n");
  nlohmann::json sidecar = export_sidecar(model, analysis, settings);
  sidecar["timings_ms"]["render"] = render_ms;
  return sidecar;
}

std::vector<std::string> write_export(const VitModel& model, const ImageAnalysis& analysis, const ExportSettings& settings) {
  require_writable_dir(settings.out_dir);
  const std::string stem = settings.stem.empty() ? output_stem(analysis.image_path) : settings.stem;
  const MapsOutputNames names =
      maps_output_names(stem, model.config.num_heads, settings.raw, !settings.view_notes.is_null(), model.config.attention_pool);
  // The files appear together or not at all (files.hpp: OutputSet), the JSON record last.
  OutputSet set(settings.out_dir, settings.force);
  nlohmann::json sidecar = add_export_files(set, model, analysis, settings, names);
  return set.commit(names.record, std::move(sidecar));
}

std::string output_stem(const std::string& image_path) {
  std::string name = base_name(image_path);
  const auto dot = name.find_last_of('.');
  if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
  return name.empty() ? "image" : name;
}

std::vector<std::string> export_attention(const VitModel& model, const std::string& image_path,
                                          const ExportSettings& settings) {
  require_writable_dir(settings.out_dir);
  return write_export(model, analyse_image(model, image_path, settings), settings);
}

}  // namespace vitlens
