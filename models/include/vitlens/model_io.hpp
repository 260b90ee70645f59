#pragma once
// ViT models as safetensors files with timm's VisionTransformer tensor names and the vitlens
// config as JSON in __metadata__["config"].
//
// Tensor names and shapes (D = embed_dim, P = patch_size, Hm = int(D * mlp_ratio), Np = the
// config grid's patch count, prefix = 1 with class token else 0):
//   patch_embed.proj.weight (D, 3, P, P)     patch_embed.proj.bias (D)
//   cls_token (1, 1, D)                        [class_token only]
//   pos_embed (1, prefix + Np, D)
//   blocks.{i}.norm1.weight/bias (D)          blocks.{i}.attn.qkv.weight (3D, D)
//   blocks.{i}.attn.qkv.bias (3D)              [qkv_bias only]
//   blocks.{i}.attn.proj.weight (D, D)         blocks.{i}.attn.proj.bias (D)
//   blocks.{i}.norm2.weight/bias (D)
//   blocks.{i}.mlp.fc1.weight (Hm, D)          blocks.{i}.mlp.fc1.bias (Hm)
//   blocks.{i}.mlp.fc2.weight (D, Hm)          blocks.{i}.mlp.fc2.bias (D)
//   norm.weight/bias (D)                       head.weight (C, D), head.bias (C)  [optional]
//
// Config keys (JSON object): patch_size, embed_dim, num_heads, depth, img_size [H, W],
// class_token, mlp_ratio, norm_eps, mean [3], std [3], qkv_bias, name, description, and the
// optional head_descriptions [[str per head] per layer].
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "vitlens/safetensors.hpp"
#include "vitlens/vit.hpp"

namespace vitlens {

using TensorMap = std::map<std::string, TensorData>;

// Throws vitlens::Error "<what>: config key 'x' ..." on a missing, mistyped or inconsistent key.
VitConfig config_from_json(const nlohmann::json& j, const std::string& what);
nlohmann::json config_to_json(const VitConfig& config);

// Checks every tensor's presence and shape against the config, copies the data into one blob and
// points the weight views into it. Throws vitlens::Error naming `what` and the tensor.
VitModel model_from_tensors(const VitConfig& config, const TensorMap& tensors, const std::string& what);

VitModel load_model(const std::string& path);
// The same from a file's bytes already in memory (`what` names it in errors); load_model reads
// the file and calls this, and so does the model loader's fuzz harness (tests/fuzz).
VitModel parse_model(const std::string& bytes, const std::string& what);
// extra_metadata goes into __metadata__ beside "config" and "format" (e.g. a trained model's
// "training" record); those two keys cannot be replaced.
void save_model(const std::string& path, const VitConfig& config, const TensorMap& tensors,
                const std::map<std::string, std::string>& extra_metadata = {});

// The expected tensor shapes for a config (name -> shape), optional tensors excluded.
std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const VitConfig& config);

// Where the bundled assets live: $VITLENS_ASSETS if set, else the source tree's assets/ folder
// (compiled in), else assets/ beside the executable's folder.
std::string assets_dir();
std::string default_model_path();  // assets_dir()/models/vitlens-designed.safetensors
std::string random_model_path();   // assets_dir()/models/vitlens-random.safetensors
std::string default_image_path();  // assets_dir()/images/vitlens-demo.png

}  // namespace vitlens
