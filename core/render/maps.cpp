// Per-head attention maps over the patch grid, from the forward pass's stored state.
#include "core/render/maps.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/base/error.hpp"

namespace vitlens {

const char* map_mode_name(MapMode mode) { return enum_name(kMapModeNames, mode); }
bool parse_map_mode(const std::string& name, MapMode& mode) { return parse_enum(kMapModeNames, name, mode); }

HeadMaps attention_maps(const VitModel& model, const ForwardResult& result, const MapRequest& request) {
  const int heads = model.config.num_heads;
  const int layers = static_cast<int>(result.layers.size());
  if (request.layer < 0 || request.layer >= layers)
    throw Error("layer " + std::to_string(request.layer) + " is out of range: the model has " +
                std::to_string(layers) + " layer(s), 0 to " + std::to_string(layers - 1));
  if (request.mode == MapMode::ClassToken && !result.has_class_token)
    throw Error("model '" + model.config.name + "' has no class token: use a query patch or attention received");
  if (request.mode == MapMode::Pool && result.pool_probs.rows() != heads)
    throw Error("model '" + model.config.name + "' has no attention pool (SigLIP's head, timm global_pool 'map'): "
                "use a query patch, the class token or attention received");
  const LayerState& state = result.layers[static_cast<size_t>(request.layer)];

  HeadMaps maps;
  maps.grid_h = result.grid_h;
  maps.grid_w = result.grid_w;
  maps.mean = MatRM::Zero(result.grid_h, result.grid_w);
  maps.cls_weight.assign(static_cast<size_t>(heads), 0.0f);
  maps.prefix_weight = MatRM::Zero(heads, result.prefix);
  maps.in_image = image_patches(result);
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
      case MapMode::Pool: weights = result.pool_probs.row(h).data(); break;
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

int prefix_token_index(const VitConfig& config, const std::string& name) {
  const std::string model = "model '" + config.name + "'";
  if (name == "cls") {
    if (!config.class_token) throw Error("--token cls: " + model + " has no class token");
    return config.class_index();
  }
  if (name == "dist") {
    if (!config.dist_token) throw Error("--token dist: " + model + " has no distillation token (only distilled DeiT has one)");
    return config.dist_index();
  }
  if (name.size() > 3 && name.compare(0, 3, "reg") == 0 &&
      name.find_first_not_of("0123456789", 3) == std::string::npos && name.size() <= 9) {
    const int k = std::stoi(name.substr(3));
    if (config.register_tokens == 0) throw Error("--token " + name + ": " + model + " has no register tokens");
    if (k >= config.register_tokens)
      throw Error("--token " + name + ": " + model + " has " + std::to_string(config.register_tokens) +
                  " register tokens, reg0 to reg" + std::to_string(config.register_tokens - 1));
    return config.first_register() + k;
  }
  throw Error("--token expects cls, dist or regK (a register token, K from 0), got '" + name + "'");
}

std::string prefix_token_short_name(const VitConfig& config, int token) {
  if (token < 0 || token >= config.prefix_tokens()) return {};
  if (token == config.class_index()) return "cls";
  if (token == config.dist_index()) return "dist";
  return "reg" + std::to_string(token - config.first_register());
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

bool selected(const PatchSelection& patches, Eigen::Index i) {
  return patches.empty() || patches[static_cast<size_t>(i)] != 0;
}

PatchSelection image_patches(const ForwardResult& result) {
  PatchSelection in_image;
  in_image.reserve(result.patch_is_padding.size());
  for (const uint8_t padding : result.patch_is_padding) in_image.push_back(padding ? 0 : 1);
  return in_image;
}

const PatchSelection& shown_patches(const HeadMaps& maps, size_t index) {
  return index < maps.kept.size() ? maps.kept[index] : maps.in_image;
}

float map_min(const MatRM& map, const PatchSelection& patches) {
  float lo = 0.0f;
  bool any = false;
  for (Eigen::Index i = 0; i < map.size(); ++i)
    if (selected(patches, i)) {
      lo = any ? std::min(lo, map.data()[i]) : map.data()[i];
      any = true;
    }
  return lo;
}

ThresholdResult keep_top_mass(const MatRM& map, float mass, const PatchSelection& patches) {
  if (!(mass > 0.0f && mass <= 1.0f)) throw Error("threshold mass must be in (0, 1], got " + std::to_string(mass));
  if (!patches.empty() && patches.size() != static_cast<size_t>(map.size()))
    throw Error("internal: a patch selection of " + std::to_string(patches.size()) + " for a map of " +
                std::to_string(map.size()) + " patches");
  ThresholdResult out;
  out.kept_map = MatRM::Zero(map.rows(), map.cols());
  out.kept.assign(static_cast<size_t>(map.size()), 0);
  // The order DINO sorts, over the selected patches only.
  std::vector<Eigen::Index> order;
  for (Eigen::Index i = 0; i < map.size(); ++i)
    if (selected(patches, i)) order.push_back(i);
  out.total_patches = static_cast<int>(order.size());
  if (order.empty()) {
    out.no_structure = true;
    return out;
  }
  auto value = [&](Eigen::Index i) { return std::max(0.0f, map.data()[i]); };
  auto keep = [&](Eigen::Index i) {
    out.kept_map.data()[i] = map.data()[i];
    out.kept[static_cast<size_t>(i)] = 1;
    ++out.kept_patches;
  };
  double total = 0.0;
  float lo = value(order[0]), hi = lo;
  for (const Eigen::Index i : order) {
    total += value(i);
    lo = std::min(lo, value(i));
    hi = std::max(hi, value(i));
  }
  const float tolerance = kTieTolerance * hi;
  if (total <= 0.0 || hi - lo <= tolerance) {
    // Nothing stands out: keeping "the top 60 %" would only pick patches by their index.
    out.no_structure = true;
    // A flat map is shown whole; an all-zero map (every key masked) keeps nothing.
    if (total > 0.0) {
      for (const Eigen::Index i : order) keep(i);
      out.kept_mass = 1.0;
    }
    return out;
  }
  // val, idx = torch.sort(attentions); val /= sum; cumval = cumsum(val); th = cumval > 1 - t
  std::stable_sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return value(a) < value(b); });
  const double drop_below = 1.0 - static_cast<double>(mass);
  double cumulative = 0.0, kept = 0.0;
  // Groups of tied values [begin, end) in ascending order; a group starts at a value more than the
  // tolerance above the group's first value.
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && value(order[end]) - value(order[begin]) <= tolerance) ++end;
    double group = 0.0;
    for (size_t k = begin; k < end; ++k) group += value(order[k]);
    cumulative += group / total;
    // DINO keeps a patch when the cumulative share up to it exceeds 1 - mass; a tie group is kept
    // whole when its last member would be.
    if (cumulative > drop_below) {
      for (size_t k = begin; k < end; ++k) keep(order[k]);
      kept += group;
    }
    begin = end;
  }
  out.kept_mass = kept / total;
  return out;
}

std::vector<ThresholdResult> apply_threshold(HeadMaps& maps, float mass) {
  std::vector<ThresholdResult> results;
  maps.kept.clear();
  auto threshold = [&](MatRM& m) {
    results.push_back(keep_top_mass(m, mass, maps.in_image));
    m = results.back().kept_map;
    maps.kept.push_back(results.back().kept);
  };
  for (MatRM& m : maps.heads) threshold(m);
  threshold(maps.mean);
  return results;
}

}  // namespace vitlens
