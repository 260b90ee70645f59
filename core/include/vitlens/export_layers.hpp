#pragma once
// Exports beyond one layer's maps: every layer of a range (one montage per layer plus a
// layers x heads montage) and attention rollout. The same analysis as export.hpp (one forward
// pass per image), the same pictures and file conventions (atomic writes, <stem>_* names).
#include <string>
#include <vector>

#include "vitlens/export.hpp"
#include "vitlens/rollout.hpp"

namespace vitlens {

// Layers [first, last] of one image: for each layer l what write_export writes, named
// <stem>_layer<l>_* (the --raw weights once, as <stem>_attn.npy), and <stem>_layers_montage.png:
// one row per layer, one column per head plus the mean, with the head montage's labels, colour
// bar and caption. Throws vitlens::Error.
std::vector<std::string> export_layers(const VitModel& model, const std::string& image_path, const ExportSettings& settings,
                                       int first, int last);

// Rollout of one image (rollout.hpp) from the class token, or from the query patch the settings
// select: <stem>_rollout.png (the map over the image) and <stem>_rollout.json. The received mode
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


}  // namespace vitlens
