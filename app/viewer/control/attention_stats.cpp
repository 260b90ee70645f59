// Head statistics, working grid and inspector numbers (see attention_stats.hpp).
#include "control/attention_stats.hpp"

#include <algorithm>
#include <cmath>

#include "core/base/error.hpp"

namespace vitlens::viewer {

// [SECTION] Head statistics

ImageStats head_statistics(const VitModel& model, const ForwardResult& result,
                           const std::vector<uint8_t>& patch_is_padding, int max_queries,
                           const std::function<bool(float)>& progress) {
  const VitConfig& cfg = model.config;
  const int heads = cfg.num_heads, layers = static_cast<int>(result.layers.size());
  const int gw = result.grid_w, patches = result.grid_h * result.grid_w, prefix = result.prefix;
  const float p = static_cast<float>(cfg.patch_size);

  std::vector<int> queries;  // patch indices
  for (int i = 0; i < patches; ++i)
    if (patch_is_padding.empty() || !patch_is_padding[static_cast<size_t>(i)]) queries.push_back(i);
  if (max_queries > 0 && static_cast<int>(queries.size()) > max_queries) {
    std::vector<int> sampled;
    const double stride = static_cast<double>(queries.size()) / max_queries;
    for (int s = 0; s < max_queries; ++s) sampled.push_back(queries[static_cast<size_t>(s * stride)]);
    queries.swap(sampled);
  }

  ImageStats stats;
  stats.queries = static_cast<int>(queries.size());
  stats.layers.assign(static_cast<size_t>(layers), std::vector<HeadStats>(static_cast<size_t>(heads)));
  std::vector<float> row(static_cast<size_t>(result.tokens));
  const float total_steps = static_cast<float>(layers * heads);
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      double entropy_sum = 0.0, distance_sum = 0.0;
      int distance_rows = 0;
      for (const int qi : queries) {
        attention_row(model, result, l, h, prefix + qi, row.data());
        double entropy = 0.0, distance = 0.0, patch_mass = 0.0;
        for (int j = 0; j < result.tokens; ++j) {
          const double w = row[static_cast<size_t>(j)];
          if (w > 0.0) entropy -= w * std::log(w);
        }
        const int qr = qi / gw, qc = qi % gw;
        for (int kj = 0; kj < patches; ++kj) {
          const double w = row[static_cast<size_t>(prefix + kj)];
          if (w <= 0.0) continue;
          const float dr = static_cast<float>(kj / gw - qr), dc = static_cast<float>(kj % gw - qc);
          distance += w * static_cast<double>(p * std::sqrt(dr * dr + dc * dc));
          patch_mass += w;
        }
        entropy_sum += entropy;
        if (patch_mass > 0.0) {
          distance_sum += distance / patch_mass;
          ++distance_rows;
        }
      }
      HeadStats& s = stats.layers[static_cast<size_t>(l)][static_cast<size_t>(h)];
      s.entropy = queries.empty() ? 0.0 : entropy_sum / static_cast<double>(queries.size());
      s.mean_distance = distance_rows == 0 ? 0.0 : distance_sum / distance_rows;
      if (progress && !progress(static_cast<float>(l * heads + h + 1) / total_steps)) throw Error("cancelled");
    }
  }
  return stats;
}

// [SECTION] Working grid

GridPrediction predict_grid(int source_w, int source_h, const VitConfig& config, int max_side) {
  // The size policy of prepare_image (core/io/image.cpp), without touching pixels.
  GridPrediction g;
  g.content_w = source_w;
  g.content_h = source_h;
  const bool model_size = source_h == config.img_h && source_w == config.img_w;
  const int long_side = std::max(source_w, source_h);
  if (!model_size && max_side > 0 && long_side > max_side) {
    const double f = static_cast<double>(max_side) / long_side;
    g.content_w = std::max(1, static_cast<int>(std::lround(source_w * f)));
    g.content_h = std::max(1, static_cast<int>(std::lround(source_h * f)));
    g.resized = true;
  }
  const int p = config.patch_size;
  g.grid_w = (g.content_w + p - 1) / p;
  g.grid_h = (g.content_h + p - 1) / p;
  g.tokens = config.prefix_tokens() + g.grid_w * g.grid_h;
  return g;
}

// [SECTION] Inspector

InspectorStep inspect_pair(const VitModel& model, const ForwardResult& result, const PatchGrid& grid, int layer,
                           int query_token, int key_token) {
  const VitConfig& cfg = model.config;
  if (layer < 0 || layer >= static_cast<int>(result.layers.size())) throw Error("inspector: layer out of range");
  if (query_token < 0 || query_token >= result.tokens || key_token < 0 || key_token >= result.tokens)
    throw Error("inspector: token out of range");
  const int dim = cfg.embed_dim, hd = cfg.head_dim();
  InspectorStep step;
  step.layer = layer;
  step.query_token = query_token;
  step.key_token = key_token;
  step.score_scale = result.score_scale;
  step.key_allowed = result.mask.allows(query_token, key_token);
  auto patch_values = [&](int token) {
    std::vector<float> values;
    const int patch = token - result.prefix;
    if (patch >= 0 && patch < grid.patches.rows())
      values.assign(grid.patches.row(patch).data(), grid.patches.row(patch).data() + grid.patches.cols());
    return values;
  };
  step.query_patch = patch_values(query_token);
  step.key_patch = patch_values(key_token);

  // qkv = (N, 3D) columns [Q heads | K heads | V heads], each head d wide (timm's reshape order).
  const MatRM& qkv = result.layers[static_cast<size_t>(layer)].qkv;
  std::vector<float> row(static_cast<size_t>(result.tokens));
  for (int h = 0; h < cfg.num_heads; ++h) {
    HeadStep s;
    const float* q = qkv.row(query_token).data() + h * hd;
    const float* k = qkv.row(key_token).data() + dim + h * hd;
    const float* v = qkv.row(key_token).data() + 2 * dim + h * hd;
    s.q.assign(q, q + hd);
    s.k.assign(k, k + hd);
    s.v.assign(v, v + hd);
    for (int c = 0; c < hd; ++c) s.dot += q[c] * k[c];
    s.scaled = s.dot * result.score_scale;
    attention_row(model, result, layer, h, query_token, row.data());
    s.weight = row[static_cast<size_t>(key_token)];
    s.max_weight = *std::max_element(row.begin(), row.end());
    s.contribution.resize(static_cast<size_t>(hd));
    for (int c = 0; c < hd; ++c) s.contribution[static_cast<size_t>(c)] = s.weight * v[c];
    // output = attn @ v for this query: (1, N) x (N, d)
    s.output.assign(static_cast<size_t>(hd), 0.0f);
    for (int j = 0; j < result.tokens; ++j) {
      const float w = row[static_cast<size_t>(j)];
      if (w == 0.0f) continue;
      const float* vj = qkv.row(j).data() + 2 * dim + h * hd;
      for (int c = 0; c < hd; ++c) s.output[static_cast<size_t>(c)] += w * vj[c];
    }
    step.heads.push_back(std::move(s));
  }
  return step;
}

}  // namespace vitlens::viewer
