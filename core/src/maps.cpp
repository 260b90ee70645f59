// Per-head attention maps over the patch grid, from the forward pass's stored state.
#include "vitlens/maps.hpp"

#include <algorithm>
#include <cmath>

#include "vitlens/error.hpp"

namespace vitlens {

const char* map_mode_name(MapMode mode) {
  switch (mode) {
    case MapMode::Query: return "query";
    case MapMode::ClassToken: return "cls";
    case MapMode::Received: return "received";
  }
  return "?";
}

HeadMaps attention_maps(const VitModel& model, const ForwardResult& result, const MapRequest& request) {
  const int heads = model.config.num_heads;
  const int layers = static_cast<int>(result.layers.size());
  if (request.layer < 0 || request.layer >= layers)
    throw Error("layer " + std::to_string(request.layer) + " is out of range: the model has " +
                std::to_string(layers) + " layer(s), 0 to " + std::to_string(layers - 1));
  if (request.mode == MapMode::ClassToken && !result.has_class_token)
    throw Error("model '" + model.config.name + "' has no class token: use a query patch or attention received");
  const LayerState& state = result.layers[static_cast<size_t>(request.layer)];

  HeadMaps maps;
  maps.grid_h = result.grid_h;
  maps.grid_w = result.grid_w;
  maps.mean = MatRM::Zero(result.grid_h, result.grid_w);
  maps.cls_weight.assign(static_cast<size_t>(heads), 0.0f);
  maps.prefix_weight = MatRM::Zero(heads, result.prefix);
  std::vector<float> row(static_cast<size_t>(result.tokens));
  for (int h = 0; h < heads; ++h) {
    const float* weights = nullptr;
    switch (request.mode) {
      case MapMode::Query:
        // One query's row from q and K alone: O(N d), never the (N, N) matrix.
        attention_row(model, result, request.layer, h, request.query_token, row.data());
        weights = row.data();
        break;
      case MapMode::ClassToken: weights = state.cls_row.row(h).data(); break;
      case MapMode::Received: weights = state.received.row(h).data(); break;
    }
    if (result.has_class_token) maps.cls_weight[static_cast<size_t>(h)] = weights[0];
    if (result.prefix) maps.prefix_weight.row(h) = ConstMapRM(weights, 1, result.prefix);
    // The patch map leaves the prefix tokens (class, distillation, registers) out.
    MatRM map = ConstMapRM(weights + result.prefix, result.grid_h, result.grid_w);
    maps.mean += map;
    maps.heads.push_back(std::move(map));
  }
  maps.mean /= static_cast<float>(heads);
  return maps;
}

int token_at_pixel(const VitConfig& config, int grid_h, int grid_w, int x, int y) {
  const int p = config.patch_size;
  if (x < 0 || y < 0 || x >= grid_w * p || y >= grid_h * p)
    throw Error("query pixel (" + std::to_string(x) + ", " + std::to_string(y) + ") is outside the " +
                std::to_string(grid_w * p) + "x" + std::to_string(grid_h * p) + " processed image");
  return config.prefix_tokens() + (y / p) * grid_w + (x / p);
}

int token_at_patch(const VitConfig& config, int grid_h, int grid_w, int row, int col) {
  if (row < 0 || col < 0 || row >= grid_h || col >= grid_w)
    throw Error("query patch (" + std::to_string(row) + ", " + std::to_string(col) + ") is outside the " +
                std::to_string(grid_h) + "x" + std::to_string(grid_w) + " patch grid");
  return config.prefix_tokens() + row * grid_w + col;
}

double map_entropy(const MatRM& map) {
  double sum = 0.0;
  for (Eigen::Index i = 0; i < map.size(); ++i) sum += std::max(0.0f, map.data()[i]);
  if (sum <= 0.0) return 0.0;
  double h = 0.0;
  for (Eigen::Index i = 0; i < map.size(); ++i) {
    const double p = std::max(0.0f, map.data()[i]) / sum;
    if (p > 0.0) h -= p * std::log(p);
  }
  return h;
}

}  // namespace vitlens
