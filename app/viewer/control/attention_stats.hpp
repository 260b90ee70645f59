#pragma once
// Numbers the viewer shows beside the maps, all from core's forward state: per-head entropy and
// mean attention distance, the working grid a size gives, and the step-by-step arithmetic of one
// query-key pair. No display needed; unit-tested.
//
// Legend: N = tokens (class token first), H = heads, d = head dim, gh, gw = patch grid, P = patch.
#include <functional>
#include <string>
#include <vector>

#include "core/base/eigen.hpp"
#include "core/render/maps.hpp"
#include "core/model/vit.hpp"

namespace vitlens::viewer {

// [SECTION] Threshold: keep_top_mass and ThresholdResult live in core (vitlens/maps.hpp), shared
// with `vitlens export --threshold`.

// [SECTION] Head statistics

struct HeadStats {
  double entropy = 0.0;        // mean over queries of the row's Shannon entropy (nats), all keys
  double mean_distance = 0.0;  // mean over queries of sum_j w_ij |p_i - p_j| in pixels, over the
                               // patch keys with the weights renormalised to sum 1 (ViT paper fig. 7)
};

struct ImageStats {
  std::vector<std::vector<HeadStats>> layers;  // (L, H)
  int queries = 0;                             // patch queries averaged over (sampled if many)
};

// Every layer and head over at most `max_queries` non-padding patch queries (evenly strided).
// `progress` (may be empty) gets [0, 1] and returns false to cancel (then throws vitlens::Error).
ImageStats head_statistics(const VitModel& model, const ForwardResult& result,
                           const std::vector<uint8_t>& patch_is_padding, int max_queries,
                           const std::function<bool(float)>& progress);

// [SECTION] Working grid

// What prepare_image will make of a source image at a working size (max_side > 0), without doing it.
struct GridPrediction {
  int content_w = 0, content_h = 0, grid_w = 0, grid_h = 0, tokens = 0;
  bool resized = false;
};
GridPrediction predict_grid(int source_w, int source_h, const VitConfig& config, int max_side);

// [SECTION] Inspector

// One head's arithmetic for the pair (query i, key j) at one layer:
//   dot = q_i . k_j, scaled = dot * scale, weight = softmax_j(scaled) with the mask,
//   contribution = weight * v_j (the key's share of the head output), output = sum_j w_ij v_j.
struct HeadStep {
  std::vector<float> q, k, v, contribution, output;  // (d) each
  float dot = 0.0f, scaled = 0.0f, weight = 0.0f;
  float max_weight = 0.0f;                          // the row's largest weight, for scale
};

struct InspectorStep {
  int layer = 0, query_token = 0, key_token = 0;
  std::vector<float> query_patch, key_patch;  // (3 P P) normalised values, (c, y, x); empty for the class token
  bool key_allowed = true;                    // false when the mask forbids the key for this query
  float score_scale = 0.0f;
  std::vector<HeadStep> heads;                // (H)
};

InspectorStep inspect_pair(const VitModel& model, const ForwardResult& result, const PatchGrid& grid, int layer,
                           int query_token, int key_token);

}  // namespace vitlens::viewer
