#pragma once
// One exception type for every user-facing failure. Its message is a single line that names what
// failed (file, tensor, key or flag) and, where it helps, what the user can do about it.
#include <stdexcept>
#include <string>

namespace vitlens {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace vitlens
