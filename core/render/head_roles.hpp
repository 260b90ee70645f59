#pragma once
// A head's role as a number, for any model on any image. Each role is an affinity
// between two patches computed from the image alone, with no model:
//   edge      same local gradient orientation   (structure tensor, doubled angle: no polarity)
//   texture   same local texture statistics      (log energies of luminance differences)
//   colour    same mean colour                   (mean RGB)
//   position  spatial proximity                  (distance between patch centres)
// A head's score for a role is the lift: how much more of its attention mass goes to the query's
// high-affinity keys than uniform attention would give, averaged over queries. 1 = no preference
// (uniform attention scores 1 on every role), 1 / top_fraction = all mass on high-affinity keys.
//
// Exactly, for one query patch i (README.md "Head roles" says the same):
//   keys K_i  = the patches j != i that are not padding and that the forward's mask lets i see;
//               n = |K_i|, m_j = the head's attention weight on j, T = sum over K_i of m_j
//               (the class token and i itself are left out; a query with n < 2 or T = 0 is skipped)
//   a_ij      = the role's affinity (below), larger = more alike
//   members   = the top k = top_fraction * n keys by a_ij; where ties straddle the k-th place,
//               every tied key gets the same fractional membership, so memberships sum to k exactly
//               (an image where all keys tie gives lift 1 for any attention)
//   lift_i    = (sum_j membership_j m_j / T) / (k / n)
// and the head's score is the mean of lift_i over the queries: every non-padding patch, or
// max_queries of them evenly strided in raster order when there are more.
//
// Descriptors, from the processed pixels the forward saw (un-normalised to RGB in [0, 1]);
// Y = (R + G + B) / 3 per pixel, the patch is P x P:
//   edge      on each 2x2 pixel cell gx = ((Y01 - Y00) + (Y11 - Y10)) / 2, gy likewise down;
//             J = mean over cells of (gx^2, gy^2, gx gy);
//             o = (Jxx - Jyy, 2 Jxy) / (Jxx + Jyy + 1e-4)      a_ij = o_i . o_j
//             (orientation as a doubled angle, weighted by coherence and contrast: a flat or
//             isotropic patch has o ~ 0; 1e-4 = a gradient of 0.01 per pixel)
//   texture   e(d, s) = mean over pixel pairs inside the patch of (Y(p + s d) - Y(p))^2 for
//             directions d = (1,0), (0,1), (1,1), (1,-1) and lags s = 1, 2 (lag 2 when P >= 3);
//             t = log(1e-4 + e)                               a_ij = -|t_i - t_j|^2
//   colour    c = mean RGB of the patch                        a_ij = -|c_i - c_j|^2
//   position  (row, col) of the patch                          a_ij = -(dr^2 + dc^2)
//
// Cost: per query O(n) for the memberships, plus one attention_row per layer and head; the N x N
// matrix is never built.
#include <array>
#include <functional>
#include <vector>

#include "core/model/vit.hpp"

namespace vitlens {

enum HeadRole : int { kRoleEdge = 0, kRoleTexture = 1, kRoleColour = 2, kRolePosition = 3 };
constexpr int kHeadRoles = 4;
const char* head_role_name(int role);  // "edge", "texture", "colour", "position"

struct HeadRoleOptions {
  double top_fraction = 0.1;  // q: the share of keys that count as high-affinity, in (0, 1]
  int max_queries = 256;      // <= 0: every non-padding patch
  int layer = -1;             // -1: every layer; else only this one (the others' lists stay empty)
};

using RoleLifts = std::array<double, kHeadRoles>;  // indexed by HeadRole

struct HeadRoleScores {
  std::vector<std::vector<RoleLifts>> lift;  // (L, H, roles); 0 for a head whose rows were all zero
  int queries = 0;                           // query patches averaged over
  double top_fraction = 0.1;
};

// Per-patch affinities' inputs, exposed for tests (one row per patch, raster order).
struct PatchDescriptors {
  std::vector<std::array<double, 2>> orientation;  // (gh*gw) o
  std::vector<std::array<double, 8>> texture;      // (gh*gw) t
  std::vector<std::array<double, 3>> colour;       // (gh*gw) mean RGB in [0, 1]
};
PatchDescriptors patch_descriptors(const VitConfig& config, const PatchGrid& grid);

// Every layer's and head's lift per role, for the image `grid` and its forward pass `result`
// (made from the same grid). Throws vitlens::Error when they do not match, on a bad option, or
// when `progress` (may be empty; gets [0, 1]) returns false ("cancelled"). Deterministic: the same
// inputs give the same numbers (the viewer's export and the CLI's agree byte for byte).
// For a training curve, call it every few steps on a fixed image and plot lift[l][h][role].
HeadRoleScores head_role_scores(const VitModel& model, const PatchGrid& grid, const ForwardResult& result,
                                const HeadRoleOptions& options = {},
                                const std::function<bool(float)>& progress = {});

}  // namespace vitlens
