// The objectives a checkpoint may name: one line per objective.
#include "core/train/objective.hpp"

#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"

namespace vitlens {

const ObjectiveKind* find_objective_kind(const std::string& name) {
  static const ObjectiveKind* const kKinds[] = {&kClassifyKind, &kMaeKind};
  for (const ObjectiveKind* kind : kKinds)
    if (name == kind->name) return kind;
  return nullptr;
}

}  // namespace vitlens
