#pragma once
// What every objective holding one net (a VitNet, an MaeNet) and its recipe answers the same way.
#include <utility>
#include <vector>

#include "core/train/objective.hpp"
#include "core/train/trainer.hpp"

namespace vitlens {

template <class Net>
class NetObjective : public Objective {
 public:
  const VitConfig& config() const override { return net_.config(); }
  const Recipe& recipe() const override { return recipe_; }
  const train::ParamLayout& layout() const override { return net_.layout(); }
  std::vector<float>& params() override { return net_.params; }
  const std::vector<float>& params() const override { return net_.params; }
  std::vector<float>& grads() override { return net_.grads; }
  const std::vector<float>& grads() const override { return net_.grads; }
  const Net& net() const { return net_; }

 protected:
  // The net is made from `net_args` (whose evaluation may first refuse a run too big for memory).
  template <class... NetArgs>
  explicit NetObjective(const Recipe& recipe, NetArgs&&... net_args)
      : net_(std::forward<NetArgs>(net_args)...), recipe_(recipe) {}

  Net net_;
  Recipe recipe_;
};

}  // namespace vitlens
