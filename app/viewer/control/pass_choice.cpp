// The preprocessing and precision switches (see controller.hpp): what `vitlens export
// --preprocess` and `--precision` choose, set from the Controls window and the script, and the
// words that say what the pass on screen ran. The decisions are core's (make_forward_key asks
// resolve_precision; the transform is read by models/model_transform.hpp when the model loads).
#include <cstdio>

#include "control/controller.hpp"
#include "core/cpu/bf16.hpp"
#include "core/cpu/cpu.hpp"

namespace vitlens::viewer {

// [SECTION] Actions

std::string preprocess_unavailable(const App& app) {
  if (!app.doc.model) return "no model is loaded";
  const LoadedModel& m = *app.doc.model;
  if (m.transform.present()) return "";
  return "model '" + m.model.config.name + "' " + m.no_transform;
}

std::string set_preprocess(App& app, Preprocess preprocess) {
  if (preprocess == Preprocess::Model)
    if (std::string why = preprocess_unavailable(app); !why.empty()) return why;
  app.ui.compute.preprocess = preprocess;
  return "";
}

void set_precision(App& app, Precision precision) { app.ui.compute.precision = precision; }

// [SECTION] In words

std::string preprocess_caption(const App& app) {
  if (!app.doc.ready() || app.doc.comp->key.preprocess != Preprocess::Model) return "";
  const ImageTransform& t = app.doc.model->transform;
  return t.library + ": " + t.describe();
}

namespace {

// "86.6 M", "31 k": a parameter count at a glance.
std::string parameters_text(int64_t n) {
  char text[32];
  if (n >= 1000000) std::snprintf(text, sizeof text, "%.1f M", static_cast<double>(n) / 1e6);
  else std::snprintf(text, sizeof text, "%.0f k", static_cast<double>(n) / 1e3);
  return text;
}

// Why bfloat16 products are not in hardware here, or "" when they are.
std::string bf16_emulation_reason() {
  if (cpu_has_bf16_dot()) return "";
  if (cpu_features().avx512_bf16)
    return std::string("the kernels chosen (") + kernel_isa_id(kernel_isa()) + ", VITLENS_ISA) do not use AVX512-BF16";
  return "this CPU has no AVX512-BF16";
}

// Auto's choice for the model on screen, with the reason core's rule gives (vit.hpp Precision).
std::string auto_line(const App& app, Precision resolved) {
  const int64_t n = app.doc.model->model.parameter_count();
  const std::string params = parameters_text(n) + " parameters";
  const std::string min = parameters_text(kAutoBf16MinParameters);
  if (resolved == Precision::Bf16) return "auto chose bf16: " + params + " and bfloat16 dot products in hardware";
  if (n < kAutoBf16MinParameters) return "auto chose fp32: " + params + ", below " + min;
  return "auto chose fp32: " + bf16_emulation_reason() + ", so bf16 would be slower";
}

}  // namespace

std::vector<std::string> precision_lines(const App& app) {
  std::vector<std::string> lines;
  const Precision chosen = app.ui.compute.precision;
  Precision ran = Precision::Fp32;
  if (app.doc.ready()) {
    ran = app.doc.comp->forward.precision;
    if (chosen == Precision::Auto) lines.push_back(auto_line(app, ran));
    else if (chosen != ran)  // the chosen pass is still running
      lines.push_back(std::string("on screen: the ") + precision_name(ran) + " pass");
  }
  const std::string emulated = bf16_emulation_reason();
  if ((chosen == Precision::Bf16 || ran == Precision::Bf16) && !emulated.empty()) {
    if (bf16_kernel() == Bf16Kernel::Avx2)
      lines.push_back("bf16 runs on float32 FMAs here: " + emulated + " (AVX512-BF16's bits, a little slower than fp32)");
    else lines.push_back("bf16 is emulated here: " + emulated + " (AVX512-BF16's bits, many times slower than fp32)");
  }
  return lines;
}

}  // namespace vitlens::viewer
