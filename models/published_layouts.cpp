// timm and Hugging Face checkpoints onto vitlens' block (see published_layouts.hpp): which layout
// a file is, from its tensor names; timm_layout.cpp and hf_layout.cpp map each, with the helpers
// both use in layout_support.hpp.
#include "models/published_layouts.hpp"

#include "models/layout_support.hpp"
#include "models/model_io.hpp"  // assets_dir

namespace vitlens {

using namespace layout_support;

ConvertedModel convert_checkpoint(TensorMap tensors, const std::string& path, const std::string& folder,
                                  const LoadOptions& options) {
  Tensors t{std::move(tensors), path};
  auto any_starts = [&](const std::vector<std::string>& prefixes) {
    for (const auto& entry : t.map)
      for (const std::string& p : prefixes)
        if (starts_with(entry.first, p)) return true;
    return false;
  };
  if (t.has("patch_embed.proj.weight")) return convert_timm(std::move(t), folder, options);
  if (any_starts({"embeddings.patch_embeddings.", "vit.embeddings.", "deit.embeddings.", "dinov2.embeddings.",
                  "dinov2_with_registers.embeddings.", "vision_model.embeddings.", "embeddings.patch_embedding."}))
    return convert_hf(std::move(t), folder, options);
  if (any_starts({"timm_model."}))
    throw Error(path + ": unsupported model: a transformers TimmWrapper file (tensors 'timm_model.*'); vitlens reads the timm "
                "model's own files (model.safetensors + config.json as timm saves them, e.g. on the hub under timm/)");
  if (any_starts({"visual.", "model.visual."}))
    throw Error(path + ": unsupported model: an OpenAI / open_clip checkpoint (visual.*); timm's vit_*_clip_* or Hugging Face CLIPVisionModel files open");
  const std::string first = t.map.empty() ? std::string("(no tensors)") : t.map.begin()->first;
  throw Error(path + ": no vitlens config in __metadata__ and the tensor names (first: '" + first +
              "') match neither timm's VisionTransformer / Eva nor a Hugging Face ViT, DeiT, Dinov2, DINOv3 or CLIP vision model (see README, Supported models)");
}

const std::vector<std::string>& imagenet1k_class_names() {
  static const std::vector<std::string> names = [] {
    const std::string path = assets_dir() + "/labels/imagenet-1k.txt";
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot read ImageNet-1k's class names (the file is part of vitlens' assets)");
    std::vector<std::string> list;
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) list.push_back(line);
    if (list.size() != 1000)
      throw Error(path + ": holds " + std::to_string(list.size()) + " class names, ImageNet-1k has 1000");
    return list;
  }();
  return names;
}

}  // namespace vitlens
