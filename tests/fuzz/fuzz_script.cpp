// libFuzzer harness: the viewer's script parser (`vitlens view --script FILE`,
// app/viewer/control/script.cpp parse_script), which checks every line before a window opens.
// Any input may be refused with vitlens::Error; anything else is a finding. README "Fuzzing".
#include <cstddef>
#include <cstdint>
#include <string>

#include "control/script.hpp"
#include "core/base/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)vitlens::viewer::parse_script(text, "fuzz-input");
  } catch (const vitlens::Error&) {
    // a malformed line: refused with "<what>:<line>: <reason>", which is fine
  }
  return 0;
}
