// `vitlens info`: what a model file holds.
#include <cstdio>

#include "cli.hpp"
#include "vitlens/model_io.hpp"

namespace vitlens::cli {

void add_info_command(CLI::App& app, InfoArgs& args) {
  CLI::App* cmd = app.add_subcommand("info", "Print a model's configuration, parameter count and head descriptions");
  cmd->add_option("--model,-m", args.model, "Model file (.safetensors); default: the bundled hand-designed model");
}

int run_info(const InfoArgs& args) {
  const std::string path = args.model.empty() ? default_model_path() : args.model;
  const VitModel model = load_model(path);
  const VitConfig& c = model.config;
  std::printf("model:        %s\n", c.name.c_str());
  std::printf("file:         %s\n", path.c_str());
  std::printf("description:  %s\n", c.description.c_str());
  std::printf("patch size:   %d (a patch is %d values)\n", c.patch_size, c.patch_values());
  std::printf("embed dim:    %d\n", c.embed_dim);
  std::printf("heads:        %d of %d dims\n", c.num_heads, c.head_dim());
  std::printf("depth:        %d\n", c.depth);
  std::printf("image size:   %dx%d (grid %dx%d, %d tokens)\n", c.img_w, c.img_h, c.grid_w(), c.grid_h(), c.pos_tokens());
  std::printf("class token:  %s\n", c.class_token ? "yes" : "no");
  std::printf("qkv bias:     %s\n", c.qkv_bias ? "yes" : "no");
  std::printf("mlp:          ratio %g (%d hidden)\n", c.mlp_ratio, c.mlp_hidden());
  std::printf("norm eps:     %g\n", static_cast<double>(c.norm_eps));
  std::printf("mean / std:   [%g, %g, %g] / [%g, %g, %g]\n", static_cast<double>(c.mean[0]), static_cast<double>(c.mean[1]),
              static_cast<double>(c.mean[2]), static_cast<double>(c.std[0]), static_cast<double>(c.std[1]),
              static_cast<double>(c.std[2]));
  std::printf("classifier:   %s\n", model.w.num_classes ? (std::to_string(model.w.num_classes) + " classes").c_str() : "none");
  std::printf("parameters:   %lld\n", static_cast<long long>(model.parameter_count()));
  if (c.head_descriptions.empty()) {
    std::printf("heads described: none in this file\n");
  } else {
    for (size_t l = 0; l < c.head_descriptions.size(); ++l)
      for (size_t h = 0; h < c.head_descriptions[l].size(); ++h)
        std::printf("layer %zu head %zu: %s\n", l, h, c.head_descriptions[l][h].c_str());
  }
  return kExitOk;
}

}  // namespace vitlens::cli
