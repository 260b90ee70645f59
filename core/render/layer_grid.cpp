// The layers x heads grid (see layer_grid.hpp).
#include "core/render/layer_grid.hpp"

#include <algorithm>

#include "core/base/error.hpp"
#include "core/render/heatmap.hpp"

namespace vitlens {

std::vector<HeadMaps> all_layer_maps(const VitModel& model, const ForwardResult& result, MapMode mode, int query_token) {
  if (mode == MapMode::Pool) throw Error("the attention pool is one row after the blocks, not one per layer");
  std::vector<HeadMaps> maps;
  maps.reserve(result.layers.size());
  MapRequest request;
  request.mode = mode;
  request.query_token = query_token;
  for (int l = 0; l < static_cast<int>(result.layers.size()); ++l) {
    request.layer = l;
    maps.push_back(attention_maps(model, result, request));
  }
  return maps;
}

LayerGrid layer_grid(const VitModel& model, const ForwardResult& result, MapMode mode, int query_token,
                     const LayerGridStyle& style) {
  if (!is_colormap(style.colormap)) throw Error("unknown colour map '" + style.colormap + "'");
  if (style.cell_gap < 0) throw Error("layer grid: the gap between tiles must be 0 or more pixels");
  LayerGrid g;
  if (mode == MapMode::Pool && result.pool_probs.size() == 0) {
    MapRequest request;
    request.mode = MapMode::Pool;
    attention_maps(model, result, request);  // throws, naming the missing pool
  }
  if (mode != MapMode::Pool) g.maps = all_layer_maps(model, result, mode, query_token);
  g.layers = static_cast<int>(g.maps.size());
  g.pool_row = result.pool_probs.size() > 0;
  if (g.pool_row) {  // the pool's own row, after the blocks
    MapRequest request;
    request.mode = MapMode::Pool;
    request.layer = static_cast<int>(result.layers.size()) - 1;
    g.maps.push_back(attention_maps(model, result, request));
  }
  g.heads = model.config.num_heads;
  g.grid_h = result.grid_h;
  g.grid_w = result.grid_w;
  const int gap = style.cell_gap;
  const int rows = std::max(0, g.rows() * (g.grid_h + gap) - gap), cols = std::max(0, g.heads * (g.grid_w + gap) - gap);
  // Every tile's display values in one canvas, coloured by one apply_colormap call; gaps stay
  // marked (-1) and are painted afterwards.
  cv::Mat values(rows, cols, CV_32F, cv::Scalar(0.0f));
  cv::Mat is_gap(rows, cols, CV_8U, cv::Scalar(1));
  for (int l = 0; l < g.rows(); ++l) {
    HeadMaps& maps = g.maps[static_cast<size_t>(l)];
    if (style.threshold > 0.0f) apply_threshold(maps, style.threshold);  // as analyse_image and the viewer
    g.scales.push_back(map_scales(maps, style.normalize));
    for (int h = 0; h < g.heads; ++h) {
      const MatRM shown = display_values(maps.heads[static_cast<size_t>(h)], g.scales.back()[static_cast<size_t>(h)],
                                         style.normalize);  // (gh, gw) in [0, 1]
      const int y0 = l * (g.grid_h + gap), x0 = h * (g.grid_w + gap);
      for (int r = 0; r < g.grid_h; ++r) {
        float* out = values.ptr<float>(y0 + r) + x0;
        uint8_t* gap_row = is_gap.ptr<uint8_t>(y0 + r) + x0;
        for (int c = 0; c < g.grid_w; ++c) {
          out[c] = shown(r, c);
          gap_row[c] = 0;
        }
      }
    }
  }
  g.picture = rows > 0 && cols > 0 ? apply_colormap(values, style.colormap) : cv::Mat(rows, cols, CV_8UC3);
  g.picture.setTo(cv::Scalar(24, 24, 26), is_gap);  // the viewer's background, so tiles stand apart
  return g;
}

bool layer_grid_cell(const LayerGrid& grid, int cell_gap, int x, int y, int& layer, int& head) {
  if (x < 0 || y < 0 || grid.grid_w <= 0 || grid.grid_h <= 0) return false;
  const int step_x = grid.grid_w + cell_gap, step_y = grid.grid_h + cell_gap;
  const int h = x / step_x, l = y / step_y;
  if (h >= grid.heads || l >= grid.rows() || x % step_x >= grid.grid_w || y % step_y >= grid.grid_h) return false;
  layer = l;
  head = h;
  return true;
}

}  // namespace vitlens
