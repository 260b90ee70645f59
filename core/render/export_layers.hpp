#pragma once
// Exports beyond one layer's maps: every layer of a range (one montage per layer plus a
// layers x heads montage) and attention rollout. The same analysis as export.hpp (one forward
// pass per image), the same pictures and file conventions (atomic writes, <stem>_* names).
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

#include "core/render/export.hpp"
#include "core/model/rollout.hpp"

namespace vitlens {

// Layers [first, last] of one image: for each layer l what write_export writes, named
// <stem>_layer<l>_* (the --raw weights once, as <stem>_layers_attn.npy), and <stem>_layers_montage.png:
// one row per layer, one column per head plus the mean, with the head montage's labels, colour
// bar and caption, and the record <stem>_layers.json. One set: every file appears, or none.
// The layers montage is an overview: where its tiles at full size would pass
// kMaxLayersMontagePixels, each is scaled down by layers_montage_scale (area averaging) as its
// layer is drawn, and only the scaled tile is kept; each layer's own files keep the full size.
// Returns the paths written. Throws vitlens::Error.
// At full size every layer of a 16-layer, 8-head model at --size 1024 made 144 tiles of 1.4 Mpx:
// a 163 Mpx montage (489 MB as RGB) with its tiles (600 MB) held at once, 2 GB in all.
constexpr double kMaxLayersMontagePixels = 32.0 * 1024 * 1024;

// The factor (at most 1) by which `tiles` tiles of `tile_pixels` each are scaled so that together
// they stay within kMaxLayersMontagePixels.
double layers_montage_scale(double tiles, double tile_pixels);

std::vector<std::string> export_layers(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                                       int first, int last);

// Rollout of one image (rollout.hpp) from the class token, or from the query patch the settings
// select: <stem>_rollout.png (the map over the image) and the record <stem>_rollout.json. The received mode
// means the class token here; a model without one needs a query patch. Limited to kMaxRawTokens,
// since rollout multiplies the full (N, N) weights. Throws vitlens::Error.
std::vector<std::string> export_rollout(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                                        const RolloutOptions& rollout);

// The pieces of export_rollout the viewer's rollout mode shares, so its export is the CLI's byte
// for byte. The token whose rollout row is shown: the query of `request` (a patch or a prefix
// token) or, in the other modes, the class token (throws vitlens::Error without one).
int rollout_query(const VitModel& model, const MapRequest& request);
// The (gh, gw) rollout map over the processed image, scaled to its maximum (or log, with
// Normalize::Log): the viewer's rollout picture and the map tile of rollout_figure.
cv::Mat rollout_picture(const VitModel& model, const PreparedImage& image, const MatRM& map, const ExportSettings& settings);
// <stem>_rollout.png: the image and rollout_picture side by side at a readable size, with the
// head montage's colour bar and a caption saying what was multiplied (the same montage drawing).
cv::Mat rollout_figure(const VitModel& model, const PreparedImage& image, const ForwardResult& forward, const MatRM& map,
                       int query, const RolloutOptions& rollout, const ExportSettings& settings);
// Writes <stem>_rollout.png and <stem>_rollout.json of a rollout matrix (N, N) already computed
// from `forward` (its probs may be gone); `ms` is recorded as the time it took.
std::vector<std::string> write_rollout(const VitModel& model, const std::string& image_path, const PreparedImage& image,
                                       const ForwardResult& forward, const MatRM& matrix, int query,
                                       const RolloutOptions& rollout, const ExportSettings& settings, double ms);

// [SECTION] Output names
// Which files one image's export writes, whatever the mode: the writers take their names from the
// *_output_names functions and export_output_names lists them all, so a guard that checks a
// run's names (the CLI never lets an output replace one of its inputs) knows every file.
struct ExportPlan {
  enum class Kind { Maps, Layers, Rollout };
  Kind kind = Kind::Maps;
  int heads = 0;                         // the model's heads (Maps, Layers)
  bool raw = false;                      // <stem>_attn.npy (Maps, Layers)
  bool pool = false;                     // the model has an attention pool: with raw, <stem>_pool_attn.npy (Maps)
  int first_layer = 0, last_layer = -1;  // Layers
  bool view_notes = false;               // the viewer's notes (Maps, Rollout)
};
// <stem>_layer<l>: the stem of layer l's maps in a layers export.
std::string layer_stem(const std::string& stem, int layer);
struct LayersOutputNames {
  std::string montage;  // <stem>_layers_montage.png
  std::string raw;      // <stem>_attn.npy, "" without raw weights
  std::string record;   // <stem>_layers.json
};
LayersOutputNames layers_output_names(const std::string& stem, bool raw);
struct RolloutOutputNames {
  std::string picture;     // <stem>_rollout.png
  std::string view_notes;  // <stem>_rollout_view.json, "" without viewer notes
  std::string record;      // <stem>_rollout.json
};
RolloutOutputNames rollout_output_names(const std::string& stem, bool view_notes);
// Every file name (no folder) one image's export of `stem` writes.
std::vector<std::string> export_output_names(const std::string& stem, const ExportPlan& plan);
// Output stems for a run's images: two images never overwrite each other's outputs, and no output
// replaces an input, even one vitlens wrote (exporting "a.png a_mean.png" into their own folder
// would overwrite the second before reading it): a stem one of whose outputs in `out_dir` is an
// input (the same file, by device and inode, whatever the path) is taken.
class StemChooser {
 public:
  StemChooser(const std::string& out_dir, const ExportPlan& plan, const std::vector<std::string>& inputs);
  // The image's stem (output_stem), or the next free "<stem>_K".
  std::string choose(const std::string& image);

 private:
  bool replaces_input(const std::string& stem) const;
  std::string out_dir_;
  ExportPlan plan_;
  std::set<std::pair<dev_t, ino_t>> inputs_;
  std::set<std::string> used_;
};

}  // namespace vitlens
