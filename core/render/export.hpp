#pragma once
// Export of one image's attention: per-head heatmap PNGs, a montage, a JSON sidecar and
// optionally the raw weights as .npy. The CLI and the viewer both call export_attention, so an
// exported PNG is the picture on screen.
#include <array>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/enum_names.hpp"
#include "core/io/files.hpp"
#include "core/render/heatmap.hpp"
#include "core/io/image.hpp"
#include "core/io/preprocess.hpp"
#include "core/render/maps.hpp"
#include "core/model/classifier.hpp"
#include "core/model/vit.hpp"

namespace vitlens {

// Which map: attention received, the row of a query given as a pixel of the source image
// (SourcePixel, what `--query X,Y` takes) or of the processed image (Pixel, `--query-processed`),
// a patch of the grid, the class token's row, or a prefix token as the query (Token, `--token`:
// its row from q and K as any query's, class token included), or the attention pool's latent
// query (Pool, `--pool`: SigLIP's head, after the last block; models with an attention pool).
enum class QuerySelect { Received, SourcePixel, Pixel, Patch, ClassToken, Token, Pool };
// How a head's map is scaled to the colour map:
//   PerHead  each head from 0 to its own maximum;
//   Shared   all heads (and the mean) from 0 to the largest value over the heads, to compare them;
//   Log      each head on a log scale spanning kLogDecades decades below its maximum;
//   Robust   each head from 0 to its robust top (the default, robust_scale_top): the
//            kRobustPercentile-th percentile of the patches it shows, so one to three hot patches
//            saturate instead of squashing the rest of the map into the bottom colours; raised
//            where needed so that the saturated patches hold at most kMaxSaturatedMass of its
//            weight, so a head that looks at one patch is drawn as that one patch. The measure
//            behind this default is display_detail_share below (README, "Map scale").
enum class Normalize { PerHead, Shared, Log, Robust };
inline constexpr EnumName<Normalize> kNormalizeNames[] = {
    {Normalize::PerHead, "head"}, {Normalize::Shared, "shared"}, {Normalize::Log, "log"}, {Normalize::Robust, "robust"}};
const char* normalize_name(Normalize normalize);  // "head", "shared", "log", "robust"
bool parse_normalize_name(const std::string& name, Normalize& normalize);
constexpr Normalize kDefaultNormalize = Normalize::Robust;

// Normalize::Log: a value v of a map whose maximum is m is drawn at 1 + log10(v / m) / kLogDecades,
// clamped to [0, 1]: m at the top of the colour map, m / 10^kLogDecades and below at the bottom.
constexpr float kLogDecades = 3.0f;
MatRM log_scaled_map(const MatRM& map, float max_value);

// Normalize::Robust: the percentile (over the selected patches, linear interpolation between the
// sorted values as numpy.percentile's default; 0 when none is selected).
constexpr float kRobustPercentile = 99.0f;
float map_percentile(const MatRM& map, float percentile, const PatchSelection& patches = {});
// The most of a map's weight (over the patches it shows) that may sit above the top of the colour
// map: a peaked map's percentile can be a millionth of its maximum (most patches near 0), and
// drawing every patch above that saturated turns a head that looks at one patch into a blob.
constexpr float kMaxSaturatedMass = 0.1f;
// The smallest t >= 0 with sum over the selected patches of max(0, v - t) <= fraction * their sum.
float saturation_floor(const MatRM& map, float fraction, const PatchSelection& patches = {});
// Normalize::Robust's top: max(map_percentile(kRobustPercentile), saturation_floor(kMaxSaturatedMass))
// over the selected patches (the ones drawn: the image's, the kept ones after a threshold).
float robust_scale_top(const MatRM& map, const PatchSelection& patches = {});

// A map as drawn: values in [0, 1] (the position on the colour map), from its scale (map_scales).
MatRM display_values(const MatRM& map, float scale, Normalize normalize);

// How much of a drawn map shows detail: the share of its area (patches) drawn neither at the
// floor nor saturated, i.e. with a display value in [kDetailBand, 1 - kDetailBand]. The bottom and
// top 5 % of a colour map are the colours a reader cannot tell from its ends; a tile of one hot
// patch over a flat floor scores near 0, a map whose patches spread over the colour map near 1.
// Only the selected patches count (the image's: padding is not part of the picture's content).
constexpr float kDetailBand = 0.05f;
double display_detail_share(const MatRM& display01, const PatchSelection& patches = {});

struct ExportSettings {
  std::string out_dir = ".";
  QuerySelect select = QuerySelect::Received;  // works for every model
  int query_x = 0, query_y = 0;    // pixel of the source image (SourcePixel) or of the processed image (Pixel)
  int patch_row = 0, patch_col = 0;  // (QuerySelect::Patch)
  std::string token;               // (QuerySelect::Token) "cls", "dist" or "regK" (maps.hpp prefix_token_index)
  int layer = -1;                  // < 0: the last layer
  bool causal = false;
  float temperature = 1.0f;        // softmax temperature T: scores times 1 / (sqrt(d) T); 1 = the model's scale
  Precision precision = Precision::Fp32;  // the forward's products (vit.hpp); Auto resolved per model
  float threshold = 0.0f;          // DINO's top-mass threshold in (0, 1] applied to every map; 0 = off
  std::string mask_image;          // painted key mask (key_mask_from_image); empty = none
  HeatmapStyle style;
  Normalize normalize = kDefaultNormalize;
  bool raw = false;                // also write <stem>_attn.npy (L, H, N, N)
  int max_side = -1;               // < 0: the model's img_size long side; 0: native size
  ImageTransform transform;        // present(): --preprocess model, the model's own transform
                                   // (preprocess.hpp; max_side is then unused); else the whole image
  std::string stem;                // output file stem; empty: the image file's stem
  bool force = false;              // replace files of the outputs' names that vitlens did not write (--force)
  nlohmann::json view_notes;       // null, or what only the viewer can set: <stem>_view.json, in the same set
  std::function<bool(float)> progress;  // the forward pass's progress in [0, 1]; may be empty
};

// Temperatures `--temperature` takes (the viewer's script takes the same range).
constexpr float kMinTemperature = 0.05f, kMaxTemperature = 20.0f;

// Largest token count for which --raw is allowed: (L, H, N, N) float32 grows as N^2.
constexpr int kMaxRawTokens = 4096;
constexpr double kMaxRawBytes = 2.0 * (1 << 30);  // and at most 2 GiB of (L, H, N, N) floats
// Largest token count any export takes (a 1024 x 1024 working size at P = 4, 2048 x 2048 at
// P = 8): attention work grows as N^2 (65537 tokens: about 5 s on two idle cores, see
// bench/README.md). Above it an export runs for many minutes (196609 tokens, a 4:3 photo at
// --size 2048 and P = 4, ran for more than 15 on two busy cores), so it is refused before the
// forward pass with a message that names the working size.
constexpr int kMaxTokens = 65537;

struct ImageAnalysis {
  std::string image_path;
  ImageTransform transform;  // the settings' (present(): --preprocess model)
  PreparedImage image;
  ForwardResult forward;
  MapRequest request;
  HeadMaps maps;                      // as drawn: after the threshold when one is set
  std::vector<ThresholdResult> kept;  // (H + 1) heads then mean when a threshold is set, else empty
  float threshold = 0.0f;             // the mass those results kept; 0 = none
  std::string mask_image;             // the painted mask's file, when one was used
  std::array<int, 2> requested_pixel{-1, -1};  // a --query pixel of the source image, as given; -1: none
  Predictions predictions;            // the classifier's top classes (classifier.hpp); none without a head
  double forward_ms = 0.0, maps_ms = 0.0;
};

// A painted key mask from an image file: white = key allowed, black = forbidden. The mask is
// stretched over the source image (so it must have the image's aspect ratio, within 2 %; any
// size), then each patch of the processed grid takes the mean brightness of the mask over the
// pixels of the image it covers (area interpolation to the working size): a patch at 50 % grey or
// brighter stays allowed, a darker one is forbidden. Padding patches cover no image pixels and are
// masked anyway. Colour masks count their mean over R, G and B; an alpha channel is ignored.
// Returns (gh*gw) 1 = forbidden, as ForwardOptions::forbidden_patches. Throws vitlens::Error.
std::vector<uint8_t> key_mask_from_image(const cv::Mat& mask_rgb01, const PreparedImage& image,
                                         const VitConfig& config, const std::string& mask_path);

// A pixel (x, y) of the source image -> the pixel of the processed image it lands on (the
// image's resize factor, as prepare_image applied it). Throws vitlens::Error outside the image.
void source_to_processed_pixel(const PreparedImage& image, int x, int y, int& px, int& py);

// Throws vitlens::Error when the settings cannot apply to this model, whatever the image: a layer
// past its depth, --cls without a class token, --pool without an attention pool or with a layer
// other than the last, alpha outside [0, 1], an unknown colour map, a
// temperature outside [kMinTemperature, kMaxTemperature], a threshold outside (0, 1].
void check_settings(const VitModel& model, const ExportSettings& settings);

// Settings -> the map request for an image's patch grid (resolves Pixel, Patch and the layer;
// SourcePixel needs the image: analyse_image turns it into Pixel first).
MapRequest resolve_request(const VitModel& model, int grid_h, int grid_w, const ExportSettings& settings);

// The forward options of the settings (mask, softmax scale from the temperature); the painted
// mask's patches are added by analyse_image, which knows the image.
ForwardOptions forward_options_for(const VitModel& model, const ExportSettings& settings);

// Load, prepare, forward and map one image. Throws vitlens::Error. With settings.raw every layer's
// (N, N) weights are kept; `weights_for` names what wants them in the size errors ("--raw" stores
// them, "--rollout" multiplies them).
ImageAnalysis analyse_image(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                            const std::string& weights_for = "--raw stores (layers, heads, N, N) floats");

// The pictures of one analysis, in memory: per head overlays, the mean overlay and the montage.
struct ExportImages {
  std::vector<cv::Mat> heads;  // H x CV_8UC3 RGB at the processed (padded) image size
  cv::Mat mean;
  cv::Mat montage;
};
// The montage carries a colour bar and a caption (montage_caption); the per-head images are plain
// overlays (the viewer's tiles), which write_export writes each with its label, the bar and the caption.
ExportImages render_export_images(const VitModel& model, const ImageAnalysis& analysis, const HeatmapStyle& style,
                                  Normalize normalize);
// The value drawn at the top of the colour map for each head's map (index H = the mean): its
// maximum (PerHead, Log), the largest over the heads (Shared), robust_scale_top over the patches
// it shows (Robust, shown_patches).
std::vector<float> map_scales(const HeadMaps& maps, Normalize normalize);
// The same for one map on its own (Shared counts as PerHead): what map_scales gives each map.
float map_scale(const MatRM& map, Normalize normalize, const PatchSelection& patches = {});
// What the montage says it shows: model, layer (layers `analysis.request.layer` to `last_layer`
// when last_layer >= 0: the layers montage), mode and query, normalisation, mask, softmax scale
// and threshold, one phrase per element (the montage wraps them to its width).
std::vector<std::string> montage_caption(const VitModel& model, const ImageAnalysis& analysis, Normalize normalize,
                                         int last_layer = -1);
// The caption's phrases about the forward pass every picture shares: the mask (padding, causal,
// the painted mask's file and patches) and the softmax's scale (with the temperature when set).
std::vector<std::string> forward_caption(const VitModel& model, const ForwardResult& forward, const std::string& mask_image);
// The caption's phrase for a scale: "scale: each tile 0 to its maximum", ...
std::string scale_phrase(Normalize normalize);
// The montage's colour bar: ticks relative to each tile's top value, or absolute when shared
// (shared_scale > 0; 0 when rows of tiles have scales of their own: relative to each row's).
ColourBarSpec montage_colour_bar(const HeatmapStyle& style, Normalize normalize, float shared_scale);
// A tile's label: `name`, then on a line of its own the map's maximum and, for Robust, its top.
// The maximum matters: a uniform map (a head with nothing to look for at this query) fills its
// tile with full colour, and only its tiny maximum (1 / tokens) says so.
std::string tile_label(const std::string& name, const MatRM& map, float scale, Normalize normalize);
// Short label for head h of a layer: "head 0" plus the text before ':' in its description.
std::string head_label(const VitConfig& config, int layer, int head);

nlohmann::json export_sidecar(const VitModel& model, const ImageAnalysis& analysis, const ExportSettings& settings);

// The records' "classifier" and "predictions" (every export mode writes them): "classifier" says
// how the head read the tokens (classes, names, pooling, the padding left out, whether the forward
// was the model's own or changed by a causal mask, a temperature or a painted mask), or is the
// string "none: ..." for a model without a head; "predictions" is the top classes, highest first,
// [{"rank", "index", "label", "probability", "logit"}], empty without a head.
void add_predictions(nlohmann::json& record, const VitModel& model, const ForwardResult& forward,
                     const Predictions& predictions);

// The records' "preprocess" ("model" with the model's own transform, else "whole"), "transform"
// (its library, file and steps; only with "model") and "precision" (the forward's products, "fp32"
// or "bf16"): how the pass was made, in every export mode's record.
void add_pass_record(nlohmann::json& record, const ImageTransform& transform, Precision precision);

// The names of one layer's maps of `stem`: <stem>_head<h>.png for each head, <stem>_mean.png,
// <stem>_montage.png, <stem>_attn.npy (raw), <stem>_view.json (the viewer's notes) and the
// record <stem>.json. write_export names its files from here; every mode's names are listed by
// export_output_names (export_layers.hpp).
struct MapsOutputNames {
  std::vector<std::string> heads;
  std::string mean, montage;
  std::string raw;         // "" without raw weights
  std::string pool_raw;    // <stem>_pool_attn.npy: raw weights of a model with an attention pool, else ""
  std::string view_notes;  // "" without viewer notes
  std::string record;
};
MapsOutputNames maps_output_names(const std::string& stem, int heads, bool raw, bool view_notes, bool pool = false);

// Adds the files of one analysis, named `names`, to `set` and returns their record (the JSON
// sidecar, "files" and the proof added by the set), for the caller to commit (write_export) or to
// add as one record of a larger set (export_layers).
nlohmann::json add_export_files(OutputSet& set, const VitModel& model, const ImageAnalysis& analysis,
                                const ExportSettings& settings, const MapsOutputNames& names);

// Writes every output of one analysis as one set (files.hpp: OutputSet); returns the paths
// written, the record last. Throws vitlens::Error (OutputConflict when a name is taken by a file
// vitlens did not write and settings.force is off). Every picture (each head, the mean, the
// montage) has the montage's labels, colour bar and caption.
std::vector<std::string> write_export(const VitModel& model, const ImageAnalysis& analysis,
                                      const ExportSettings& settings);

// Adds `name` to `set`: the (L, H, N, N) float32 weights of `forward` as .npy, class token first
// then patches row-major, as numpy.load reads it; streamed from the forward's buffers. Throws
// vitlens::Error when the forward did not keep every weight.
void add_attention_npy(OutputSet& set, const std::string& name, const ForwardResult& forward, int heads,
                       const std::string& image_path);

// The file stem outputs are named after: "dir/photo.jpg" -> "photo" ("image" when empty).
std::string output_stem(const std::string& image_path);

// analyse_image + write_export. The stem of the outputs is the image file's stem.
std::vector<std::string> export_attention(const VitModel& model, const std::string& image_path,
                                          const ExportSettings& settings);

}  // namespace vitlens
