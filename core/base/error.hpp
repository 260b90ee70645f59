#pragma once
// One exception type for every user-facing failure. Its message is a single line that names what
// failed (file, tensor, key or flag) and, where it helps, what the user can do about it.
#include <cstdio>
#include <stdexcept>
#include <string>

namespace vitlens {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A number as a message shows it: 0.001, 1e-09, nan, inf (a JSON dump would say null for the last two).
inline std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

}  // namespace vitlens
