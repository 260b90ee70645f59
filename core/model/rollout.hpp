#pragma once
// Attention rollout (Abnar and Zuidema 2020, "Quantifying Attention Flow in Transformers"), the
// variant people use from vit-explain (jacobgil/vit-explain, vit_rollout.py): per layer the heads
// are fused (mean, max or min), the lowest `discard_ratio` of the fused weights are set to zero
// except the class token's own entry, the identity is added (the residual path), each row is
// renormalised to sum 1, and the layers are multiplied: R = A_L ... A_1. Row q of R says how much
// of each input token reaches token q's output; the class token's row is the usual rollout map.
// Unlike vit-explain, rows are renormalised by their own sums (its `a / a.sum(dim=-1)` divides
// column j by row j's sum through broadcasting).
#include <string>

#include "core/base/enum_names.hpp"
#include "core/model/vit.hpp"

namespace vitlens {

enum class HeadFusion { Mean, Max, Min };
inline constexpr EnumName<HeadFusion> kHeadFusionNames[] = {
    {HeadFusion::Mean, "mean"}, {HeadFusion::Max, "max"}, {HeadFusion::Min, "min"}};
const char* head_fusion_name(HeadFusion fusion);  // "mean", "max", "min"
bool parse_head_fusion(const std::string& name, HeadFusion& fusion);

struct RolloutOptions {
  HeadFusion fusion = HeadFusion::Mean;
  float discard_ratio = 0.0f;  // in [0, 1): this fraction of the lowest fused weights set to 0
  int first_layer = 0;         // layers [first_layer, last_layer] are multiplied
  int last_layer = -1;         // -1 = the last layer
};

// (N, N) rollout from a forward pass run with keep_probs. Throws vitlens::Error on a result
// without the full weights, a layer range out of bounds or a ratio outside [0, 1).
MatRM attention_rollout(const ForwardResult& result, const RolloutOptions& options);

// The (gh, gw) patch map of rollout row `query_token` (the patch keys; prefix tokens left out).
MatRM rollout_map(const MatRM& rollout, const ForwardResult& result, int query_token);

}  // namespace vitlens
