// Head-role lifts (see head_roles.hpp for the exact definition).
#include "core/render/head_roles.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "core/base/error.hpp"

namespace vitlens {

const char* head_role_name(int role) {
  switch (role) {
    case kRoleEdge: return "edge";
    case kRoleTexture: return "texture";
    case kRoleColour: return "colour";
    case kRolePosition: return "position";
  }
  return "?";
}

namespace {

constexpr double kOrientationFloor = 1e-4;  // (0.01 per pixel)^2: below this a patch has no orientation
constexpr double kTextureFloor = 1e-4;      // log(1e-4 + e): flat patches all get the same t

}  // namespace

PatchDescriptors patch_descriptors(const VitConfig& config, const PatchGrid& grid) {
  const int p = config.patch_size, area = p * p;
  const Eigen::Index patches = grid.patches.rows();
  if (grid.patches.cols() != 3 * area)
    throw Error("head roles: the patch grid has " + std::to_string(grid.patches.cols()) + " values per patch, the model " +
                std::to_string(3 * area));
  PatchDescriptors d;
  d.orientation.resize(static_cast<size_t>(patches));
  d.texture.resize(static_cast<size_t>(patches));
  d.colour.resize(static_cast<size_t>(patches));
  std::vector<double> lum(static_cast<size_t>(area));  // (P, P) luminance in [0, 1]
  // Texture: 4 directions (dy, dx) at lags 1 and 2.
  const int directions[4][2] = {{0, 1}, {1, 0}, {1, 1}, {1, -1}};
  for (Eigen::Index i = 0; i < patches; ++i) {
    const float* v = grid.patches.row(i).data();  // (3, P, P) normalised, channel-major
    std::array<double, 3>& colour = d.colour[static_cast<size_t>(i)];
    std::fill(lum.begin(), lum.end(), 0.0);
    for (int c = 0; c < 3; ++c) {
      double sum = 0.0;
      for (int e = 0; e < area; ++e) {
        // Undo (x - mean) / std: the affinities are about the pixels, not the model's units.
        const double x = static_cast<double>(v[c * area + e]) * config.std[static_cast<size_t>(c)] +
                         config.mean[static_cast<size_t>(c)];
        sum += x;
        lum[static_cast<size_t>(e)] += x / 3.0;
      }
      colour[static_cast<size_t>(c)] = sum / area;
    }
    const auto Y = [&](int y, int x) { return lum[static_cast<size_t>(y * p + x)]; };

    double jxx = 0.0, jyy = 0.0, jxy = 0.0;
    int cells = 0;
    for (int y = 0; y + 1 < p; ++y)
      for (int x = 0; x + 1 < p; ++x) {
        const double gx = 0.5 * ((Y(y, x + 1) - Y(y, x)) + (Y(y + 1, x + 1) - Y(y + 1, x)));
        const double gy = 0.5 * ((Y(y + 1, x) - Y(y, x)) + (Y(y + 1, x + 1) - Y(y, x + 1)));
        jxx += gx * gx;
        jyy += gy * gy;
        jxy += gx * gy;
        ++cells;
      }
    if (cells > 0) {
      jxx /= cells;
      jyy /= cells;
      jxy /= cells;
    }
    const double denominator = jxx + jyy + kOrientationFloor;
    d.orientation[static_cast<size_t>(i)] = {(jxx - jyy) / denominator, 2.0 * jxy / denominator};

    std::array<double, 8>& t = d.texture[static_cast<size_t>(i)];
    for (int lag = 1; lag <= 2; ++lag)
      for (int k = 0; k < 4; ++k) {
        const int dy = directions[k][0] * lag, dx = directions[k][1] * lag;
        double sum = 0.0;
        int pairs = 0;
        for (int y = 0; y + dy < p; ++y)
          for (int x = std::max(0, -dx); x < p && x + dx < p; ++x) {
            const double diff = Y(y + dy, x + dx) - Y(y, x);
            sum += diff * diff;
            ++pairs;
          }
        t[static_cast<size_t>((lag - 1) * 4 + k)] = std::log(kTextureFloor + (pairs > 0 ? sum / pairs : 0.0));
      }
  }
  return d;
}

namespace {

// Fractional top-k membership (see the header): members[j] in [0, 1], summing to k = fraction * n.
// scratch is reused between calls.
void top_fraction_membership(const std::vector<double>& affinity, double fraction, std::vector<double>& scratch,
                             std::vector<double>& members) {
  const size_t n = affinity.size();
  const double k = fraction * static_cast<double>(n);
  // rank = ceil(k) (at least 1): tau is the affinity at that place in descending order.
  const size_t rank = std::min(n, std::max<size_t>(1, static_cast<size_t>(std::ceil(k - 1e-9))));
  scratch = affinity;
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(rank - 1), scratch.end(),
                   std::greater<double>());
  const double tau = scratch[rank - 1];
  size_t greater = 0, equal = 0;
  for (const double a : affinity) {
    greater += a > tau;
    equal += a == tau;
  }
  const double tied_share = (k - static_cast<double>(greater)) / static_cast<double>(equal);
  members.resize(n);
  for (size_t j = 0; j < n; ++j) members[j] = affinity[j] > tau ? 1.0 : affinity[j] == tau ? tied_share : 0.0;
}

// The affinity of patch `key` to the query patch `qi` under `role` (larger = more alike); gw is
// the grid's width.
double role_affinity(const PatchDescriptors& d, int role, int qi, int key, int gw) {
  const size_t i = static_cast<size_t>(qi), j = static_cast<size_t>(key);
  double a = 0.0;
  switch (role) {
    case kRoleEdge:
      a = d.orientation[i][0] * d.orientation[j][0] + d.orientation[i][1] * d.orientation[j][1];
      break;
    case kRoleTexture:
      for (size_t c = 0; c < 8; ++c) a -= (d.texture[i][c] - d.texture[j][c]) * (d.texture[i][c] - d.texture[j][c]);
      break;
    case kRoleColour:
      for (size_t c = 0; c < 3; ++c) a -= (d.colour[i][c] - d.colour[j][c]) * (d.colour[i][c] - d.colour[j][c]);
      break;
    default: {  // integer squared distance: exact, so equal distances tie exactly
      const int dr = key / gw - qi / gw, dc = key % gw - qi % gw;
      a = -static_cast<double>(dr * dr + dc * dc);
    }
  }
  return a;
}

// The query patches: every patch that is not padding, evenly strided in raster order down to
// max_queries when there are more (max_queries <= 0: all of them).
std::vector<int> sampled_queries(const PatchGrid& grid, int max_queries) {
  std::vector<int> queries;
  const int patches = grid.grid_h * grid.grid_w;
  for (int i = 0; i < patches; ++i)
    if (grid.patch_is_padding.empty() || grid.patch_is_padding[static_cast<size_t>(i)] == 0) queries.push_back(i);
  if (max_queries > 0 && static_cast<int>(queries.size()) > max_queries) {
    std::vector<int> sampled;
    const double stride = static_cast<double>(queries.size()) / max_queries;
    for (int s = 0; s < max_queries; ++s) sampled.push_back(queries[static_cast<size_t>(s * stride)]);
    queries.swap(sampled);
  }
  return queries;
}

}  // namespace

