// `vitlens info`: what a model file holds.
#include <algorithm>
#include <cstdio>

#include "cli.hpp"
#include "core/model/classifier.hpp"
#include "models/bundled_models.hpp"
#include "models/model_io.hpp"

namespace vitlens::cli {

void add_info_command(CLI::App& app, InfoArgs& args) {
  CLI::App* cmd = app.add_subcommand("info", "Print a model's configuration, parameter count and head descriptions");
  cmd->add_option("--model,-m", args.model, kModelOptionHelp);
  add_heads_option(cmd, args.heads);
}

void add_heads_option(CLI::App* cmd, int& heads) {
  cmd->add_option("--heads", heads,
                  "Attention heads of a timm checkpoint without config.json (the tensors do not say it); "
                  "a model whose file or config.json gives its heads must agree, or it is an error")
      ->check(CLI::Range(1, 8192));
}

int run_info(const InfoArgs& args) {
  const std::string path = resolve_model(args.model);
  LoadOptions load;
  load.heads = args.heads;
  const VitModel model = load_model(path, load);
  const VitConfig& c = model.config;
  // Names, descriptions and notes come from the file: printed with control characters escaped.
  std::printf("model:        %s\n", terminal_text(c.name).c_str());
  std::printf("file:         %s\n", terminal_text(path).c_str());
  std::printf("layout:       %s\n", model.format.c_str());
  std::printf("description:  %s\n", terminal_text(c.description).c_str());
  std::printf("patch size:   %d (a patch is %d values)\n", c.patch_size, c.patch_values());
  std::printf("embed dim:    %d\n", c.embed_dim);
  std::printf("heads:        %d of %d dims\n", c.num_heads, c.head_dim());
  std::printf("depth:        %d\n", c.depth);
  std::printf("image size:   %dx%d (grid %dx%d, %d tokens)\n", c.img_w, c.img_h, c.grid_w(), c.grid_h(), c.tokens());
  std::printf("class token:  %s\n", c.class_token ? "yes" : "no");
  if (c.dist_token) std::printf("distillation: yes (token %d)\n", c.dist_index());
  if (c.register_tokens)
    std::printf("registers:    %d (tokens %d to %d)\n", c.register_tokens, c.first_register(), c.first_register() + c.register_tokens - 1);
  std::printf("pos embed:    %s\n", !c.pos_embed                                    ? "none (rotary positions only)"
                                   : c.pos_embed_prefix || c.prefix_tokens() == 0 ? "every token"
                                                                                  : "patches only (no_embed_class)");
  if (c.rope != Rope::None)
    std::printf("rope:         %s, temperature %g, %s pairs%s, patch tokens only\n", rope_name(c.rope),
                static_cast<double>(c.rope_temperature), c.rope_rotate_half ? "rotate-half" : "interleaved",
                c.rope_ref_h > 0 ? (", reference grid " + std::to_string(c.rope_ref_h) + "x" + std::to_string(c.rope_ref_w)).c_str()
                                 : "");
  std::printf("qkv bias:     %s\n", c.qkv_bias ? "yes" : "no");
  std::printf("mlp:          ratio %g (%d hidden), %s%s\n", c.mlp_ratio, c.mlp_hidden(),
              c.swiglu ? "SwiGLU (silu(gate) * value)" : activation_name(c.act), c.mlp_norm ? ", norm before fc2" : "");
  std::printf("norms:        %s%s%s%s%s\n", c.rms_norm ? "RMSNorm, " : "", c.attn_out_norm ? "attention output norm, " : "", c.pre_norm ? "pre-norm before the blocks, " : "", c.layer_scale ? "LayerScale, " : "",
              c.final_norm ? "final norm over the tokens" : "no final norm over the tokens (pooled-only norm)");
  if (c.attention_pool)
    std::printf("pool:         attention pool after the blocks (its latent query over the patch tokens: export --pool)\n");
  std::printf("norm eps:     %g\n", static_cast<double>(c.norm_eps));
  std::printf("mean / std:   [%g, %g, %g] / [%g, %g, %g]\n", static_cast<double>(c.mean[0]), static_cast<double>(c.mean[1]),
              static_cast<double>(c.mean[2]), static_cast<double>(c.std[0]), static_cast<double>(c.std[1]),
              static_cast<double>(c.std[2]));
  std::printf("classifier:   %s\n", terminal_text(classifier_summary(model)).c_str());
  if (!model.class_names.empty()) {
    // The first few names, so a reader sees what the head was trained to tell apart.
    std::string names;
    const size_t shown = std::min<size_t>(model.class_names.size(), 5);
    for (size_t k = 0; k < shown; ++k) names += (k ? ", " : "") + std::to_string(k) + " '" + model.class_names[k] + "'";
    if (shown < model.class_names.size()) names += ", ... " + std::to_string(model.class_names.size() - 1) + " '" + model.class_names.back() + "'";
    std::printf("class names:  %s\n", terminal_text(names).c_str());
  }
  std::printf("parameters:   %lld\n", static_cast<long long>(model.parameter_count()));
  for (const std::string& line : model.notes) std::printf("inferred:     %s\n", terminal_text(line).c_str());
  if (c.head_descriptions.empty()) {
    std::printf("heads described: none in this file\n");
  } else {
    for (size_t l = 0; l < c.head_descriptions.size(); ++l)
      for (size_t h = 0; h < c.head_descriptions[l].size(); ++h)
        std::printf("layer %zu head %zu: %s\n", l, h, terminal_text(c.head_descriptions[l][h]).c_str());
  }
  return kExitOk;
}

CLI::App* add_models_command(CLI::App& app) {
  return app.add_subcommand("models", "List the bundled models, one line each: the name for --model, the shape, what it "
                                      "learned and how well it measured");
}

int run_models() {
  const std::vector<BundledModelEntry> models = list_bundled_models();
  if (models.empty()) throw Error("no bundled models in " + bundled_models_dir() + " (set VITLENS_ASSETS to the assets folder)");
  // Names, summaries and the folder come from files and the environment: printed as terminal_text.
  std::printf("Bundled models in %s (give the name to --model):\n", terminal_text(bundled_models_dir()).c_str());
  size_t width = 0;
  for (const BundledModelEntry& m : models) width = std::max(width, terminal_text(m.name).size());
  for (const BundledModelEntry& m : models)
    std::printf("  %-*s  %s\n", static_cast<int>(width), terminal_text(m.name).c_str(),
                terminal_text(bundled_model_summary(m)).c_str());
  return kExitOk;
}

}  // namespace vitlens::cli
