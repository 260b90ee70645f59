// Export of one image's attention maps: the single path behind `vitlens export` and the viewer's
// export action.
#include "vitlens/export.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <opencv2/imgproc.hpp>
#include <cmath>

#include "vitlens/error.hpp"
#include "vitlens/files.hpp"

namespace vitlens {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const char* upsample_name(Upsample u) { return u == Upsample::Nearest ? "nearest" : "bilinear"; }

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

const char* normalize_name(Normalize normalize) {
  switch (normalize) {
    case Normalize::PerHead: return "head";
    case Normalize::Shared: return "shared";
    case Normalize::Log: return "log";
  }
  return "?";
}

MatRM log_scaled_map(const MatRM& map, float max_value) {
  MatRM out = MatRM::Zero(map.rows(), map.cols());
  if (!(max_value > 0.0f)) return out;
  for (Eigen::Index i = 0; i < map.size(); ++i) {
    const float v = map.data()[i];
    if (v > 0.0f) out.data()[i] = std::clamp(1.0f + std::log10(v / max_value) / kLogDecades, 0.0f, 1.0f);
  }
  return out;
}

ForwardOptions forward_options_for(const ExportSettings& settings) {
  ForwardOptions options;
  options.causal = settings.causal;
  options.mask_padding = true;
  return options;
}

void check_settings(const VitModel& model, const ExportSettings& settings) {
  const int layers = model.config.depth;
  if (settings.layer >= layers)
    throw Error("--layer " + std::to_string(settings.layer) + " is out of range: model '" + model.config.name +
                "' has " + std::to_string(layers) + " layer(s), 0 to " + std::to_string(layers - 1));
  if (settings.select == QuerySelect::ClassToken && !model.config.class_token)
    throw Error("--cls: model '" + model.config.name + "' has no class token; use --query, --patch or --received");
  if (!(settings.style.alpha >= 0.0f && settings.style.alpha <= 1.0f)) throw Error("--alpha must be in [0, 1]");
  if (!is_colormap(settings.style.colormap)) throw Error("unknown colormap '" + settings.style.colormap + "'");
}

MapRequest resolve_request(const VitModel& model, int grid_h, int grid_w, const ExportSettings& settings) {
  check_settings(model, settings);
  MapRequest request;
  request.layer = settings.layer < 0 ? model.config.depth - 1 : settings.layer;
  switch (settings.select) {
    case QuerySelect::Received: request.mode = MapMode::Received; break;
    case QuerySelect::ClassToken: request.mode = MapMode::ClassToken; break;
    case QuerySelect::Pixel:
      request.mode = MapMode::Query;
      request.query_token = token_at_pixel(model.config, grid_h, grid_w, settings.query_x, settings.query_y);
      break;
    case QuerySelect::Patch:
      request.mode = MapMode::Query;
      request.query_token = token_at_patch(model.config, grid_h, grid_w, settings.patch_row, settings.patch_col);
      break;
  }
  return request;
}

ImageAnalysis analyse_image(const VitModel& model, const std::string& image_path, const ExportSettings& settings) {
  ImageAnalysis a;
  a.image_path = image_path;
  const int max_side = settings.max_side < 0 ? default_max_side(model.config) : settings.max_side;
  a.image = prepare_image(load_image_rgb(image_path), model.config, max_side, image_path);
  const int tokens = model.config.prefix_tokens() + a.image.grid.grid_h * a.image.grid.grid_w;
  if (tokens > kMaxTokens)
    throw Error(image_path + ": " + std::to_string(tokens) + " tokens at working size " + std::to_string(a.image.content_w) +
                "x" + std::to_string(a.image.content_h) + " is more than vitlens takes (" + std::to_string(kMaxTokens) +
                "); use a smaller --size");
  if (settings.raw && tokens > kMaxRawTokens)
    throw Error(image_path + ": --raw stores (layers, heads, N, N) floats and is limited to " +
                std::to_string(kMaxRawTokens) + " tokens; this image has " + std::to_string(tokens) +
                " at its working size; use a smaller --size");
  const double raw_bytes = 4.0 * model.config.depth * model.config.num_heads * static_cast<double>(tokens) * tokens;
  if (settings.raw && raw_bytes > kMaxRawBytes)
    throw Error(image_path + ": --raw would need " + std::to_string(static_cast<long long>(raw_bytes / (1 << 20))) +
                " MiB for (" + std::to_string(model.config.depth) + ", " + std::to_string(model.config.num_heads) + ", " +
                std::to_string(tokens) + ", " + std::to_string(tokens) + ") floats, above the " +
                std::to_string(static_cast<long long>(kMaxRawBytes / (1 << 20))) + " MiB limit; use a smaller --size");
  // The query is checked against this image's grid before the forward pass, not after it.
  a.request = resolve_request(model, a.image.grid.grid_h, a.image.grid.grid_w, settings);
  ForwardOptions options = forward_options_for(settings);
  options.keep_probs = settings.raw;
  options.progress = settings.progress;
  auto t0 = std::chrono::steady_clock::now();
  a.forward = forward(model, a.image.grid, options);
  a.forward_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  a.maps = attention_maps(model, a.forward, a.request);
  a.maps_ms = ms_since(t0);
  return a;
}

std::vector<float> map_scales(const HeadMaps& maps, Normalize normalize) {
  std::vector<float> scales;
  float shared = 0.0f;
  for (const MatRM& m : maps.heads) {
    scales.push_back(m.maxCoeff());
    shared = std::max(shared, scales.back());
  }
  scales.push_back(maps.mean.maxCoeff());
  if (normalize == Normalize::Shared) scales.assign(scales.size(), shared);
  return scales;
}

std::string head_label(const VitConfig& config, int layer, int head) {
  std::string label = "head " + std::to_string(head);
  if (layer >= 0 && layer < static_cast<int>(config.head_descriptions.size())) {
    const std::string& text = config.head_descriptions[static_cast<size_t>(layer)][static_cast<size_t>(head)];
    std::string shortname = text.substr(0, text.find(':'));
    if (shortname.size() > 14) shortname = shortname.substr(0, 14);
    if (!shortname.empty()) label += " " + shortname;
  }
  return label;
}

ExportImages render_export_images(const VitModel& model, const ImageAnalysis& analysis, const HeatmapStyle& style,
                                  Normalize normalize) {
  const int p = model.config.patch_size;
  const HeadMaps& maps = analysis.maps;
  const std::vector<float> scales = map_scales(maps, normalize);
  ExportImages images;
  std::vector<cv::Mat> tiles;
  std::vector<std::string> labels;
  cv::Mat base;
  analysis.image.rgb.convertTo(base, CV_8UC3, 255.0);
  tiles.push_back(base);
  labels.push_back("image");
  // Log: the map is mapped to [0, 1] on the log scale first, then drawn with a maximum of 1.
  auto overlay = [&](const MatRM& map, float scale) {
    cv::Mat out = normalize == Normalize::Log
                      ? heatmap_overlay(analysis.image.rgb, log_scaled_map(map, scale), p, 1.0f, style)
                      : heatmap_overlay(analysis.image.rgb, map, p, scale, style);
    if (analysis.request.mode == MapMode::Query) draw_query_marker(out, analysis.forward, analysis.request.query_token, p);
    return out;
  };
  // The label carries each map's maximum: a uniform map (a head with nothing to look for at
  // this query) fills its tile with full colour, and only its tiny maximum (1 / tokens) says so.
  auto with_max = [](std::string label, const MatRM& map) { return label + "  max " + format_weight(map.maxCoeff()); };
  for (size_t h = 0; h < maps.heads.size(); ++h) {
    images.heads.push_back(overlay(maps.heads[h], scales[h]));
    tiles.push_back(images.heads.back());
    labels.push_back(with_max(head_label(model.config, analysis.request.layer, static_cast<int>(h)), maps.heads[h]));
  }
  images.mean = overlay(maps.mean, scales.back());
  tiles.push_back(images.mean);
  labels.push_back(with_max("mean of heads", maps.mean));
  const int columns = static_cast<int>(tiles.size()) <= 6 ? 3 : 4;
  images.montage = montage(tiles, labels, columns);
  return images;
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
  j["grid"] = {a.forward.grid_h, a.forward.grid_w};
  j["tokens"] = a.forward.tokens;
  j["class_token"] = a.forward.has_class_token;
  j["prefix_tokens"] = a.forward.prefix;
  j["mode"] = map_mode_name(a.request.mode);
  if (a.request.mode == MapMode::Query) {
    const int patch = a.request.query_token - a.forward.prefix;
    const int row = patch / a.forward.grid_w, col = patch % a.forward.grid_w;
    j["query"] = {{"token", a.request.query_token}, {"patch", {row, col}},
                  {"pixel_center", {col * cfg.patch_size + cfg.patch_size / 2, row * cfg.patch_size + cfg.patch_size / 2}},
                  {"is_padding", a.image.grid.patch_is_padding[static_cast<size_t>(patch)] != 0}};
  } else {
    j["query"] = nullptr;
  }
  j["layer"] = a.request.layer;
  int padding = 0;
  for (uint8_t v : a.image.grid.patch_is_padding) padding += v;
  j["mask"] = {{"causal", settings.causal}, {"padding_patches", padding}};
  j["score_scale"] = a.forward.score_scale;
  j["colormap"] = settings.style.colormap;
  j["alpha"] = std::round(static_cast<double>(settings.style.alpha) * 1e6) / 1e6;  // 0.6, not 0.6000000238
  j["upsample"] = upsample_name(settings.style.upsample);
  j["normalize"] = normalize_name(settings.normalize);
  json heads = json::array();
  for (size_t h = 0; h < a.maps.heads.size(); ++h) {
    const MatRM& m = a.maps.heads[h];
    json head = {{"head", h}, {"min", m.minCoeff()}, {"max", m.maxCoeff()}, {"sum", m.sum()},
                 {"entropy", map_entropy(m)}};
    head["class_token_weight"] = a.forward.has_class_token ? json(a.maps.cls_weight[h]) : json(nullptr);
    if (a.forward.prefix > 1) {  // distillation and register tokens: their weights, in token order
      json prefix = json::array();
      for (int t = 0; t < a.forward.prefix; ++t) prefix.push_back(a.maps.prefix_weight(static_cast<Eigen::Index>(h), t));
      head["prefix_weights"] = prefix;
    }
    const auto layer = static_cast<size_t>(a.request.layer);
    if (layer < cfg.head_descriptions.size()) head["description"] = cfg.head_descriptions[layer][h];
    heads.push_back(head);
  }
  j["heads"] = heads;
  j["mean"] = {{"min", a.maps.mean.minCoeff()}, {"max", a.maps.mean.maxCoeff()}, {"entropy", map_entropy(a.maps.mean)}};
  j["timings_ms"] = {{"forward", a.forward_ms}, {"maps", a.maps_ms}};
  return j;
}

std::vector<std::string> write_export(const VitModel& model, const ImageAnalysis& analysis, const ExportSettings& settings) {
  require_writable_dir(settings.out_dir);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string base =
      settings.out_dir + "/" + (settings.stem.empty() ? output_stem(analysis.image_path) : settings.stem);
  const ExportImages images = render_export_images(model, analysis, settings.style, settings.normalize);
  const double render_ms = ms_since(t0);
  std::vector<std::string> written;
  for (size_t h = 0; h < images.heads.size(); ++h) {
    written.push_back(base + "_head" + std::to_string(h) + ".png");
    write_png_atomic(written.back(), images.heads[h]);
  }
  written.push_back(base + "_mean.png");
  write_png_atomic(written.back(), images.mean);
  written.push_back(base + "_montage.png");
  write_png_atomic(written.back(), images.montage);
  if (settings.raw) {
    // (L, H, N, N) float32, class token first then patches row-major, as numpy.load reads it.
    const auto& f = analysis.forward;
    const size_t n = static_cast<size_t>(f.tokens), heads = static_cast<size_t>(model.config.num_heads);
    for (const LayerState& layer : f.layers)
      if (layer.probs.size() != heads)
        throw Error(analysis.image_path + ": raw export needs the full weights; analyse with settings.raw set");
    std::string npy = npy_bytes_f32({f.layers.size(), heads, n, n}, nullptr);  // header only
    npy.reserve(npy.size() + f.layers.size() * heads * n * n * sizeof(float));
    for (const LayerState& layer : f.layers)
      for (const MatRM& probs : layer.probs)
        npy.append(reinterpret_cast<const char*>(probs.data()), static_cast<size_t>(probs.size()) * sizeof(float));
    written.push_back(base + "_attn.npy");
    write_file_atomic(written.back(), npy);
  }
  nlohmann::json sidecar = export_sidecar(model, analysis, settings);
  sidecar["timings_ms"]["render"] = render_ms;
  sidecar["files"] = written;
  written.push_back(base + ".json");
  // replace: a file name that is not valid UTF-8 must not make the JSON writer throw.
  write_file_atomic(written.back(), sidecar.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  return written;
}

std::string output_stem(const std::string& image_path) {
  const auto slash = image_path.find_last_of('/');
  std::string name = slash == std::string::npos ? image_path : image_path.substr(slash + 1);
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