HeadRoleScores head_role_scores(const VitModel& model, const PatchGrid& grid, const ForwardResult& result,
                                const HeadRoleOptions& options, const std::function<bool(float)>& progress) {
  if (!(options.top_fraction > 0.0 && options.top_fraction <= 1.0))
    throw Error("head roles: top_fraction must be in (0, 1], got " + std::to_string(options.top_fraction));
  const int gw = grid.grid_w, patches = grid.grid_h * grid.grid_w, prefix = result.prefix;
  if (result.grid_h != grid.grid_h || result.grid_w != grid.grid_w || grid.patches.rows() != patches ||
      result.tokens != prefix + patches)
    throw Error("head roles: the forward result was not made from this patch grid");
  const PatchDescriptors d = patch_descriptors(model.config, grid);
  const auto padding = [&](int i) {
    return !grid.patch_is_padding.empty() && grid.patch_is_padding[static_cast<size_t>(i)] != 0;
  };

  const std::vector<int> queries = sampled_queries(grid, options.max_queries);

  const int layers = static_cast<int>(result.layers.size()), heads = model.config.num_heads;
  if (options.layer < -1 || options.layer >= layers)
    throw Error("head roles: no layer " + std::to_string(options.layer) + " (the model has " + std::to_string(layers) + ")");
  const int first_layer = options.layer < 0 ? 0 : options.layer, end_layer = options.layer < 0 ? layers : options.layer + 1;
  HeadRoleScores out;
  out.top_fraction = options.top_fraction;
  out.lift.resize(static_cast<size_t>(layers));
  for (int l = first_layer; l < end_layer; ++l) out.lift[static_cast<size_t>(l)].assign(static_cast<size_t>(heads), RoleLifts{});
  std::vector<int> counted(static_cast<size_t>(layers * heads), 0);        // queries with T > 0 per head

  std::vector<int> keys;                                // (n) patch indices of K_i
  std::vector<double> affinity, scratch;                // (n)
  std::array<std::vector<double>, kHeadRoles> members;  // (roles, n)
  std::vector<float> row(static_cast<size_t>(result.tokens));  // (N)
  int done = 0;
  for (const int qi : queries) {
    keys.clear();
    for (int j = 0; j < patches; ++j)
      if (j != qi && !padding(j) && result.mask.allows(prefix + qi, prefix + j)) keys.push_back(j);
    const size_t n = keys.size();
    if (n >= 2) {
      for (int role = 0; role < kHeadRoles; ++role) {
        affinity.resize(n);
        for (size_t e = 0; e < n; ++e) affinity[e] = role_affinity(d, role, qi, keys[e], gw);
        top_fraction_membership(affinity, options.top_fraction, scratch, members[static_cast<size_t>(role)]);
      }
      const double uniform_share = options.top_fraction;  // k / n
      for (int l = first_layer; l < end_layer; ++l)
        for (int h = 0; h < heads; ++h) {
          attention_row(model, result, l, h, prefix + qi, row.data());
          double total = 0.0;
          for (const int j : keys) total += row[static_cast<size_t>(prefix + j)];
          if (!(total > 0.0)) continue;
          RoleLifts& lift = out.lift[static_cast<size_t>(l)][static_cast<size_t>(h)];
          for (int role = 0; role < kHeadRoles; ++role) {
            const std::vector<double>& mu = members[static_cast<size_t>(role)];
            double mass = 0.0;
            for (size_t e = 0; e < n; ++e) mass += mu[e] * row[static_cast<size_t>(prefix + keys[e])];
            lift[static_cast<size_t>(role)] += mass / total / uniform_share;
          }
          ++counted[static_cast<size_t>(l * heads + h)];
        }
    }
    ++done;
    if (progress && !progress(static_cast<float>(done) / static_cast<float>(queries.size()))) throw Error("cancelled");
  }
  int most = 0;
  for (int l = first_layer; l < end_layer; ++l)
    for (int h = 0; h < heads; ++h) {
      const int c = counted[static_cast<size_t>(l * heads + h)];
      most = std::max(most, c);
      for (double& v : out.lift[static_cast<size_t>(l)][static_cast<size_t>(h)]) v = c > 0 ? v / c : 0.0;
    }
  out.queries = most;
  return out;
}

}  // namespace vitlens
