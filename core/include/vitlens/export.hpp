#pragma once
// Export of one image's attention: per-head heatmap PNGs, a montage, a JSON sidecar and
// optionally the raw weights as .npy. The CLI and the viewer both call export_attention, so an
// exported PNG is the picture on screen.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vitlens/heatmap.hpp"
#include "vitlens/image.hpp"
#include "vitlens/maps.hpp"
#include "vitlens/vit.hpp"

namespace vitlens {

enum class QuerySelect { Received, Pixel, Patch, ClassToken };
// How a head's map is scaled to the colour map: each head to its own maximum, or all heads (and
// the mean) to the largest value over the heads, so heads can be compared; or each head to its own
// maximum on a log scale spanning kLogDecades decades, so the faint tail of a peaked map shows.
enum class Normalize { PerHead, Shared, Log };
const char* normalize_name(Normalize normalize);  // "head", "shared", "log"

// Normalize::Log: a value v of a map whose maximum is m is drawn at 1 + log10(v / m) / kLogDecades,
// clamped to [0, 1]: m at the top of the colour map, m / 10^kLogDecades and below at the bottom.
constexpr float kLogDecades = 3.0f;
MatRM log_scaled_map(const MatRM& map, float max_value);

struct ExportSettings {
  std::string out_dir = ".";
  QuerySelect select = QuerySelect::Received;  // works for every model
  int query_x = 0, query_y = 0;    // pixel of the processed image (QuerySelect::Pixel)
  int patch_row = 0, patch_col = 0;  // (QuerySelect::Patch)
  int layer = -1;                  // < 0: the last layer
  bool causal = false;
  HeatmapStyle style;
  Normalize normalize = Normalize::PerHead;
  bool raw = false;                // also write <stem>_attn.npy (L, H, N, N)
  int max_side = -1;               // < 0: the model's img_size long side; 0: native size
  std::string stem;                // output file stem; empty: the image file's stem
  std::function<bool(float)> progress;  // the forward pass's progress in [0, 1]; may be empty
};

// Largest token count for which --raw is allowed: (L, H, N, N) float32 grows as N^2.
constexpr int kMaxRawTokens = 4096;
constexpr double kMaxRawBytes = 2.0 * (1 << 30);  // and at most 2 GiB of (L, H, N, N) floats
// Largest token count any export takes (a 2048 x 2048 working size at P = 4): attention work
// grows as N^2 (65537 tokens: about 5 s on two cores, see bench/README.md; the cap: about 16 times
// that), and beyond it an export would run for many minutes.
constexpr int kMaxTokens = 262145;

struct ImageAnalysis {
  std::string image_path;
  PreparedImage image;
  ForwardResult forward;
  MapRequest request;
  HeadMaps maps;
  double forward_ms = 0.0, maps_ms = 0.0;
};

// Throws vitlens::Error when the settings cannot apply to this model, whatever the image: a layer
// past its depth, --cls without a class token, alpha outside [0, 1], an unknown colour map.
void check_settings(const VitModel& model, const ExportSettings& settings);

// Settings -> the map request for an image's patch grid (resolves Pixel, Patch and the layer).
MapRequest resolve_request(const VitModel& model, int grid_h, int grid_w, const ExportSettings& settings);

ForwardOptions forward_options_for(const ExportSettings& settings);

// Load, prepare, forward and map one image. Throws vitlens::Error.
ImageAnalysis analyse_image(const VitModel& model, const std::string& image_path, const ExportSettings& settings);

// The pictures of one analysis, in memory: per head overlays, the mean overlay and the montage.
struct ExportImages {
  std::vector<cv::Mat> heads;  // H x CV_8UC3 RGB at the processed (padded) image size
  cv::Mat mean;
  cv::Mat montage;
};
ExportImages render_export_images(const VitModel& model, const ImageAnalysis& analysis, const HeatmapStyle& style,
                                  Normalize normalize);
// The value each head's map (index H = the mean) is divided by before the colour map.
std::vector<float> map_scales(const HeadMaps& maps, Normalize normalize);
// Short label for head h of a layer: "head 0" plus the text before ':' in its description.
std::string head_label(const VitConfig& config, int layer, int head);

nlohmann::json export_sidecar(const VitModel& model, const ImageAnalysis& analysis, const ExportSettings& settings);

// Writes every output of one analysis; returns the paths written. Atomic per file.
std::vector<std::string> write_export(const VitModel& model, const ImageAnalysis& analysis,
                                      const ExportSettings& settings);

// The file stem outputs are named after: "dir/photo.jpg" -> "photo" ("image" when empty).
std::string output_stem(const std::string& image_path);

// analyse_image + write_export. The stem of the outputs is the image file's stem.
std::vector<std::string> export_attention(const VitModel& model, const std::string& image_path,
                                          const ExportSettings& settings);

}  // namespace vitlens
