#pragma once
// Which keys a query may attend to: the input both the reference attention (core/model) and the
// fast kernels (core/cpu) take, so it lives below both.
#include <cstdint>
#include <vector>

namespace vitlens {

// Applied before the softmax; a query whose keys are all masked gets an all-zero row of weights
// (and so a zero output), never NaN.
struct KeyMask {
  bool causal = false;               // token i attends to j <= i (raster order, class token first)
  std::vector<uint8_t> key_allowed;  // (N) 1 = may be attended to; empty = every key allowed

  bool empty() const { return !causal && key_allowed.empty(); }
  bool allows(int query, int key) const {
    if (causal && key > query) return false;
    return key_allowed.empty() || key_allowed[static_cast<size_t>(key)] != 0;
  }
};

}  // namespace vitlens
