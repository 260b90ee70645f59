#pragma once
// The layers x heads grid: every head of every layer as a small map for one request
// (a query token, the class token's row or attention received), scaled and thresholded exactly as
// the one-layer maps are (maps.hpp, export.hpp), and drawn into one picture with a tile per head.
// The viewer's "Layers x heads" window uploads that picture as one texture.
//
// Cost: a query's maps come from the forward pass's cached q and key panels (attention_row,
// O(N d) per head), never the (N, N) weights and never a new forward pass; for L = 12, H = 12 at
// 197 tokens that is 144 rows of 197 scores (bench/README.md has the measured time).
//
// Legend: L = layers, H = heads, gh, gw = patch grid rows and columns.
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "core/render/export.hpp"
#include "core/render/maps.hpp"

namespace vitlens {

// attention_maps for every layer with the same mode and query: (L) results, layer order.
// Throws vitlens::Error as attention_maps does, and for MapMode::Pool (the pool is one row, after
// the blocks: layer_grid adds it).
std::vector<HeadMaps> all_layer_maps(const VitModel& model, const ForwardResult& result, MapMode mode, int query_token);

struct LayerGridStyle {
  std::string colormap = "viridis";
  Normalize normalize = kDefaultNormalize;
  float threshold = 0.0f;  // DINO's top-mass threshold in (0, 1]; 0 = off (as ExportSettings)
  int cell_gap = 1;        // pixels between tiles (drawn in the background colour)
};

// With an attention pool (SigLIP's head) the grid has one row more after the blocks' rows: the
// pool's heads, its latent query over the patch tokens, whatever the blocks' rows show. In
// MapMode::Pool that row is the whole grid (layers = 0).
struct LayerGrid {
  int layers = 0, heads = 0, grid_h = 0, grid_w = 0;
  bool pool_row = false;                  // the last row is the attention pool's (row index `layers`)
  std::vector<HeadMaps> maps;             // (rows()) the maps as drawn: after the threshold when one is set
  std::vector<std::vector<float>> scales; // (rows(), H + 1) map_scales of each row (as the heads view)
  cv::Mat picture;                        // CV_8UC3 RGB, (rows() * (gh + gap) - gap, H * (gw + gap) - gap):
                                          // tile (l, h) at x = h (gw + gap), y = l (gh + gap), one
                                          // pixel per patch (the viewer scales it up, nearest)
  int rows() const { return layers + (pool_row ? 1 : 0); }
};

// The maps of all_layer_maps, thresholded (apply_threshold, per layer) and scaled per layer as the
// heads view scales one layer (map_scales: shared = one scale over a layer's heads), coloured by
// display_values and apply_colormap. Throws vitlens::Error (a bad colour map or threshold).
LayerGrid layer_grid(const VitModel& model, const ForwardResult& result, MapMode mode, int query_token,
                     const LayerGridStyle& style);

// The tile (layer, head) under pixel (x, y) of a grid picture; false on a gap or outside. On the
// attention pool's row, layer == grid.layers.
bool layer_grid_cell(const LayerGrid& grid, int cell_gap, int x, int y, int& layer, int& head);

}  // namespace vitlens
