#pragma once
// What a checkpoint's library does around the model, read from the files published beside it:
// the image transform (`--preprocess model`) and how the positional table is resized.
//
//   timm          config.json "pretrained_cfg": input_size, crop_pct (default 0.875), crop_mode
//                 (center or squash), interpolation (default bicubic), mean, std; reproduced as
//                 timm.data.create_transform(**resolve_data_config(...)) builds it for eval: resize
//                 to floor(size / crop_pct) (shortest edge in center mode), centre crop, PIL.
//   transformers  preprocessor_config.json: do_resize, size (shortest_edge or height/width),
//                 resample, do_center_crop, crop_size, do_rescale, rescale_factor, do_normalize,
//                 image_mean, image_std; missing keys take the processor class's defaults (ViT,
//                 CLIP, Bit, Dinov2, DeiT); the older files' form (feature_extractor_type, a plain
//                 number as size, meaning S x S or shortest edge S as the class reads it) too.
//                 Reproduced as transformers 5's AutoImageProcessor runs it:
//                 the torchvision backend (uint8 tensors, torch's antialiased resize) unless
//                 image_processor_type names the PIL backend ("...Pil").
#include <string>

#include "core/io/preprocess.hpp"
#include "core/model/vit.hpp"

namespace vitlens {

// The transform of the model loaded from `model_path` in `format` ("timm", "hf-vit", ...);
// present() is false when none is published (vitlens' own models, a timm file without
// config.json). Throws vitlens::Error naming the file and key for a transform vitlens cannot
// reproduce exactly (a border crop, a longest_edge size, nearest or lanczos in torch, ...) and for
// sizes no checkpoint publishes (a crop_pct below 0.5, a side above 16384); sizes that depend on
// the image are bounded when it is known (preprocess.cpp).
ImageTransform read_model_transform(const std::string& model_path, const std::string& format);

// Why a model of `format` has no transform, for messages that refuse the model's preprocessing:
// "publishes no transform (a vitlens model, ...)" without the file's name.
std::string missing_transform_reason(const std::string& format);

// How the model's library resizes its positional table (vit.hpp PositionResize): timm and
// Dinov2WithRegisters (model_type in the folder's config.json) antialias, the rest do not.
PositionResize library_position_resize(const std::string& format, const std::string& folder);

}  // namespace vitlens
