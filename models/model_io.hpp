#pragma once
// ViT models as safetensors files with timm's VisionTransformer tensor names and the vitlens
// config as JSON in __metadata__["config"].
//
// Tensor names and shapes (D = embed_dim, P = patch_size, Hm = int(D * mlp_ratio), Np = the
// config grid's patch count, R = register_tokens, pos_prefix = the prefix token count, or 0
// without pos_embed_prefix):
//   patch_embed.proj.weight (D, 3, P, P)     patch_embed.proj.bias (D)   [patch_bias only]
//   cls_token (1, 1, D)                        [class_token only]
//   dist_token (1, 1, D)                       [dist_token only]
//   reg_token (1, R, D)                        [register_tokens > 0 only]
//   pos_embed (1, pos_prefix + Np, D)          [pos_embed only]
//   norm_pre.weight/bias (D)                   [pre_norm only]
//   blocks.{i}.norm1.weight/bias (D)          blocks.{i}.attn.qkv.weight (3D, D)
//   blocks.{i}.attn.qkv.bias (3D)              [qkv_bias only]
//   blocks.{i}.attn.norm.weight/bias (D)       [attn_out_norm only]
//   blocks.{i}.attn.proj.weight (D, D)         blocks.{i}.attn.proj.bias (D)
//   blocks.{i}.ls1.gamma, ls2.gamma (D)        [layer_scale only]
//   blocks.{i}.norm2.weight/bias (D)
//   blocks.{i}.mlp.fc1.weight (Hm, D)          blocks.{i}.mlp.fc1.bias (Hm)  [(2 Hm, ...) with swiglu:
//                                              rows [gate | value]]
//   blocks.{i}.mlp.norm.weight/bias (Hm)       [mlp_norm only]
//   blocks.{i}.mlp.fc2.weight (D, Hm)          blocks.{i}.mlp.fc2.bias (D)
//   norm.weight/bias (D)  [final_norm only]    head.weight (C, D), head.bias (C)  [optional]
//   fc_norm.weight/bias (D)  [optional, with a head: a LayerNorm on the pooled vector]
//   head_dist.weight (C, D), head_dist.bias (C)  [optional, dist_token and a head: DeiT's second head]
//   blocks.{i}.attn.norm.weight/bias (D)       [attn_out_norm only]
//   attn_pool.latent (1, 1, D), attn_pool.q.weight (D, D) / .bias (D), attn_pool.kv.weight (2D, D) / .bias (2D),
//   attn_pool.proj.weight (D, D) / .bias, attn_pool.norm.weight/bias (D), attn_pool.mlp.fc1.weight (Hm, D) / .bias,
//   attn_pool.mlp.fc2.weight (D, Hm) / .bias  [attention_pool only]
//   (rms_norm: every norm above has its weight only, no bias)
//
// Config keys (JSON object): patch_size, embed_dim, num_heads, depth, img_size [H, W],
// class_token, mlp_ratio, norm_eps, mean [3], std [3], qkv_bias, name, description, the
// optional head_descriptions [[str per head] per layer], and the optional architecture keys
// dist_token, register_tokens, pos_embed_prefix, patch_bias, pre_norm, layer_scale, final_norm,
// post_norm, act, global_pool (the classifier's pooling: auto, token, avg, max, avgmax, map),
// pool_include_prefix, attention_pool, pos_embed, rope (+ rope_temperature, rope_rotate_half,
// rope_grid_offset, rope_ref_grid [rows, cols]), swiglu, mlp_norm, rms_norm, attn_out_norm (written
// only when they differ from the original block's defaults).
// A classifier's class names are read from __metadata__["training"]["class_names"] (what
// `vitlens train` records) when their count is the head's.
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/vit.hpp"
#include "models/published_layouts.hpp"  // LoadOptions, and the layouts load_model converts
#include "models/safetensors.hpp"

namespace vitlens {

// Throws vitlens::Error "<what>: config key 'x' ..." on a missing, mistyped or inconsistent key.
VitConfig config_from_json(const nlohmann::json& j, const std::string& what);
nlohmann::json config_to_json(const VitConfig& config);

// Checks every tensor's presence and shape against the config, copies the data into one blob and
// points the weight views into it. Throws vitlens::Error naming `what` and the tensor.
VitModel model_from_tensors(const VitConfig& config, const TensorMap& tensors, const std::string& what);

// Any model file vitlens opens: a vitlens file (config in __metadata__), or a timm / Hugging Face
// checkpoint with its companion config.json (published_layouts.hpp). Refuses, before reading it, a file
// far larger than the memory available. Throws vitlens::Error with one line.
VitModel load_model(const std::string& path, const LoadOptions& options);
VitModel load_model(const std::string& path);
// A vitlens model file's bytes already in memory (`what` names it in errors): the config must be
// in __metadata__, since no companion config.json can be looked for. The fuzz harness uses it.
VitModel parse_model(const std::string& bytes, const std::string& what);
// A vitlens model file's config, reading only its header (a folder of models listed by name).
VitConfig read_model_config(const std::string& path);
// extra_metadata goes into __metadata__ beside "config" and "format" (e.g. a trained model's
// "training" record); those two keys cannot be replaced.
void save_model(const std::string& path, const VitConfig& config, const TensorMap& tensors,
                const std::map<std::string, std::string>& extra_metadata = {});
// The bytes save_model writes to `path` (named in errors): a checkpoint writes them together with
// its optimizer state (training_checkpoint.hpp).
std::string model_file_bytes(const std::string& path, const VitConfig& config, const TensorMap& tensors,
                             const std::map<std::string, std::string>& extra_metadata = {});

// The expected tensor shapes for a config (name -> shape), optional tensors excluded.
std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const VitConfig& config);

// Where the bundled assets (models/, images/) live: $VITLENS_ASSETS if set, else the installed
// share/vitlens beside the executable's bin/ (or an assets/ folder beside the executable), else
// the source tree's assets/ folder (compiled in, for a binary run from the build tree).
std::string assets_dir();
std::string default_model_path();  // assets_dir()/models/vitlens-designed.safetensors
std::string random_model_path();   // assets_dir()/models/vitlens-random.safetensors
std::string default_image_path();  // assets_dir()/images/vitlens-demo.png

}  // namespace vitlens
