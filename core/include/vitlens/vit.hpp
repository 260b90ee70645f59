#pragma once
// The Vision Transformer forward pass, laid out exactly as timm's VisionTransformer
// (timm/models/vision_transformer.py): patch embedding, optional class token, positional
// embedding, `depth` pre-norm blocks, final norm. Weights are read-only views into one blob that
// the model owns; the file format lives in models/ (safetensors.hpp).
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vitlens/attention.hpp"
#include "vitlens/eigen.hpp"

namespace vitlens {

// hparams, as stored in the safetensors metadata (`__metadata__["config"]`).
struct VitConfig {
  std::string name = "unnamed";
  std::string description;
  int patch_size = 4;       // P
  int embed_dim = 48;       // D
  int num_heads = 4;        // H
  int depth = 1;            // L
  int img_h = 224, img_w = 224;
  bool class_token = true;
  double mlp_ratio = 4.0;   // double, as Python: int(D * mlp_ratio) must match timm
  float norm_eps = 1e-6f;
  bool qkv_bias = true;
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};  // per RGB channel, applied to x / 255
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
  // Optional human descriptions: head_descriptions[layer][head]. Empty when the file has none.
  std::vector<std::vector<std::string>> head_descriptions;

  int head_dim() const { return embed_dim / num_heads; }                   // d
  int mlp_hidden() const { return static_cast<int>(embed_dim * mlp_ratio); }  // Hm (timm: int(), in double)
  int prefix_tokens() const { return class_token ? 1 : 0; }
  int grid_h() const { return img_h / patch_size; }
  int grid_w() const { return img_w / patch_size; }
  int pos_tokens() const { return prefix_tokens() + grid_h() * grid_w(); }
  int patch_values() const { return 3 * patch_size * patch_size; }  // 48 for P = 4
  // Empty when consistent, else a one-line reason naming the key (e.g. "embed_dim 50 is not
  // divisible by num_heads 4").
  std::string validate() const;
};

struct BlockWeights {
  const float* norm1_w = nullptr;  // (D)
  const float* norm1_b = nullptr;  // (D)
  const float* qkv_w = nullptr;    // (3D, D): rows [Q heads 0..H-1 | K heads | V heads]
  const float* qkv_b = nullptr;    // (3D) or nullptr when qkv_bias is false
  const float* proj_w = nullptr;   // (D, D)  W^O
  const float* proj_b = nullptr;   // (D)
  const float* norm2_w = nullptr;  // (D)
  const float* norm2_b = nullptr;  // (D)
  const float* fc1_w = nullptr;    // (Hm, D)
  const float* fc1_b = nullptr;    // (Hm)
  const float* fc2_w = nullptr;    // (D, Hm)
  const float* fc2_b = nullptr;    // (D)
};

struct VitWeights {
  const float* patch_w = nullptr;    // (D, 3, P, P)  Conv2d weight
  const float* patch_b = nullptr;    // (D)
  const float* cls_token = nullptr;  // (D) or nullptr without class token
  const float* pos_embed = nullptr;  // (prefix + gh*gw, D) for the config's img_size
  std::vector<BlockWeights> blocks;  // (L)
  const float* norm_w = nullptr;     // (D)
  const float* norm_b = nullptr;     // (D)
  const float* head_w = nullptr;     // (num_classes, D) or nullptr
  const float* head_b = nullptr;     // (num_classes) or nullptr
  int num_classes = 0;
};

// A loaded model: config plus weights viewing `storage`. Move-only, so the views stay valid.
struct VitModel {
  VitConfig config;
  std::vector<float> storage;
  VitWeights w;
  std::string source;  // the file it came from, for messages

  VitModel() = default;
  VitModel(VitModel&&) = default;
  VitModel& operator=(VitModel&&) = default;
  VitModel(const VitModel&) = delete;
  VitModel& operator=(const VitModel&) = delete;

  int64_t parameter_count() const;
};

// Tokens of one prepared image, ready for the blocks.
struct PatchGrid {
  int grid_h = 0, grid_w = 0;              // gh, gw
  MatRM patches;                           // (gh*gw, 3*P*P) normalised pixels, (c, y, x) per row
  std::vector<uint8_t> patch_is_padding;   // (gh*gw) 1 where the patch holds padded pixels
};

struct ForwardOptions {
  bool causal = false;                   // raster-order causal mask
  bool mask_padding = true;              // padded patches are never attended to
  std::vector<uint8_t> forbidden_patches;  // (gh*gw) 1 = never attended (a painted mask); may be empty
  bool keep_probs = false;               // keep every (N, N) weight matrix (raw export only)
  float score_scale = -1.0f;             // < 0: the model's 1/sqrt(d); else this factor instead
  int threads = 0;                       // attention threads; 0 = one per core (same numbers for any count)
  // Progress in [0, 1]; return false to cancel (forward then throws vitlens::Error "cancelled").
  std::function<bool(float)> progress;
};

struct LayerState {
  MatRM qkv;       // (N, 3D) LN1(x) W_qkv^T + b: every head's queries, keys and values
  MatRM received;  // (H, N) attention received: each column's mean over the non-padding query rows
                   // (a row whose keys are all masked is a zero row and still counts)
  MatRM cls_row;   // (H, N) the class token's attention row; empty without class token
  std::vector<MatRM> probs;  // H x (N, N) when keep_probs, else empty
  MatRM key_panels;  // (H, aligned_keys(N) * d) each head's keys in 16-token panels (fast_attention.hpp),
                     // so attention_row reads 8 or 16 tokens per vector load
};

struct ForwardResult {
  int tokens = 0;   // N
  int prefix = 0;   // 1 with class token
  int grid_h = 0, grid_w = 0;
  float score_scale = 0.0f;        // the factor the scores were multiplied by
  KeyMask mask;                    // the mask every layer used
  int received_queries = 0;        // how many query rows the received means average over
  std::vector<LayerState> layers;  // (L)
  MatRM output;                    // (N, D) after the final norm
};

// The key mask for a grid, from the options (class token always allowed as a key).
KeyMask build_key_mask(const VitConfig& config, const PatchGrid& grid, const ForwardOptions& options);

// Positional table for a gh x gw grid: the model's own when the grid matches, else the patch part
// resized with bicubic interpolation (align_corners=False, A = -0.75, as torch.nn.functional
// .interpolate(mode="bicubic") that DINO and timm's resample_abs_pos_embed use); class token row kept.
MatRM positional_table(const VitModel& model, int grid_h, int grid_w);  // (prefix + gh*gw, D)

// The whole forward pass. Throws vitlens::Error on a grid the model cannot take or on cancel.
ForwardResult forward(const VitModel& model, const PatchGrid& grid, const ForwardOptions& options);

// One query's attention row for one head, from that query's q and all keys: O(N * d).
// out: (N) weights over all tokens (class token first). Same numbers as row `query` of probs.
void attention_row(const VitModel& model, const ForwardResult& result, int layer, int head,
                   int query, float* out);

}  // namespace vitlens
