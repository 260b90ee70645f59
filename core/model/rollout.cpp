// Attention rollout over the stored (N, N) weights of every layer (see rollout.hpp).
#include "core/model/rollout.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/base/error.hpp"

namespace vitlens {

const char* head_fusion_name(HeadFusion fusion) { return enum_name(kHeadFusionNames, fusion); }
bool parse_head_fusion(const std::string& name, HeadFusion& fusion) { return parse_enum(kHeadFusionNames, name, fusion); }

MatRM attention_rollout(const ForwardResult& result, const RolloutOptions& options) {
  const int layers = static_cast<int>(result.layers.size()), n = result.tokens;
  const int last = options.last_layer < 0 ? layers - 1 : options.last_layer;
  if (options.first_layer < 0 || options.first_layer > last || last >= layers)
    throw Error("rollout layers " + std::to_string(options.first_layer) + " to " + std::to_string(last) +
                " are out of range: the model has " + std::to_string(layers) + " layer(s)");
  if (!(options.discard_ratio >= 0.0f && options.discard_ratio < 1.0f))
    throw Error("rollout discard ratio must be in [0, 1)");
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  // vit-explain: int(flat.size(-1) * discard_ratio) lowest entries, computed in double as Python.
  const auto discard = static_cast<size_t>(static_cast<double>(cells) * static_cast<double>(options.discard_ratio));

  MatRM rollout = MatRM::Identity(n, n);
  MatRM fused(n, n), step(n, n);
  std::vector<size_t> order(cells);
  for (int l = options.first_layer; l <= last; ++l) {
    const std::vector<MatRM>& probs = result.layers[static_cast<size_t>(l)].probs;
    if (probs.empty())
      throw Error("rollout needs every layer's full attention weights (a forward pass with keep_probs)");
    // fused = attention.mean / max / min over heads
    fused = probs[0];
    for (size_t h = 1; h < probs.size(); ++h) {
      switch (options.fusion) {
        case HeadFusion::Mean: fused += probs[h]; break;
        case HeadFusion::Max: fused = fused.cwiseMax(probs[h]); break;
        case HeadFusion::Min: fused = fused.cwiseMin(probs[h]); break;
      }
    }
    if (options.fusion == HeadFusion::Mean) fused /= static_cast<float>(probs.size());
    // The `discard` lowest entries of the flattened matrix go to 0, except flat index 0 (the
    // class token attending to itself), as vit-explain's `indices[indices != 0]`. Ties are broken
    // by index so the result does not depend on the sort.
    if (discard > 0) {
      std::iota(order.begin(), order.end(), size_t{0});
      const float* f = fused.data();
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(discard - 1), order.end(),
                       [f](size_t a, size_t b) { return f[a] < f[b] || (f[a] == f[b] && a < b); });
      for (size_t i = 0; i < discard; ++i)
        if (order[i] != 0 || !result.has_class_token) fused.data()[order[i]] = 0.0f;
    }
    // a = (fused + I) / 2, rows renormalised; rollout = a @ rollout
    step = fused + MatRM::Identity(n, n);
    for (int i = 0; i < n; ++i) step.row(i) /= step.row(i).sum();
    if (l == options.first_layer) {
      rollout = step;  // step @ identity: skipping the product keeps a one-layer rollout O(N^2)
    } else {
      const MatRM next = step * rollout;
      rollout = next;
    }
  }
  return rollout;
}

MatRM rollout_map(const MatRM& rollout, const ForwardResult& result, int query_token) {
  if (query_token < 0 || query_token >= result.tokens)
    throw Error("rollout query token " + std::to_string(query_token) + " is out of range [0, " +
                std::to_string(result.tokens) + ")");
  if (rollout.rows() != result.tokens || rollout.cols() != result.tokens)
    throw Error("rollout matrix does not match the forward pass");
  return Eigen::Map<const MatRM>(rollout.row(query_token).data() + result.prefix, result.grid_h, result.grid_w);
}

}  // namespace vitlens
