#pragma once
// Checkpoints as they are published: timm's hub layout and Hugging Face transformers'
// save_pretrained layout, mapped at load time onto vitlens' one block (vit.hpp) with timm's
// tensor names, as timm's checkpoint_filter_fn does: a name map, q/k/v fused into qkv, a reshape
// or two, and the options the family needs. No family gets its own forward pass.
//
//   timm      model.safetensors + the config.json timm writes beside it (architecture,
//             num_classes, model_args, pretrained_cfg.input_size/mean/std); without config.json
//             every option is read off the tensors and num_heads comes from --heads.
//   hf-vit    ViTModel / ViTForImageClassification (optional "vit." prefix), model_type "vit"
//   hf-deit   DeiTModel / DeiTForImageClassification(WithTeacher) (optional "deit." prefix),
//             model_type "deit": ViT's block with a distillation token
//   hf-dinov2 Dinov2Model / Dinov2WithRegistersModel (model_type "dinov2",
//             "dinov2_with_registers"; optional "dinov2." / "dinov2_with_registers." prefix)
//   hf-dinov3 DINOv3ViTModel (model_type "dinov3_vit"): rotary positions, registers, LayerScale,
//             a gated MLP when use_gated_mlp
//   hf-clip   CLIPVisionModel (model_type "clip_vision_model", optional "vision_model." prefix),
//             or the vision tower of a whole CLIPModel (model_type "clip")
#include <string>
#include <vector>

#include "core/model/vit.hpp"
#include "models/safetensors.hpp"

namespace vitlens {

// What a user can tell the loader that a file may not say.
struct LoadOptions {
  int heads = 0;  // --heads: num_heads when the files do not say it (0 = not given)
};

struct ConvertedModel {
  VitConfig config;
  TensorMap tensors;  // timm names, as model_io.hpp lists them
  std::string format;  // "timm", "hf-vit", "hf-deit", "hf-dinov2", "hf-dinov3", "hf-clip"
  std::vector<std::string> notes;  // what was inferred or assumed, for `vitlens info`
  std::vector<std::string> class_names;  // the classifier's labels (C), or empty
  std::string class_names_source;        // where they were read ("config.json id2label", ...)
};

// ImageNet-1k's 1000 class names in the standard class-index order (assets/labels/imagenet-1k.txt,
// its source in assets/labels/README.md), read once; throws vitlens::Error when the file is
// missing or does not hold 1000 lines.
const std::vector<std::string>& imagenet1k_class_names();

// A safetensors file without vitlens metadata: detects the layout from the tensor names, reads
// the companion config.json (and preprocessor_config.json for Hugging Face mean/std) from
// `folder`, and returns the model in vitlens' layout. `tensors` is consumed. Throws vitlens::Error
// with one line naming the file and what is wrong: unknown or refused family (with the reason),
// missing config.json, a config contradicting the tensors, a value that needs a flag.
ConvertedModel convert_checkpoint(TensorMap tensors, const std::string& path, const std::string& folder,
                                  const LoadOptions& options);

// The timm architecture name -> options table: fills what the tensors cannot say (activation,
// norm eps, num_heads of the standard widths) or throws naming why the family is refused.
// `arch` may carry a pretrained tag ("vit_small_patch16_224.dino").
void timm_architecture_options(const std::string& arch, int embed_dim, VitConfig& config, bool& heads_known,
                               const std::string& what);

}  // namespace vitlens
